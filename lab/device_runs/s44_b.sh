#!/bin/bash
# the session after the fortieth, second call: the ws kernel's 16-row activation box for tiles of at most 16 rows
# (lab/ws_small_box.patch). Pack .carry/gpu-s44b.tar.xz (`BASE=2eff5ca PATCH=lab/ws_small_box.patch
# OUT=.carry/gpu-s44b.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_fold`): build/ main's
# fp8moe-bench, build/new/ with the patch. The fold tests of new, then bench moe of both at small T.
set -u
LIMIT=${LIMIT:-240}
source .carry/env.sh
tar -xJf .carry/gpu-s44b.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
timeout 200 build/new/test_cuda_fold > $L/fold_new.log 2>&1; echo "== new test_cuda_fold rc $? $SECONDS s"
grep -E "FAILED|PASSED|ERROR|fold ws" $L/fold_new.log | cut -c1-150 | head -12
for r in 1 2; do for b in build build/new; do
  left 30 || break
  f=$L/moe_${r}_${b//\//_}.log; timeout 60 $b/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-fold,fp8-fold-ws \
    --tokens 64,128,256,512 --backend cuda > $f 2>&1; echo "== moe $b round $r rc $? $SECONDS s"
  grep -E "^\| fp8" $f | cut -c1-100
done; done
echo "== $SECONDS s"
