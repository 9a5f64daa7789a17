#!/usr/bin/env python3
"""Instructions per loop of one kernel, from `cuobjdump -sass` output (the GPU machine has cuobjdump; this one does not).

Usage: sass_loops.py SASS_FILE FUNCTION_SUBSTRING [ARCH]   (ARCH: the cubin to read, default sm_90a)
  e.g. on the GPU machine: cuobjdump -sass -fun '_Z17w4a8_wgmma_kernelILi1ELi0ELi64EEv11gemm_params' fp8moe > k.sass
       then here:          python3 lab/sass_loops.py k.sass w4a8_wgmma_kernelILi1ELi0ELi64
Prints, for each backward branch (a loop), its address range, its static instruction count and the opcodes by
count: the instructions per 128-group of the W4A8 GEMM's main loop (bench/NOTES.md 2026-12-01, "W4A8 grouped GEMM ... four restructurings")."""
import collections, re, sys

path, name = sys.argv[1], sys.argv[2]
arch = sys.argv[3] if len(sys.argv) > 3 else "sm_90a"
code, cur_arch, inside = [], None, False
for line in open(path):
    m = re.match(r"\s*arch = (\S+)", line)
    if m:
        cur_arch = m.group(1)
    if "Function :" in line:
        if code:
            break  # the first matching function only
        inside = cur_arch == arch and name in line
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if inside and m:
        toks = m.group(2).split()
        op = toks[1] if toks[0].startswith("@") else toks[0]
        code.append((int(m.group(1), 16), op, m.group(2)))
if not code:
    sys.exit(f"sass_loops: no function matching {name!r} for {arch} in {path}")
print(f"{len(code)} instructions in the function")
for addr, op, text in code:
    m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
    if op.startswith("BRA") and m and int(m.group(1), 16) < addr:
        lo = int(m.group(1), 16)
        body = [o.split(".")[0] for a, o, _ in code if lo <= a <= addr]
        hist = collections.Counter(body).most_common()
        print(f"loop {lo:#x}..{addr:#x}: {len(body)} instructions")
        print("  " + ", ".join(f"{k} {v}" for k, v in hist))
