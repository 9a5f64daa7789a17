# Summarises an ncu --csv gpu__time_duration dump: the last N kernels (one decode step) grouped by kernel name.
import csv, sys, collections
path, n = sys.argv[1], int(sys.argv[2])
rows = []
with open(path) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        rows.append((r["Kernel Name"][:60], r["Grid Size"], float(r["Metric Value"].replace(",", ""))))
print(f"{len(rows)} kernels profiled; the last {n}")
last = rows[-n:]
g = collections.OrderedDict()
for name, grid, t in last:
    k = (name, grid)
    c, s = g.get(k, (0, 0.0)); g[k] = (c + 1, s + t)
tot = sum(t for _, _, t in last)
print(f"| kernel | grid | count | total us | mean us | share |\n|---|---|---:|---:|---:|---:|")
for (name, grid), (c, s) in sorted(g.items(), key=lambda x: -x[1][1]):
    print(f"| {name} | {grid} | {c} | {s/1e3:.1f} | {s/1e3/c:.2f} | {100*s/tot:.1f}% |")
print(f"sum of kernel times {tot/1e3:.1f} us")
