#!/bin/bash
# thirty-ninth session, first call: s41_b and s41_c in one start (pack .carry/gpu-s42a.tar.xz: build/fp8moe-bench and
# build/lab/w4a8_ws of 80580b1; build/patch/fp8moe-bench and build/patch/test_cuda_fold of 80580b1 with
# lab/ws_epilogue_preload.patch). Order: the lab's q256c2l1 beside the engine's kernel on the same problem; ncu's
# duration of every kernel of one fp8-fold-ws MoE call at T = 2048; the patched fold tests; bench moe of both binaries
# (main, then the patch) in one run; PDL off; ncu at T = 8192, as time allows.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
tar -xJf .carry/gpu-s42a.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=build/fp8moe-bench P=build/patch/fp8moe-bench
timeout 100 ./build/lab/w4a8_ws --variants q256c2l1,engine > $L/lab.log 2>&1; echo "== lab rc $? $SECONDS s"
grep -E "^\||PASS|FAIL" $L/lab.log | tail -14 | cut -c1-200
ncu_moe() { # $1 tokens, $2 log
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 14 \
    --kernel-name regex:'w4a8_fold_ws|quantize|dispatch|combine|plan|route|moe|scatter|gather' \
    $B moe --shape qwen3 --routes fp8-fold-ws --tokens $1 --repeat 1 --warmup 0 --backend cuda > $2 2>&1
  echo "== ncu T = $1 rc $? $SECONDS s"
  grep -E "^  [a-zA-Z_0-9<>,: ]+\(|gpu__time_duration" $2 | sed 's/^ *//' | cut -c1-110 | head -30
}
left 100 && ncu_moe 2048 $L/ncu_2048.log
left 100 && { timeout 120 build/patch/test_cuda_fold > $L/fold.log 2>&1; echo "== patched test_cuda_fold rc $? $SECONDS s"
  grep -E "fold ws|FAILED|PASSED|ERROR" $L/fold.log | cut -c1-160 | head -16; }
for b in $B $P; do
  left 70 || break
  timeout 100 $b moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws --tokens 512,2048,8192 --backend cuda \
    > $L/moe_$SECONDS.log 2>&1; echo "== moe $b rc $? $SECONDS s"; grep -E "^\| fp8" $L/moe_*.log | tail -6 | cut -c1-160
done
left 60 && { timeout 80 $B moe --shape qwen3 --routes fp8-fold-ws --tokens 2048 --backend cuda --route pdl=off \
  > $L/moe_pdl.log 2>&1; echo "== moe pdl=off rc $? $SECONDS s"; grep -E "^\| fp8" $L/moe_pdl.log; }
left 100 && ncu_moe 8192 $L/ncu_8192.log
echo "== $SECONDS s"
