#!/usr/bin/env python3
"""The persistent MoE block's phase clocks (-DMDB_TIMES builds print "mdb" lines of CTA 0's clock deltas) on stdin:
the median of each phase over the lines given, in us at the clock rate argv[1] (MHz). Builds since the fiftieth
session add five fields: the top-k's pieces (values, first ranking, second ranking or sync, finish) and the tail's
quantizer (part of the tail); where the last CTA to arrive runs the tail, its own clock's tail is an "mdbt" line."""
import statistics as st
import sys

mhz = float(sys.argv[1])
lines = list(sys.stdin)
rows = [list(map(int, l.split()[1:])) for l in lines if l.startswith("mdb ")]
tails = [int(l.split()[1]) for l in lines if l.startswith("mdbt ")]
names = ["wait", "router+x", "b1", "topk", "gate|up", "b2", "down", "b3", "tail"]
subs = ["values", "rank1", "rank2", "finish", "tail.quant"]
med = [st.median(r[i] for r in rows) / mhz for i in range(len(names))]
line = " ".join(f"{n} {v:.2f}" for n, v in zip(names, med))
if rows and len(rows[0]) >= len(names) + len(subs):
    sub = [st.median(r[len(names) + i] for r in rows) / mhz for i in range(len(subs))]
    line += " | " + " ".join(f"{n} {v:.2f}" for n, v in zip(subs, sub))
if tails:
    line += f" | last CTA's tail {st.median(tails) / mhz:.2f} ({len(tails)} lines)"
print("mdb", len(rows), "launches, median us:", line, f"| sum {sum(med):.2f}")
