#!/bin/bash
# forty-fourth session: the split GEMM's sum over the cluster, second form (a warp's loads over 512 contiguous bytes),
# and the sampler's first pass in 16-byte loads (.carry/gpu-s48c.tar.xz) against the binary before them (.carry/gpu-s47b.tar.xz, 5a00448), both with the split
# routes given (w4a8.gemv_max_m=16,w4a8.splits=fill: today's defaults). (1) the W4A8 op tests on the new binary and
# the split test under memcheck; (2) fp8 decode B = 32, 64, base / new alternating, two rounds; per op at B = 64;
# (3) the split launches under ncu (new); (4) every kernel of a B = 64 and a B = 1 step (2 layers) with its duration
# (new; B = 1 base too: s48_b has base's B = 64). test_cuda_sampler first.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s47b.tar.xz, .carry/gpu-s48c.tar.xz.
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s47 s48 && tar -xJf .carry/gpu-s47b.tar.xz -C s47 && tar -xJf .carry/gpu-s48c.tar.xz -C s48 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
R=w4a8.gemv_max_m=16,w4a8.splits=fill
timeout 120 s48/build/new/test_cuda_sampler > $L/sampler.log 2>&1
echo "== test_cuda_sampler rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/sampler.log) ok"; grep -E "vocab|FAIL" $L/sampler.log | head -12
FM_TEST_FILTER='test_linear_w4a8*' timeout 200 s48/build/new/test_cuda_ops > $L/ops_w4a8.log 2>&1
echo "== test_linear_w4a8* rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_w4a8.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops_w4a8.log) failed"
grep -E "FAILED|Error|error" $L/ops_w4a8.log | head -5
FM_TEST_FILTER='test_linear_w4a8_splits' timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
  s48/build/new/test_cuda_ops > $L/memcheck_splits.log 2>&1
echo "== memcheck splits rc $? $SECONDS s"; tail -2 $L/memcheck_splits.log
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --route $R)
for rd in 1 2; do for b in base new; do
  left 30 || break
  B=s47/build/new; [ $b = new ] && B=s48/build/new
  f=$L/dec_${b}_$rd.log; timeout 90 $B/fp8moe-bench "${D[@]}" --batch 1,32,64 > $f 2>&1
  echo "== decode $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
for b in base new; do
  left 30 || break
  B=s47/build/new; [ $b = new ] && B=s48/build/new
  f=$L/perop_$b.log; timeout 60 $B/fp8moe-bench "${D[@]}" --batch 64 --per-op > $f 2>&1
  echo "== per-op B=64 $b rc $? $SECONDS s"; grep -E "qkv_proj|o_proj|\| total" $f | cut -c1-100
done
if left 60; then
  f=$L/ncu_split.txt
  timeout 100 ncu --kernel-name-base demangled --kernel-name 'regex:w4a8_wgmma_kernel<\(int\)4,' --launch-skip 4 \
    --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats s48/build/new/fp8moe-bench \
    decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 2048 --presets fp8 --backend cuda --steps 4 \
    --route decode.graphs=off,$R > $f 2>&1
  echo "== ncu split rc $? $SECONDS s"
  grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps" $f | sed -e 's/  */ /g'
fi
for spec in "new 64" "new 1" "base 1"; do read b bb <<< "$spec" # every kernel: the last 2 steps of 2 layers (the prefill's launches first)
  left 60 || break
  B=s47/build/new; [ $b = new ] && B=s48/build/new
  f=$L/ncu_all_${b}_$bb.csv
  timeout 100 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none --clock-control none \
    --csv $B/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch $bb --context 256 \
    --presets fp8 --backend cuda --warmup 1 --steps 2 --route decode.graphs=off,$R > $f 2>&1
  echo "== ncu all $b B=$bb rc $? $SECONDS s $(wc -l < $f) lines"
  grep -E "sample_kernel|w4a8_wgmma_kernel<4" $f | grep duration | tail -3 | cut -c1-40,200-
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
