#!/bin/bash
# fortieth session, first call: s42_c.sh, with the new binary's bench moe at T = 1024 and 4096 too and the fold
# GEMM's route beside (for the fold route's auto threshold). s42_c: the ws kernel's epilogue with every load issued
# before its stores (the column
# scales 8 pairs at a time: lab/ws_epilogue_loads.patch). Pack .carry/gpu-s42c.tar.xz: build/fp8moe-bench of 80580b1
# (the baseline), build/new/{fp8moe-bench,test_cuda_fold,w4a8_ws} of main with the patch applied
# (`BASE=80580b1 PATCH=lab/ws_epilogue_loads.patch OUT=.carry/gpu-s42c.tar.xz tools/gpu-pack-ab.sh fp8moe-bench
# tests/gpu/test_cuda_fold lab/w4a8_ws`). Order: the lab (q256c2l1 and the engine's kernel on
# the same data), bench moe of both binaries, the fold tests, the 48-layer prefill, then ncu's per-instruction
# stalls of the engine kernel (T = 2048 gate|up), as time allows.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
tar -xJf .carry/gpu-s42c.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=build/fp8moe-bench N=build/new/fp8moe-bench
timeout 100 ./build/new/w4a8_ws --variants q256c2l1,engine > $L/lab.log 2>&1; echo "== lab rc $? $SECONDS s"
grep -E "PASS|FAIL" $L/lab.log | grep -c PASS; grep -E "FAIL" $L/lab.log | head -3; grep -E "layer" $L/lab.log | cut -c1-120
for b in $B $N; do
  left 50 || break
  tk=512,2048,8192 rt=fp8-grouped,fp8-fold-ws; [ $b = $N ] && tk=512,1024,2048,4096,8192 rt=fp8-grouped,fp8-fold,fp8-fold-ws
  f=$L/moe_$SECONDS.log; timeout 100 $b moe --shape qwen3 --routes $rt --tokens $tk \
    --backend cuda > $f 2>&1; echo "== moe $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-100
  f=$L/mix_$SECONDS.log; timeout 80 $b moe --shape mixtral --routes fp8-grouped,fp8-fold-ws --tokens 4096 \
    --backend cuda > $f 2>&1; echo "== mixtral $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-100
done
left 95 && { timeout 150 build/new/test_cuda_fold > $L/fold.log 2>&1; echo "== new test_cuda_fold rc $? $SECONDS s"
  grep -E "fold ws|FAILED|PASSED|ERROR" $L/fold.log | cut -c1-160 | head -16; }
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for r in "" "--int4-scales p2 --route w4a8.kernel=fold"; do
  left 50 || break
  f=$L/pre_$SECONDS.log; timeout 90 $N "${P[@]}" $r > $f 2>&1; echo "== new prefill [$r] rc $? $SECONDS s"
  grep -E "tok/s|^\| (total|experts)" $f | tail -3 | cut -c1-160
done
left 80 && { timeout $((LIMIT - SECONDS - 5)) ncu --clock-control none --kernel-name regex:w4a8_fold_ws_kernel \
  --launch-skip 20 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters \
  -o $L/eng ./build/new/w4a8_ws --variants engine > $L/ncu_run.log 2>&1; echo "== ncu rc $? $SECONDS s"
  ncu --import $L/eng.ncu-rep --print-details all > $L/eng.details.txt 2>&1
  ncu --import $L/eng.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/eng.source.csv.gz
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy" $L/eng.details.txt | head -4; rm -f $L/eng.ncu-rep; }
echo "== $SECONDS s"
