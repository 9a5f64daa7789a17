#!/bin/bash
# forty-fifth session: the wgmma kernel's 16-row tiles at 3 CTAs an SM (launch bounds) against 2 (.carry/gpu-s50b.tar.xz,
# 3a98649's kernels) in one call: bench moe --shape qwen3 --tokens 8,16,32,64 and fp8 decode B = 1, 8, 64, base / new
# alternating, two rounds; the gate|up launch's occupancy under ncu; test_moe_w4a8 on the new binary.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s50b.tar.xz, .carry/gpu-s50d.tar.xz.
set -u
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p sb sd && tar -xJf .carry/gpu-s50b.tar.xz -C sb && tar -xJf .carry/gpu-s50d.tar.xz -C sd || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
R=w4a8.gemv_max_m=16,w4a8.splits=fill
FM_TEST_FILTER='test_moe_w4a8' timeout 100 sd/build/new/test_cuda_ops > $L/ops.log 2>&1
echo "== test_moe_w4a8 rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops.log) failed"
timeout 60 ncu --kernel-name-base demangled --kernel-name regex:w4a8_wgmma --launch-skip 8 --launch-count 2 \
  --section Occupancy --section SpeedOfLight --section LaunchStats sd/build/new/fp8moe-bench moe --shape qwen3 \
  --tokens 8 --routes fp8-grouped --backend cuda --warmup 2 --repeat 3 2>&1 | \
  grep -E "w4a8_wgmma|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Waves|SM Active" > $L/ncu.txt
cat $L/ncu.txt
for rd in 1 2; do for b in base new; do
  B=sb/build/new; [ $b = new ] && B=sd/build/new
  $B/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $R > $L/moe_${b}_$rd.log 2>&1
  echo "== moe $b round $rd: $(grep -E '^\| fp8-grouped' $L/moe_${b}_$rd.log | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
  f=$L/dec_${b}_$rd.log; timeout 60 $B/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 \
    --backend cuda --steps 32 --batch 1,8,64 --route $R > $f 2>&1
  echo "== decode $b round $rd rc $?: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $f | awk -F'|' '{printf "B=%s %s ", $3, $4}')"
done; done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
