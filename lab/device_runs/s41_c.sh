#!/bin/bash
# thirty-eighth session, last call: the warp-specialised GEMMs' epilogue with its row loads before the stores and the
# fast SiLU (pack .carry/gpu-s41c.tar.xz: fp8moe-bench and test_cuda_fold of the session's tree). The fold tests,
# then ncu's duration of every kernel of one fp8-fold-ws MoE call at T = 2048, then bench moe, as time allows.
set -u
LIMIT=${LIMIT:-180}
source .carry/env.sh
tar -xJf .carry/gpu-s41c.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=build/fp8moe-bench
timeout 100 build/tests/gpu/test_cuda_fold > $L/fold.log 2>&1; echo "== test_cuda_fold rc $? $SECONDS s"
grep -E "fold ws|FAILED|PASSED|ERROR" $L/fold.log | cut -c1-160 | head -14
left 40 && { timeout $((LIMIT - SECONDS)) ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 12 \
  --kernel-name regex:'w4a8_fold_ws|quantize_tokens|dispatch|combine|plan' \
  $B moe --shape qwen3 --routes fp8-fold-ws --tokens 2048 --repeat 1 --warmup 0 --backend cuda > $L/ncu.log 2>&1
  echo "== ncu rc $? $SECONDS s"; grep -E "^  [a-zA-Z_0-9<>,: ]+\(|gpu__time_duration" $L/ncu.log | sed 's/^ *//' | cut -c1-110 | head -24; }
left 40 && { timeout $((LIMIT - SECONDS)) $B moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws --tokens 2048,8192 \
  --backend cuda > $L/moe.log 2>&1; echo "== moe rc $? $SECONDS s"; grep -E "^\| fp8" $L/moe.log; }
echo "== $SECONDS s"
