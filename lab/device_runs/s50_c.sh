#!/bin/bash
# forty-fifth session: the experts' grouped GEMMs with K split over a cluster at 16-row tiles (route w4a8.moe_splits),
# one binary (.carry/gpu-s50c.tar.xz), the route switched. (1) test_moe_w4a8 against the CPU emulation at Z = 2 and
# 4 with the GEMVs off (16-row tiles at every decode size) and under memcheck; (2) bench moe --shape qwen3 --tokens
# 8,16,32,64 at Z = 1, 2, 4; (3) fp8 decode B = 1, 8, 64 at Z = 1, 2, 4, alternating, two rounds; (4)
# test_cuda_generate with Z = 2. Carry .carry/env.sh, .carry/debs, .carry/gpu-s50c.tar.xz.
set -u
LIMIT=${LIMIT:-300}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s50 && tar -xJf .carry/gpu-s50c.tar.xz -C s50 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s50/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for z in 2 4; do
  FM_TEST_FILTER='test_moe_w4a8' timeout 100 $N/test_cuda_ops --route w4a8.moe_splits=$z,moe.gemv=off > $L/ops_$z.log 2>&1
  echo "== test_moe_w4a8 Z=$z rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_$z.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops_$z.log) failed"
  grep -E "FAIL|rror|nerr|bound" $L/ops_$z.log | head -5
done
for z in 1 2 4; do
  $N/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda \
    --route $R,w4a8.moe_splits=$z > $L/moe_$z.log 2>&1
  echo "== bench moe Z=$z rc $?"; grep -E "^\| fp8-grouped" $L/moe_$z.log | cut -c1-60
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
for rd in 1 2; do for z in 1 2 4; do
  left 30 || break
  f=$L/dec_${z}_$rd.log; timeout 60 $N/fp8moe-bench "${D[@]}" --route $R,w4a8.moe_splits=$z > $f 2>&1
  echo "== decode Z=$z round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-60
done; done
if left 60; then
  timeout 60 $N/test_cuda_generate --route w4a8.moe_splits=2 > $L/gen_2.log 2>&1
  echo "== test_cuda_generate Z=2 rc $? $SECONDS s"; grep -E "new tokens|FAIL" $L/gen_2.log | head -10
fi
if left 80; then
  FM_TEST_FILTER='test_moe_w4a8' timeout 75 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_ops \
    --route w4a8.moe_splits=2,moe.gemv=off > $L/memcheck_2.log 2>&1
  echo "== memcheck Z=2 rc $? $SECONDS s"; tail -1 $L/memcheck_2.log
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
