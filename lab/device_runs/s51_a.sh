#!/bin/bash
# forty-sixth session: (1) the MoE block's combine + norm kernel quantizing the next q|k|v rows above one token
# (moe_add_rmsnorm's out_q; .carry/gpu-s51a.tar.xz: build/ = 269c61a, build/new = 763a42d): its op tests (against the
# chain and the CPU's quantizer) and memcheck, test_cuda_generate; (2) three CTAs an SM for the expert GEMM's 16-row
# tiles (.carry/gpu-s50d.tar.xz build/new: 3a98649's kernels + launch bounds), ncu occupancy of its gate|up launch;
# (3) bench moe T = 8..64 base / 3cta and fp8 decode B = 1, 8, 64 base / hq / 3cta alternating, two rounds.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s51a.tar.xz, .carry/gpu-s50d.tar.xz.
set -u
LIMIT=${LIMIT:-400}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s51 sd && tar -xJf .carry/gpu-s51a.tar.xz -C s51 && tar -xJf .carry/gpu-s50d.tar.xz -C sd || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s51/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
timeout 180 $N/test_cuda_ops_fused > $L/test_fused.log 2>&1
echo "== test_cuda_ops_fused (out_q) rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_fused.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_fused.log) failed"
grep -E "FAIL|rror|Assert" $L/test_fused.log | cut -c1-160 | head -6
timeout 150 $N/test_cuda_generate > $L/test_generate.log 2>&1
echo "== test_cuda_generate rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_generate.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_generate.log) failed"
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64 --route $R)
for rd in 1 2; do for v in base hq 3cta; do
  left 30 || break
  B=s51/build; [ $v = hq ] && B=$N; [ $v = 3cta ] && B=sd/build/new
  f=$L/dec_${v}_$rd.log; timeout 60 $B/fp8moe-bench "${D[@]}" > $f 2>&1
  echo "== decode $v round $rd rc $? $SECONDS s: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $f | awk -F'|' '{printf "B=%s %s ", $3, $4}')"
done; done
for rd in 1 2; do for v in base 3cta; do
  left 30 || break
  B=s51/build; [ $v = 3cta ] && B=sd/build/new
  $B/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $R > $L/moe_${v}_$rd.log 2>&1
  echo "== moe $v round $rd: $(grep -E '^\| fp8-grouped' $L/moe_${v}_$rd.log | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
done; done
if left 60; then
  timeout 50 ncu --kernel-name-base demangled --kernel-name regex:w4a8_wgmma --launch-skip 8 --launch-count 2 \
    --section Occupancy --section SpeedOfLight --section LaunchStats sd/build/new/fp8moe-bench moe --shape qwen3 \
    --tokens 8 --routes fp8-grouped --backend cuda --warmup 2 --repeat 3 2>&1 | \
    grep -E "w4a8_wgmma|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Waves|SM Active" > $L/ncu.txt
  cat $L/ncu.txt | head -30
fi
if left 80; then
  FM_TEST_FILTER='test_moe_add_rmsnorm_w4a8' timeout 75 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_ops_fused > $L/memcheck.log 2>&1
  echo "== memcheck moe_add_rmsnorm rc $? $SECONDS s"; tail -1 $L/memcheck.log
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
