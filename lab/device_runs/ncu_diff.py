# Two binaries' per-kernel times of one decode step from ncu --csv gpu__time_duration dumps (s28_ncu_b1.sh writes
# them: n_base_1.csv n_new_1.csv n_base_2.csv n_new_2.csv): the last N kernels of each dump, summed by kernel name
# (template arguments kept) and averaged over the rounds, base against new, largest growth first.
#   python3 ncu_diff.py N base_1.csv,base_2.csv new_1.csv,new_2.csv
import csv, collections, sys


def last_step(path, n):
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    rows = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")))
            for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
    return rows[-n:]


def per_kernel(paths, n):
    g = collections.defaultdict(float)
    for p in paths:
        for name, ns in last_step(p, n):
            g[name.split("(")[0]] += ns / 1e3 / len(paths)
    return g


n = int(sys.argv[1])
base, new = per_kernel(sys.argv[2].split(","), n), per_kernel(sys.argv[3].split(","), n)
print("| kernel | base us | new us | change us |\n|---|---:|---:|---:|")
for k in sorted(set(base) | set(new), key=lambda k: -(new.get(k, 0) - base.get(k, 0))):
    print(f"| {k[:70]} | {base.get(k, 0):.1f} | {new.get(k, 0):.1f} | {new.get(k, 0) - base.get(k, 0):+.1f} |")
print(f"| sum | {sum(base.values()):.1f} | {sum(new.values()):.1f} | {sum(new.values()) - sum(base.values()):+.1f} |")
