#!/bin/bash
# the session after the fortieth: s43_c (never run) and the split blocks in one call. Pack .carry/gpu-s44a.tar.xz
# (`BASE=2eff5ca BASE_PROGRAMS="fp8moe-bench lab/w4a8_ws tests/gpu/test_cuda_fold" PATCH=lab/ws_split_blocks.patch
# OUT=.carry/gpu-s44a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_fold tests/gpu/test_cuda_fold_gemv
# lab/w4a8_ws`): build/ main (the threshold of 16 rows an expert, n256c2l1 in the lab), build/new/ main with a tile
# of 65..128 rows split over both consumer warpgroups (one m64 block each). Order: the lab (q256c2l1, n256c2l1 and
# the engine kernel, base then new), the fold tests of both, bench moe of both, the 48-layer prefill of both.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
tar -xJf .carry/gpu-s44a.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=build N=build/new
timeout 100 $B/w4a8_ws --variants q256c2l1,n256c2l1,engine > $L/lab_base.log 2>&1; echo "== lab base rc $? $SECONDS s"
timeout 100 $N/w4a8_ws --variants engine > $L/lab_new.log 2>&1; echo "== lab new rc $? $SECONDS s"
for f in $L/lab_base.log $L/lab_new.log; do
  grep -E "checks|FAIL|BELOW" $f | head -3; grep -E "layer|down|gate" $f | grep -E "^\|" | cut -c1-110
done
(timeout 200 $N/test_cuda_fold > $L/fold_new.log 2>&1; echo "== new test_cuda_fold rc $? $SECONDS s" >> $L/fold_new.log) &
(timeout 200 $N/test_cuda_fold_gemv > $L/gemv_new.log 2>&1; echo "== new test_cuda_fold_gemv rc $? $SECONDS s" >> $L/gemv_new.log) &
(timeout 200 $B/test_cuda_fold > $L/fold_base.log 2>&1; echo "== base test_cuda_fold rc $? $SECONDS s" >> $L/fold_base.log) &
wait
for f in fold_new gemv_new fold_base; do tail -1 $L/$f.log; grep -E "FAILED|ERROR|fold ws|moe fold" $L/$f.log | cut -c1-150 | head -12; done
for b in $B $N; do
  left 40 || break
  f=$L/moe_${b//\//_}.log; timeout 100 $b/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws \
    --tokens 512,1024,2048,4096,8192 --backend cuda > $f 2>&1; echo "== moe $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-100
  f=$L/mix_${b//\//_}.log; timeout 80 $b/fp8moe-bench moe --shape mixtral --routes fp8-grouped,fp8-fold-ws --tokens 4096 \
    --backend cuda > $f 2>&1; echo "== mixtral $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-100
done
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for b in $B $N; do for r in "" "--int4-scales p2 --route w4a8.kernel=fold"; do
  left 40 || break
  f=$L/pre_$SECONDS.log; timeout 90 $b/fp8moe-bench "${P[@]}" $r > $f 2>&1
  echo "== prefill $b [$r] rc $? $SECONDS s"; grep -E "^latency|^\| experts" $f | cut -c1-120
done; done
echo "== $SECONDS s"
