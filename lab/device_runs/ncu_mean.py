# Per-kernel launch counts and mean times (us) of two ncu --csv gpu__time_duration dumps, A against B, largest total growth first.
#   python3 ncu_mean.py a.csv b.csv
import csv, collections, sys
def load(p):
    lines = [l for l in open(p) if l.startswith('"')]
    g = collections.defaultdict(list)
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            g[r["Kernel Name"].split("(")[0][:60]].append(float(r["Metric Value"].replace(",", "")) / 1e3)
    return g
a, b = load(sys.argv[1]), load(sys.argv[2])
print("| kernel | n off | mean off us | n fused | mean fused us |")
for k in sorted(set(a) | set(b), key=lambda k: -sum(b.get(k, [0])) + sum(a.get(k, [0]))):
    x, y = a.get(k, []), b.get(k, [])
    print(f"| {k} | {len(x)} | {sum(x)/max(len(x),1):.2f} | {len(y)} | {sum(y)/max(len(y),1):.2f} |")
