#!/bin/bash
# Fiftieth session, third call: the session's last MoE block (the last CTA's tail reverted after s55_b.sh measured it
# level; slice_top kept) against ddb2346 (s55_all.sh's new): test_moe_persistent and test_moe_block_barriers on the
# new binary, then decode B = 1 in four rounds ABBA at Qwen3-Next and Qwen3-30B-A3B, then the new block's phase clocks.
# Pack .carry/gpu-s55c.tar.xz: build/old/fp8moe-bench (ddb2346), build/new/{fp8moe-bench,fp8moe-bench-mdb,
# test_cuda_ops_fused} (the session's last tree).
set -u
source .carry/env.sh
mkdir -p s55c && tar -xJf .carry/gpu-s55c.tar.xz -C s55c || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
L=$OUT/logs; mkdir -p $L
N=s55c/build/new
for f in test_moe_persistent test_moe_block_barriers; do
  FM_TEST_FILTER=$f timeout 120 $N/test_cuda_ops_fused > $L/$f.log 2>&1
  echo "== $f rc $? $SECONDS s: $(grep -c 'bit for bit' $L/$f.log) bit-for-bit lines"
  grep -E "FAIL|rror" $L/$f.log | head -5
done
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for m in qwen3-next-80b-a3b qwen3-30b-a3b; do
  for v in old new new old old new new old; do
    f=$L/${m}_${v}_$SECONDS.log
    timeout 60 s55c/build/$v/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 \
      --batch 1 --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | head -1 | cut -d'|' -f3,4)
  done
done
for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
  timeout 60 $N/fp8moe-bench-mdb decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 --route $R \
    > $L/mdb_new_$m.log 2>&1
  echo "== mdb new $m rc $?"
  grep -E "^mdbt? " $L/mdb_new_$m.log | tail -2000 | python3 lab/device_runs/mdb_medians.py $MHZ
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
