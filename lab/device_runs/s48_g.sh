#!/bin/bash
# forty-fourth session: route_warp_kernel with one routing variant a kernel and the sampler's first pass split over
# CTAs (.carry/gpu-s48g.tar.xz) against the binary before them (.carry/gpu-s48f.tar.xz), the split routes given to
# both. (1) test_cuda_sampler (both launch forms), test_route*, test_cuda_generate, test_cuda_graph on the new
# binary; (2) fp8 decode B = 1, 8, 64, base / new alternating, two rounds; (3) route_warp_kernel (B = 64) and
# sample_kernel (B = 1, 8, 64) under ncu, base and new; (4) test_cuda_sampler under memcheck on the time left.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s48f.tar.xz, .carry/gpu-s48g.tar.xz.
set -u
LIMIT=${LIMIT:-480}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s48f s48g && tar -xJf .carry/gpu-s48f.tar.xz -C s48f && tar -xJf .carry/gpu-s48g.tar.xz -C s48g || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
R=w4a8.gemv_max_m=16,w4a8.splits=fill
N=s48g/build/new
timeout 150 $N/test_cuda_sampler > $L/test_sampler.log 2>&1
echo "== test_cuda_sampler rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_sampler.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_sampler.log) failed"
grep -E "vocab 151936|FAIL|rror" $L/test_sampler.log | head -16
FM_TEST_FILTER='test_route*' timeout 150 $N/test_cuda_ops > $L/ops_route.log 2>&1
echo "== test_route* rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_route.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops_route.log) failed"
for t in generate graph; do
  timeout 150 $N/test_cuda_$t > $L/test_$t.log 2>&1
  echo "== test_cuda_$t rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_$t.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_$t.log) failed"
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --route $R)
for rd in 1 2; do for b in base new; do
  left 30 || break
  B=s48f/build/new; [ $b = new ] && B=$N
  f=$L/dec_${b}_$rd.log; timeout 90 $B/fp8moe-bench "${D[@]}" --batch 1,8,64 > $f 2>&1
  echo "== decode $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
for b in base new; do
  B=s48f/build/new; [ $b = new ] && B=$N
  left 30 || break
  f=$L/ncu_route_$b.txt
  timeout 60 ncu --kernel-name route_warp_kernel --launch-skip 132 --launch-count 4 --cache-control none \
    --clock-control none --metrics gpu__time_duration.sum $B/fp8moe-bench decode \
    --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 256 --presets fp8 --backend cuda --warmup 1 --steps 4 \
    --route decode.graphs=off,$R > $f 2>&1
  echo "== ncu route $b rc $? $SECONDS s: $(grep -E 'gpu__time_duration' $f | sed 's/  */ /g' | tr '\n' ' ')"
  for bb in 1 8 64; do
    left 30 || break
    f=$L/ncu_sample_${b}_$bb.txt
    timeout 60 ncu --kernel-name sample_kernel --launch-count 200 --cache-control none --clock-control none \
      --metrics gpu__time_duration.sum,launch__grid_size $B/fp8moe-bench decode --synthetic qwen3-30b-a3b \
      --layers 2 --batch $bb --context 256 --presets fp8 --backend cuda --warmup 1 --steps 4 \
      --route decode.graphs=off,$R > $f 2>&1
    echo "== ncu sample $b B=$bb rc $? $SECONDS s: $(grep -E 'gpu__time_duration|launch__grid_size' $f | tail -4 | sed 's/  */ /g' | tr '\n' ' ')"
  done
done
if left 160; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_sampler > $L/memcheck_sampler.log 2>&1
  echo "== memcheck sampler rc $? $SECONDS s"; tail -2 $L/memcheck_sampler.log
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
