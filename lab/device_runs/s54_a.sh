#!/bin/bash
# Forty-ninth session, first call: test_cuda_fold_gemv (its emulation now takes the route's form of h above the
# GEMVs' pairs), test_cuda_fold, then s53_d.sh's measurement: test_moe_persistent (the pre step bit for bit) and
# route moe.block_norm off / on / on / off at B = 1, Qwen3-30B-A3B and Qwen3-Next.
# Pack: `OUT=.carry/gpu-s54a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused
# tests/gpu/test_cuda_fold_gemv tests/gpu/test_cuda_fold`. Carry .carry/env.sh, .carry/debs, the pack.
set -u
source .carry/env.sh
mkdir -p s54a && tar -xJf .carry/gpu-s54a.tar.xz -C s54a || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
N=s54a/build/new
timeout 150 $N/test_cuda_fold_gemv > $L/fold_gemv.log 2>&1
echo "== test_cuda_fold_gemv rc $? $SECONDS s"; grep -E "FAIL|PASSED|rror" $L/fold_gemv.log | head -6
timeout 150 $N/test_cuda_fold > $L/fold.log 2>&1
echo "== test_cuda_fold rc $? $SECONDS s"; grep -E "FAIL|PASSED|rror" $L/fold.log | head -6
FM_TEST_FILTER=test_moe_persistent timeout 90 $N/test_cuda_ops_fused > $L/persistent.log 2>&1
echo "== test_moe_persistent rc $? $SECONDS s: $(grep -c 'bit for bit' $L/persistent.log) bit-for-bit lines"
grep -E "FAIL|rror" $L/persistent.log | head -5
for r in off on on off; do
  f=$L/dec_${r}_$SECONDS.log
  timeout 40 $N/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 \
    --batch 1 --route w4a8.gemv_max_m=16,w4a8.splits=fill,moe.block_norm=$r > $f 2>&1
  echo "== block_norm=$r rc $? $SECONDS s: $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' $f | head -1 | cut -c1-60)"
done
for r in off on on off; do # Qwen3-Next: every one of its 48 layers ends in the block
  f=$L/next_${r}_$SECONDS.log
  timeout 60 $N/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
    --steps 32 --batch 1 --route w4a8.gemv_max_m=16,w4a8.splits=fill,moe.block_norm=$r > $f 2>&1
  echo "== qwen3-next block_norm=$r rc $? $SECONDS s: $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' $f | head -1 | cut -c1-60)"
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
