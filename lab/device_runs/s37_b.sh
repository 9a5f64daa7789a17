#!/bin/bash
# after the RoPE refactor's fix and x staged in one round trip: the tests, the attention block's phases (lab build
# -DADB_TIMES: CTA 0's clock at each boundary), decode off / on alternating
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37a.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
(OMP_NUM_THREADS=8 FM_TEST_FILTER='test_paged*' timeout 200 $T/test_cuda_ops > $L/paged.log 2>&1; echo "paged rc $?" > $L/paged.rc) &
(OMP_NUM_THREADS=4 FM_TEST_FILTER=test_rope_attention timeout 200 $T/test_cuda_ops > $L/rope.log 2>&1; echo "rope rc $?" > $L/rope.rc) &
timeout 120 $T/test_cuda_attn_block > $L/ab.log 2>&1; echo "attn_block rc $?"; grep -cE "bit for bit" $L/ab.log
xz -dc .carry/lab/fp8moe-bench-adb.xz > /tmp/fb && chmod +x /tmp/fb
timeout 90 /tmp/fb decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --route attn.persistent=on \
  > /tmp/t.log 2>&1; echo "lab rc $?"; grep -E "^\| fp8" /tmp/t.log | head -1
grep "^adb" /tmp/t.log | tail -2000 | python3 -c '
import sys, statistics as st
rows = [list(map(int, l.split()[1:])) for l in sys.stdin]
names = ["pdl wait", "qkv", "barrier1", "rope", "barrier2", "split", "barrier3", "combine", "barrier4", "o proj", "barrier5", "tail"]
names = names[:1] + names[1:]
print(len(rows), "launches; median cycles (us at 1.98 GHz)")
lab = ["pdl wait", "qkv", "barrier1", "rope", "barrier2", "split", "b3+combine", "barrier4", "o proj", "barrier5", "tail"]
for i, n in enumerate(lab):
    v = st.median(r[i] for r in rows); print(f"{n:10s} {v:8.0f} {v/1980:6.2f}")
'
for r in 1 2; do for v in off on; do
  timeout 40 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 \
    --route attn.persistent=$v > /tmp/d.log 2>&1; echo "decode $v rc $? $(grep -E '^\| fp8' /tmp/d.log | head -1)"
done; done
wait; cat $L/paged.rc $L/rope.rc; grep -hE "^\[  FAILED|ERROR:|Aborted" $L/*.log | head -5
