#!/usr/bin/env python3
"""The persistent MoE block's phase clocks (-DMDB_TIMES builds print "mdb" lines of CTA 0's clock deltas) on stdin:
the median of each phase over the lines given, in us at the clock rate argv[1] (MHz)."""
import statistics as st
import sys

mhz = float(sys.argv[1])
rows = [list(map(int, l.split()[1:])) for l in sys.stdin if l.startswith("mdb ")]
names = ["wait", "router+x", "b1", "topk", "gate|up", "b2", "down", "b3", "tail"]
med = [st.median(r[i] for r in rows) / mhz for i in range(len(names))]
print("mdb", len(rows), "launches, median us:", " ".join(f"{n} {v:.2f}" for n, v in zip(names, med)),
      f"| sum {sum(med):.2f}")
