#!/bin/bash
# the attention block with its weights prefetched (QKV before the PDL wait, o after the split phase) and the combine
# walking only its o loads: tests, both blocks' phases (lab build -DADB_TIMES -DMDB_TIMES) with attn.persistent off
# and on, decode off / on alternating
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37a.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
(OMP_NUM_THREADS=8 FM_TEST_FILTER='test_paged*' timeout 200 $T/test_cuda_ops > $L/paged.log 2>&1; echo "paged rc $?" > $L/paged.rc) &
timeout 120 $T/test_cuda_attn_block > $L/ab.log 2>&1; echo "attn_block rc $? $(grep -cE 'bit for bit' $L/ab.log)"
grep -E "FAILED|rror" $L/ab.log | head -3
xz -dc .carry/lab/fp8moe-bench-adb.xz > /tmp/fb && chmod +x /tmp/fb
for v in off on; do
timeout 90 /tmp/fb decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --route attn.persistent=$v \
  > /tmp/t.log 2>&1; echo "lab $v rc $? $(grep -E '^\| fp8' /tmp/t.log | head -1)"
for k in adb mdb; do
grep "^$k" /tmp/t.log | tail -2000 | K=$k python3 -c '
import os, sys, statistics as st
rows = [list(map(int, l.split()[1:])) for l in sys.stdin]
if not rows: sys.exit()
names = {"adb": ["wait", "qkv", "b1", "rope", "b2", "split", "b3+comb", "b4", "o", "b5", "tail"],
         "mdb": ["wait", "router+x", "b1", "topk", "gate|up", "b2", "down", "b3", "tail"]}[os.environ["K"]]
print(os.environ["K"], len(rows), "launches, median us at 1.98 GHz:", " ".join(f"{n} {st.median(r[i] for r in rows)/1980:.2f}" for i, n in enumerate(names)))
'
done; done
for r in 1 2; do for v in off on; do
  timeout 40 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 \
    --route attn.persistent=$v > /tmp/d.log 2>&1; echo "decode $v rc $? $(grep -E '^\| fp8' /tmp/d.log | head -1)"
done; done
wait; cat $L/paged.rc; grep -hE "^\[  FAILED|ERROR:|Aborted" $L/*.log | head -5
