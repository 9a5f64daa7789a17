# One decode step's kernels from an ncu --csv dump with gpu__time_duration.sum and dram__bytes_read.sum: the last
# step (found by its period), grouped by kernel name and grid, with each group's DRAM read rate.
import csv, sys, collections
rows = {}
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    k = r["ID"]
    d = rows.setdefault(k, {"name": r["Kernel Name"][:58], "grid": r["Grid Size"]})
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "")
    if r["Metric Name"] == "gpu__time_duration.sum":
        d["us"] = v / 1e3 if unit in ("nsecond", "ns") else v if unit in ("usecond", "us") else v * 1e3
    elif r["Metric Name"] == "dram__bytes_read.sum":
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
        d["mb"] = v * scale / 1e6
ks = [rows[k] for k in sorted(rows, key=lambda x: int(x))]
names = [d["name"] + d["grid"] for d in ks]
# the step's length: the smallest period p with the last p kernels equal to the p before them (the step ends with the
# lm_head and the sampling, once a step, so no shorter period matches)
n = next((p for p in range(8, len(ks) // 2 + 1) if names[-p:] == names[-2 * p:-p]), len(ks))
step = ks[-n:]
g = collections.OrderedDict()
for d in step:
    key = (d["name"], d["grid"])
    c, t, b = g.get(key, (0, 0.0, 0.0))
    g[key] = (c + 1, t + d.get("us", 0.0), b + d.get("mb", 0.0))
tot = sum(d.get("us", 0.0) for d in step)
totb = sum(d.get("mb", 0.0) for d in step)
print(f"{len(step)} kernels in the step; sum {tot:.1f} us, {totb:.1f} MB read")
print("| kernel | grid | n | total us | mean us | MB each | GB/s | share |")
for (name, grid), (c, t, b) in sorted(g.items(), key=lambda x: -x[1][1]):
    print(f"| {name} | {grid} | {c} | {t:.1f} | {t/c:.2f} | {b/c:.2f} | {b/t*1e3 if t else 0:.0f} | {100*t/tot:.1f}% |")
