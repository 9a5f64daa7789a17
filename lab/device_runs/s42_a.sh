#!/bin/bash
# thirty-ninth session, first call: s41_b and s41_c in one start, and the ws GEMMs with a part-full tile's empty m64
# blocks skipped. Pack .carry/gpu-s42a.tar.xz: build/fp8moe-bench and build/lab/w4a8_ws of 80580b1 (main);
# build/patch/fp8moe-bench (80580b1 + lab/ws_epilogue_preload.patch); build/new/{fp8moe-bench,test_cuda_fold,w4a8_ws}
# (the session's tree: the patch's epilogue and the skipped blocks). Order: the lab (main's q256c2l1 and engine, the
# new engine); the new fold tests; bench moe of the three binaries in one run; ncu of each kernel of one main
# fp8-fold-ws MoE call at T = 2048; Mixtral; the 48-layer prefill, as time allows.
set -u
LIMIT=${LIMIT:-500}
source .carry/env.sh
tar -xJf .carry/gpu-s42a.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=build/fp8moe-bench
timeout 100 ./build/lab/w4a8_ws --variants q256c2l1,engine > $L/lab.log 2>&1; echo "== lab main rc $? $SECONDS s"
grep -E "^\||PASS|FAIL" $L/lab.log | tail -10 | cut -c1-200
timeout 60 ./build/new/w4a8_ws --variants engine > $L/lab_new.log 2>&1; echo "== lab new rc $? $SECONDS s"
grep -E "^\||PASS|FAIL" $L/lab_new.log | tail -6 | cut -c1-200
left 100 && { timeout 150 build/new/test_cuda_fold > $L/fold.log 2>&1; echo "== new test_cuda_fold rc $? $SECONDS s"
  grep -E "fold ws|FAILED|PASSED|ERROR" $L/fold.log | cut -c1-160 | head -16; }
for b in $B build/patch/fp8moe-bench build/new/fp8moe-bench; do
  left 70 || break
  f=$L/moe_$SECONDS.log; timeout 100 $b moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws --tokens 512,2048,8192 \
    --backend cuda > $f 2>&1; echo "== moe $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-160
done
left 100 && { timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 14 \
  --kernel-name regex:'w4a8_fold_ws|quantize|dispatch|combine|plan|route|moe|scatter|gather' \
  $B moe --shape qwen3 --routes fp8-fold-ws --tokens 2048 --repeat 1 --warmup 0 --backend cuda > $L/ncu.log 2>&1
  echo "== ncu main T = 2048 rc $? $SECONDS s"
  grep -E "^  [a-zA-Z_0-9<>,: ]+\(|gpu__time_duration" $L/ncu.log | sed 's/^ *//' | cut -c1-110 | head -30; }
for b in $B build/new/fp8moe-bench; do
  left 60 || break
  f=$L/mix_$SECONDS.log; timeout 80 $b moe --shape mixtral --routes fp8-grouped,fp8-fold-ws --tokens 4096 \
    --backend cuda > $f 2>&1; echo "== mixtral $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-160
done
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for r in "" "--int4-scales p2 --route w4a8.kernel=fold"; do
  left 60 || break
  f=$L/pre_$SECONDS.log; timeout 90 build/new/fp8moe-bench "${P[@]}" $r > $f 2>&1; echo "== new prefill [$r] rc $? $SECONDS s"
  grep -E "tok/s|^\| (total|moe|experts)" $f | tail -3 | cut -c1-200
done
echo "== $SECONDS s"
