#!/bin/bash
# forty-fourth session, first call, on the pack of 5a00448 (.carry/gpu-s47b.tar.xz; main's kernels: the routes
# w4a8.gemv_max_m=16,w4a8.splits=fill are today's defaults and are given explicitly): where B = 64's step goes.
# (1) fp8 decode B = 64 per op on the e4m3 cache (the stages); (2) ncu on every W4A8 wgmma launch of a B = 64 step
# (q|k|v and o: the split GEMM; gate|up and down: the grouped expert GEMM with 16-row tiles); (3) the split kernel's
# and the gate|up kernel's SASS source pages; (4) bench moe at T = 16, 64 under the expert GEMM's routes.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s47b.tar.xz.
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s47 && tar -xJf .carry/gpu-s47b.tar.xz -C s47 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
S=s47/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --backend cuda --steps 32 --kv-cache e4m3)
for p in fp8 fp8+w8a8; do
  f=$L/perop_$p.log; timeout 90 $S/fp8moe-bench "${D[@]}" --presets $p --batch 64 --route $R --per-op > $f 2>&1
  echo "== per-op B=64 $p rc $? $SECONDS s"; grep -E "^\|" $f | cut -c1-120 | tail -30
done
# (2) one step of 2 layers: 8 launches (q|k|v, o, gate|up, down a layer), after the first step's
f=$L/ncu_w4a8.txt
# decode's instances only: the split GEMM (EPILOGUE 4) and the 16-row tiles (the prefill of the context runs 32- and
# 64-row tiles)
timeout 200 ncu --kernel-name-base demangled --kernel-name 'regex:w4a8_wgmma_kernel<(\(int\)4,|\(int\)[01], \(int\)0, \(int\)16,)' \
  --launch-skip 8 --launch-count 8 --section SpeedOfLight \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section SchedulerStats $S/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 2048 \
  --presets fp8 --backend cuda --kv-cache e4m3 --steps 4 --route decode.graphs=off,$R > $f 2>&1
echo "== ncu w4a8 rc $? $SECONDS s"
grep -E "w4a8_wgmma_kernel|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Limit Shared|Waves Per SM|Eligible Warps|Issued Warp|No Eligible|L2 Hit|Mem Busy|Max Bandwidth|Dynamic Shared" $f | sed -e 's/  */ /g' | cut -c1-120 | head -140
# (3) SASS source pages: the split kernel (EPILOGUE 4) and the expert gate|up kernel
for k in split gateup; do
  left 80 || break
  case $k in split) rx='w4a8_wgmma_kernel<\(int\)4,'; sk=4;; gateup) rx='w4a8_wgmma_kernel<\(int\)1, \(int\)0, \(int\)16,'; sk=1;; esac
  timeout 120 ncu --kernel-name-base demangled --kernel-name "regex:$rx" --launch-skip $sk --launch-count 1 \
    --section SourceCounters --section WarpStateStats --import-source yes -o $L/src_$k -f $S/fp8moe-bench decode \
    --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 2048 --presets fp8 --backend cuda --kv-cache e4m3 \
    --steps 4 --route decode.graphs=off,$R > $L/src_${k}_collect.txt 2>&1
  echo "== ncu source $k collect rc $? $SECONDS s"; grep -E "w4a8_wgmma_kernel|Duration|Stall" $L/src_${k}_collect.txt | head -8 | cut -c1-160
  timeout 60 ncu -i $L/src_$k.ncu-rep --page source --print-source sass --csv > $L/src_${k}_sass.csv 2>&1
  echo "== sass $k rc $? $(wc -l < $L/src_${k}_sass.csv) lines"
done
# (4) the expert GEMM alone by its routes
for rr in "w4a8.codes=smem" "w4a8.codes=regs" "w4a8.tile=32"; do
  left 45 || break
  f=$L/moe_${rr//[.=]/_}.log
  timeout 90 $S/fp8moe-bench moe --shape qwen3 --tokens 16,64 --routes fp8-grouped,fp8-grouped-token,fp8-fold \
    --route $rr > $f 2>&1
  echo "== moe $rr rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-130
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
