#!/bin/bash
# Forty-eighth session, if device time is left: route moe.block_norm (2955914 on branch shared-block: the add + RMSNorm
# before the one-token MoE block inside the persistent block). test_moe_persistent (every shape also with router_moe's
# pre step, bit for bit against add_rmsnorm + the chain), then fp8 decode B = 1 with the route off / on / on / off,
# Qwen3-30B-A3B and Qwen3-Next.
# Pack: `OUT=.carry/gpu-s53d.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused` at 2955914.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s53d.tar.xz.
set -u
source .carry/env.sh
mkdir -p s53d && tar -xJf .carry/gpu-s53d.tar.xz -C s53d || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
N=s53d/build/new
FM_TEST_FILTER=test_moe_persistent timeout 90 $N/test_cuda_ops_fused > $L/persistent.log 2>&1
echo "== test_moe_persistent rc $? $SECONDS s: $(grep -c 'bit for bit' $L/persistent.log) bit-for-bit lines"
grep -E "FAIL|rror" $L/persistent.log | head -5
for r in off on on off; do
  f=$L/dec_${r}_$SECONDS.log
  timeout 40 $N/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 \
    --batch 1 --route w4a8.gemv_max_m=16,w4a8.splits=fill,moe.block_norm=$r > $f 2>&1
  echo "== block_norm=$r rc $? $SECONDS s: $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' $f | head -1 | cut -c1-60) | kernels $(grep -E '^\| fp8 \| 1 \| [0-9]+ \| [0-9]+ \| [0-9]+ \|$' $f)"
done
for r in off on on off; do # Qwen3-Next: every one of its 48 layers ends in the block
  f=$L/next_${r}_$SECONDS.log
  timeout 60 $N/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
    --steps 32 --batch 1 --route w4a8.gemv_max_m=16,w4a8.splits=fill,moe.block_norm=$r > $f 2>&1
  echo "== qwen3-next block_norm=$r rc $? $SECONDS s: $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' $f | head -1 | cut -c1-60)"
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
