#!/bin/bash
# forty-fourth session: the routing's top-k rounds by redux.sync (.carry/gpu-s48f.tar.xz) against the binary before
# it (.carry/gpu-s48e.tar.xz), the split routes given to both. (1) the router op tests (test_route, test_router:
# the same ids as the cpu; test_router_dispatch_fused, test_router_cluster, test_moe_persistent: bits of the
# chains) on the new binary; (2) fp8 decode B = 1, 8, 64, base / new alternating, two rounds; (3)
# route_warp_kernel under ncu at B = 64 (base, new; the prefill's 128 launches skipped).
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s48e.tar.xz, .carry/gpu-s48f.tar.xz.
set -u
LIMIT=${LIMIT:-400}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s48e s48f && tar -xJf .carry/gpu-s48e.tar.xz -C s48e && tar -xJf .carry/gpu-s48f.tar.xz -C s48f || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
R=w4a8.gemv_max_m=16,w4a8.splits=fill
FM_TEST_FILTER='test_route*' timeout 150 s48f/build/new/test_cuda_ops > $L/ops_route.log 2>&1
echo "== test_route* rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_route.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops_route.log) failed"
grep -E "FAIL|differently" $L/ops_route.log | head -4
for flt in 'test_router_*' test_moe_persistent; do
  FM_TEST_FILTER=$flt timeout 150 s48f/build/new/test_cuda_ops_fused > $L/fused_$flt.log 2>&1
  echo "== $flt rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/fused_$flt.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/fused_$flt.log) failed"
  grep -E "FAIL" $L/fused_$flt.log | head -4
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --route $R)
for rd in 1 2; do for b in base new; do
  left 30 || break
  B=s48e/build/new; [ $b = new ] && B=s48f/build/new
  f=$L/dec_${b}_$rd.log; timeout 90 $B/fp8moe-bench "${D[@]}" --batch 1,8,64 > $f 2>&1
  echo "== decode $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
for b in base new; do
  left 40 || break
  B=s48e/build/new; [ $b = new ] && B=s48f/build/new
  f=$L/ncu_route_$b.txt
  timeout 60 ncu --kernel-name route_warp_kernel --launch-skip 132 --launch-count 4 --cache-control none \
    --clock-control none --metrics gpu__time_duration.sum,launch__grid_size $B/fp8moe-bench decode \
    --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 256 --presets fp8 --backend cuda --warmup 1 --steps 4 \
    --route decode.graphs=off,$R > $f 2>&1
  echo "== ncu route $b rc $? $SECONDS s: $(grep -E 'gpu__time_duration|launch__grid_size' $f | sed 's/  */ /g' | tr '\n' ' ')"
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
