#!/bin/bash
# the split kernel at B = 64 under ncu, e4m3 and bf16: where its warps stall
[ -x build/fp8moe-bench ] || tar -xJf .carry/gpu-s35.tar.xz || exit 1
for kv in e4m3 auto; do
  timeout 150 ncu --kernel-name regex:apg_split_kernel --launch-skip 4 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SchedulerStats build/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 2048 \
    --presets fp8 --backend cuda --kv-cache $kv --route decode.graphs=off > $OUT/ncu_$kv.txt 2>&1
  echo "$kv rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Achieved Occupancy|Registers Per|Block Limit|Issued Ipc|Eligible Warps|L1/TEX Hit|L2 Hit|Waves Per SM|Theoretical Occ|No Eligible|One or More" $OUT/ncu_$kv.txt | head -40
done
