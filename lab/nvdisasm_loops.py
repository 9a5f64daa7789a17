#!/usr/bin/env python3
"""Instructions per loop of one kernel of a CUDA 13 sm_90a cubin, on a machine without CUDA 13's cuobjdump.

Usage: nvdisasm_loops.py CUBIN FUNCTION_SUBSTRING [FROM_HEX TO_HEX]
  e.g. nvcc -std=c++20 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -cubin \
           src/backend/cuda/w4a8_fold_gemm.cu -o /tmp/fold.cubin
       NVDISASM=/tmp/nv118/usr/bin/nvdisasm python3 lab/nvdisasm_loops.py /tmp/fold.cubin w4a8_fold_kernelILi1ELi64ELi0E
The nvdisasm of CUDA 11.8 (Debian's nvidia-cuda-toolkit, unpacked with `dpkg -x`) decodes sm_90 SASS but refuses the
ELF header CUDA 12.x and 13 write; a copy of the cubin gets the old header (OS/ABI 0x33, ABI version 7, e_flags of
sm_90). That nvdisasm predates wgmma and prints nothing for HGMMA: each missing 16-byte slot is counted as "?".
Prints each backward branch (a loop; an mbarrier wait's retry branch shows as a long one: read the inner loops) with
its static count and opcodes by count, and the same for an address range when given (lab/fold_analysis.md)."""
import collections, os, re, struct, subprocess, sys, tempfile

cubin, name = sys.argv[1], sys.argv[2]
rng = (int(sys.argv[3], 16), int(sys.argv[4], 16)) if len(sys.argv) > 4 else None
elf = bytearray(open(cubin, "rb").read())
elf[7], elf[8] = 0x33, 7
struct.pack_into("<I", elf, 0x30, 0x005A055A)
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(elf)
try:
    sass = subprocess.run([os.environ.get("NVDISASM", "nvdisasm"), "-c", f.name], check=True, capture_output=True,
                          text=True).stdout
finally:
    os.unlink(f.name)

code, labels, pending, inside = [], {}, [], False
for line in sass.splitlines():
    if line.startswith(".text."):
        if code:
            break  # the first matching function only
        inside = name in line
        continue
    if not inside:
        continue
    m = re.match(r"(\.L_x_\d+):", line)
    if m:
        pending.append(m.group(1))
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        addr = int(m.group(1), 16)
        for label in pending:
            labels[label] = addr
        pending = []
        if code and addr - code[-1][0] > 16:  # undecoded instructions (HGMMA)
            code += [(a, "?", "?") for a in range(code[-1][0] + 16, addr, 16)]
        toks = m.group(2).split()
        code.append((addr, toks[1] if toks[0].startswith("@") else toks[0], m.group(2)))
if not code:
    sys.exit(f"nvdisasm_loops: no function matching {name!r} in {cubin}")


def show(title, lo, hi):
    body = [op.split(".")[0] for a, op, _ in code if lo <= a <= hi]
    print(f"{title} {lo:#x}..{hi:#x}: {len(body)} instructions")
    print("  " + ", ".join(f"{k} {v}" for k, v in collections.Counter(body).most_common()))


print(f"{len(code)} instructions in the function")
for addr, op, text in code:
    m = re.search(r"\bBRA `\((\.L_x_\d+)\)", text)
    if op.startswith("BRA") and m and labels.get(m.group(1), addr) < addr:
        show("loop", labels[m.group(1)], addr)
if rng:
    show("range", *rng)
