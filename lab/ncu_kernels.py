#!/usr/bin/env python3
"""Per-kernel device time of one forward pass from an `ncu --csv --metrics gpu__time_duration.sum` log.

Usage: ncu_kernels.py LOG [--pass N]   (N: which forward pass, counted by its embedding kernel; default the last)
Prints each kernel of that pass in launch order, then the totals by kernel name."""
import csv, sys, collections

path = sys.argv[1]
want = int(sys.argv[sys.argv.index("--pass") + 1]) if "--pass" in sys.argv else -1
rows = []
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1000 if unit == "nsecond" or unit == "ns" else v if unit in ("usecond", "us") else v * 1000
    rows.append((r["Kernel Name"].split("(")[0].split("<")[0], us))
passes, cur = [], []
for name, us in rows:
    if "embed" in name and cur:
        passes.append(cur); cur = []
    cur.append((name, us))
passes.append(cur)
p = passes[want]
print(f"{len(passes)} passes; pass {want}: {len(p)} kernels, {sum(u for _, u in p):.1f} us of kernel time")
tot = collections.OrderedDict()
for name, us in p:
    c, t = tot.get(name, (0, 0.0))
    tot[name] = (c + 1, t + us)
print(f"{'kernel':48s} {'count':>6s} {'total us':>10s} {'mean us':>9s}")
for name, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:48]:48s} {c:6d} {t:10.1f} {t / c:9.2f}")
