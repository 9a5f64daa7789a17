#!/bin/bash
# fortieth session: the lab's n256c2l1 beside q256c2l1 and the engine's kernel, then the fold route's new threshold
# (w4a8.fold_ws from 16 rows an expert) on the GPU. Pack .carry/gpu-s43c.tar.xz (`OUT=.carry/gpu-s43c.tar.xz
# tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_fold tests/gpu/test_cuda_fold_gemv lab/w4a8_ws`: main with
# the epilogue's loads first and the threshold, under build/new/). The two fold test programs (their moe cases at P
# >= 16 E now take the ws GEMMs, the cpu reference the same h), the prefill on the route at T = 256 and 2048.
set -u
LIMIT=${LIMIT:-400}
source .carry/env.sh
tar -xJf .carry/gpu-s43c.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=build/new
timeout 100 $N/w4a8_ws --variants q256c2l1,n256c2l1,engine > $L/lab.log 2>&1; echo "== lab rc $? $SECONDS s"
grep -c PASS $L/lab.log; grep -E "FAIL|BELOW|spill" $L/lab.log | head -4; grep -E "layer" $L/lab.log | cut -c1-120
(timeout 200 $N/test_cuda_fold > $L/fold.log 2>&1; echo "== test_cuda_fold rc $? $SECONDS s" >> $L/fold.log) &
(timeout 200 $N/test_cuda_fold_gemv > $L/gemv.log 2>&1; echo "== test_cuda_fold_gemv rc $? $SECONDS s" >> $L/gemv.log) &
wait
for f in fold gemv; do tail -1 $L/$f.log; grep -E "FAILED|PASSED|ERROR|moe fold" $L/$f.log | cut -c1-150 | head -14; done
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for t in 256 2048; do for r in "" "--int4-scales p2 --route w4a8.kernel=fold"; do
  left 50 || break
  f=$L/pre_$SECONDS.log; timeout 90 $N/fp8moe-bench "${P[@]}" --tokens $t $r > $f 2>&1
  echo "== prefill T $t [$r] rc $? $SECONDS s"; grep -E "^latency|^\| experts" $f | cut -c1-120
done; done
echo "== $SECONDS s"
