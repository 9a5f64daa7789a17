#!/bin/bash
# the persistent MoE block's phases, CTA 0's clock at each boundary (lab build -DMDB_TIMES), B = 1 under the graph
set -u
source .carry/env.sh
xz -dc .carry/lab/fp8moe-bench-times.xz > /tmp/fb && chmod +x /tmp/fb
timeout 90 /tmp/fb decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --route moe.persistent=on \
  > /tmp/t.log 2>&1; echo "rc $?"; grep -E "^\| fp8" /tmp/t.log
grep "^mdb" /tmp/t.log | tail -2000 | python3 -c '
import sys, statistics as st
rows = [list(map(int, l.split()[1:])) for l in sys.stdin]
names = ["pdl wait", "router+x", "barrier1", "topk", "gate|up", "barrier2", "down", "barrier3", "tail"]
print(len(rows), "launches; median cycles (us at 1.98 GHz)")
for i, n in enumerate(names):
    v = st.median(r[i] for r in rows); print(f"{n:10s} {v:8.0f} {v/1980:6.2f}")
'
