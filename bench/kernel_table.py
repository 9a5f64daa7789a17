#!/usr/bin/env python3
"""Every kernel of one decode step, its time, its DRAM bytes and its floor at the device's bandwidth: the per-kernel
form of `fp8moe bench decode --per-op` (which times ops, each a few kernels, without a graph), read from Nsight
Compute. Standard library only (the GPU machine has Python but none of our packages).

    python3 bench/kernel_table.py run [--bandwidth 4250] [--ncu ncu] [--csv out.csv] -- \\
        build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8 --steps 1
    python3 bench/kernel_table.py parse out.csv [--bandwidth 4250] [--steps 1]

`run` profiles the kernels that `bench decode` launches inside its timed steps only: each timed step is an NVTX
range "decode step" (ncu --nvtx --nvtx-include "decode step/"), so the prefill of the context and the warm-up steps
are not profiled. It adds `--route decode.graphs=off` unless the command gives decode.graphs itself (ncu replays each
kernel alone either way: every launch is measured apart from its neighbours, with no overlap between kernels, so the
sum is above the step's time under a graph with PDL), and runs ncu without cache or clock control (`--cache-control
none --clock-control none`: the caches and clocks as a step finds them). Give --steps 1 (or divide by --steps).

The table: one row per launch in step order (a layer's kernels repeat per layer: --layers 2 keeps it short), its
time, the DRAM bytes it read and wrote, the achieved GB/s and its floor (bytes / bandwidth; 0.7 us of launch is not
counted), then a row per kernel name summed over the step, largest first, and the totals. `parse` prints the same
from a saved CSV (ncu --csv with the metrics gpu__time_duration.sum, dram__bytes_read.sum, dram__bytes_write.sum)."""
import argparse
import collections
import csv
import io
import subprocess
import sys

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")


def value(s):
    return float(s.replace(",", "")) if s not in ("", "n/a") else 0.0


def scale(unit):
    """the factor of an ncu unit to seconds or bytes"""
    return {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0, "nsecond": 1e-9,
            "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1.0)


def launches(text):
    """[(id, kernel name, seconds, bytes read, bytes written)] in launch order from ncu's CSV (one row a metric)"""
    rows = list(csv.reader(io.StringIO("".join(line for line in text.splitlines(True) if line.startswith('"')))))
    if not rows:
        return []
    h = {k: i for i, k in enumerate(rows[0])}
    for need in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"):
        if need not in h:
            sys.exit(f"kernel_table: the CSV has no column {need!r}: not ncu --csv output")
    by_id = collections.OrderedDict()
    for r in rows[1:]:
        d = by_id.setdefault(int(r[h["ID"]]), {"name": r[h["Kernel Name"]]})
        d[r[h["Metric Name"]]] = value(r[h["Metric Value"]]) * scale(r[h["Metric Unit"]])
    return [(i, d["name"], d.get(METRICS[0], 0.0), d.get(METRICS[1], 0.0), d.get(METRICS[2], 0.0))
            for i, d in by_id.items()]


def short(name, width=64):
    """the kernel's name with its template arguments, without its parameter list"""
    depth, out = 0, []
    for c in name:
        if c == "(" and depth == 0 and out:
            break
        depth += c == "<"
        depth -= c == ">"
        out.append(c)
    s = "".join(out).replace("void ", "").replace("(int)", "").replace("(bool)", "")
    return s if len(s) <= width else s[: width - 3] + "..."


def table(rows, bandwidth, steps):
    bw = bandwidth * 1e9
    print(f"| # | kernel | us | MB read | MB written | GB/s | floor us | floor / time |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n, (_, name, t, rd, wr) in enumerate(rows):
        b = rd + wr
        print(f"| {n} | {short(name)} | {t * 1e6:.2f} | {rd / 1e6:.3f} | {wr / 1e6:.3f} | "
              f"{b / t / 1e9 if t else 0:.0f} | {b / bw * 1e6:.2f} | {b / bw / t if t else 0:.2f} |")
    g = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for _, name, t, rd, wr in rows:
        e = g[short(name)]
        e[0] += 1
        e[1] += t
        e[2] += rd + wr
    tt = sum(e[1] for e in g.values())
    tb = sum(e[2] for e in g.values())
    print(f"\nper kernel, summed over {'the step' if steps == 1 else f'{steps} steps, then divided by {steps}'}:\n")
    print("| kernel | launches | us | share | MB | GB/s | floor us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, (c, t, b) in sorted(g.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k} | {c / steps:g} | {t / steps * 1e6:.1f} | {100 * t / tt if tt else 0:.1f} % | "
              f"{b / steps / 1e6:.2f} | {b / t / 1e9 if t else 0:.0f} | {b / steps / bw * 1e6:.1f} |")
    print(f"| **all** | {sum(e[0] for e in g.values()) / steps:g} | {tt / steps * 1e6:.1f} | 100 % | "
          f"{tb / steps / 1e6:.2f} | {tb / tt / 1e9 if tt else 0:.0f} | {tb / steps / bw * 1e6:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    run = sub.add_parser("run", help="profile a bench decode command's timed steps and print the table")
    run.add_argument("--ncu", default="ncu", help="the Nsight Compute command (default ncu)")
    run.add_argument("--csv", help="also keep ncu's CSV in this file")
    parse = sub.add_parser("parse", help="the table from a saved ncu CSV")
    parse.add_argument("file")
    for p in (run, parse):
        p.add_argument("--bandwidth", type=float, default=4250.0,
                       help="GB/s of the floors (default 4250: the H200's measured copy rate)")
        p.add_argument("--steps", type=int, default=1, help="timed steps the CSV holds (default 1)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the bench decode command")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("kernel_table: --steps must be at least 1")
    if a.mode == "parse":
        with open(a.file) as f:
            text = f.read()
    else:
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not cmd or "decode" not in cmd:
            sys.exit("kernel_table run: give the bench decode command after --")
        if not any("decode.graphs" in c for c in cmd):
            cmd = cmd + ["--route", "decode.graphs=off"]
        ncu = [a.ncu, "--nvtx", "--nvtx-include", "decode step/", "--metrics", ",".join(METRICS),
               "--cache-control", "none", "--clock-control", "none", "--print-units", "base", "--csv"]
        p = subprocess.run(ncu + cmd, capture_output=True, text=True)
        text = p.stdout
        if a.csv:
            with open(a.csv, "w") as f:
                f.write(text)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            sys.exit(f"kernel_table run: ncu exited with {p.returncode}")
    rows = launches(text)
    if not rows:
        sys.exit("kernel_table: no kernel in the CSV (was the command a bench decode with timed steps?)")
    table(rows, a.bandwidth, a.steps)


if __name__ == "__main__":
    main()
