#!/bin/bash
# the down phase's first round prefetched before barrier 2: the fused ops' tests, the MoE block's phases (lab build
# -DMDB_TIMES), decode against e622cac's binary (the s37f pack's bench) in the same call, alternating
set -u
source .carry/env.sh
mkdir -p old/build && xz -dc .carry/old-bench-e622cac.xz > old/build/fp8moe-bench && chmod +x old/build/fp8moe-bench || exit 1
tar -xJf .carry/gpu-s37h.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
(OMP_NUM_THREADS=12 timeout 280 $T/test_cuda_ops_fused > $L/fused.log 2>&1; echo "ops_fused rc $?" > $L/fused.rc) &
(OMP_NUM_THREADS=2 timeout 150 $T/test_cuda_generate > $L/generate.log 2>&1; echo "generate rc $?" > $L/generate.rc) &
xz -dc .carry/lab/fp8moe-bench-mdbh.xz > /tmp/fb && chmod +x /tmp/fb
timeout 90 /tmp/fb decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 > /tmp/t.log 2>&1
echo "lab rc $? $(grep -E '^\| fp8' /tmp/t.log | head -1)"
grep "^mdb" /tmp/t.log | tail -2000 | python3 -c '
import sys, statistics as st
rows = [list(map(int, l.split()[1:])) for l in sys.stdin]
names = ["wait", "router+x", "b1", "topk", "gate|up", "b2", "down", "b3", "tail"]
print("mdb", len(rows), "launches, median us:", " ".join(f"{n} {st.median(r[i] for r in rows)/1980:.2f}" for i, n in enumerate(names)))
'
for r in 1 2; do for b in old/build build; do
  timeout 60 $b/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8 \
    > /tmp/d.log 2>&1; echo "decode $b rc $? $(grep -E '^\| fp8' /tmp/d.log | head -3 | cut -d'|' -f3,4 | tr '\n' ' ')"
done; done
wait; cat $L/fused.rc $L/generate.rc; grep -hE "^\[  FAILED|ERROR:|Aborted" $L/*.log | head -5; grep -c "bit for bit" $L/fused.log
