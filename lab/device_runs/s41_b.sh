#!/bin/bash
# thirty-eighth session, second call: where the engine's warp-specialised GEMMs lose to the lab's (s41_a: bench moe
# fp8-fold-ws 0.625 / 1.633 ms at Qwen3 T = 2048 / 8192 against the lab's two GEMMs 0.350 / 0.925). The lab's
# q256c2l1 and the engine's kernel on the same problem (variant engine) on this card; ncu's duration of every kernel of one fp8-fold-ws MoE call (T = 2048, 8192); bench moe with
# PDL off; the fold tests again (test_moe_route pinned to the fold GEMM).
set -u
LIMIT=${LIMIT:-540}
source .carry/env.sh
tar -xJf .carry/gpu-s41b.tar.xz || exit 1 # fp8moe-bench, test_cuda_fold and build/lab/w4a8_ws (rebuild from main)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
{ timeout 100 ./build/lab/w4a8_ws --variants q256c2l1,engine > $L/lab.log 2>&1; echo "== lab rc $? $SECONDS s"
  grep -E "^\\||PASS|FAIL" $L/lab.log | tail -12 | cut -c1-200; }
B=build/fp8moe-bench
for T in 2048; do
  left 90 || break
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 12 \
    --kernel-name regex:'w4a8_fold_ws|quantize_tokens|dispatch|combine|plan' \
    $B moe --shape qwen3 --routes fp8-fold-ws --tokens $T --repeat 1 --warmup 0 --backend cuda > $L/ncu_$T.log 2>&1
  echo "== ncu T = $T rc $? $SECONDS s"
  grep -E "^  [a-z_0-9]+.*\(|gpu__time_duration" $L/ncu_$T.log | sed 's/^ *//' | cut -c1-120 | head -24
done
left 60 && { timeout 90 $B moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws --tokens 2048 --backend cuda --route pdl=off \
  > $L/moe_pdl.log 2>&1; echo "== moe pdl=off rc $? $SECONDS s"; grep -E "^\| fp8" $L/moe_pdl.log; }
left 100 && { timeout 120 build/tests/gpu/test_cuda_fold > $L/fold.log 2>&1; echo "== test_cuda_fold rc $? $SECONDS s"
  grep -E "FAILED|PASSED|ERROR" $L/fold.log | head; }
echo "== $SECONDS s"
