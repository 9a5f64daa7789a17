#!/bin/bash
# the split kernel against the swapped one (paged.swap on, x2) at B = 64 on the e4m3 cache under ncu: where their
# warps stall (run after s46_a/s46_b on the same warm machine; carry .carry/env.sh and .carry/gpu-s46b.tar.xz)
[ -x sw/build/new/fp8moe-bench ] || { mkdir -p sw && tar -xJf .carry/gpu-s46b.tar.xz -C sw; } || exit 1
for r in off on x2; do
  k=aps_kernel; [ $r = off ] && k=apg_split_kernel
  timeout 150 ncu --kernel-name regex:$k --launch-skip 4 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SchedulerStats sw/build/new/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 \
    --context 2048 --presets fp8 --backend cuda --kv-cache e4m3 --route decode.graphs=off,paged.swap=$r \
    > $OUT/ncu_$r.txt 2>&1
  echo "$r rc $?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Achieved Occupancy|Registers Per|Block Limit|Issued Ipc|Eligible Warps|Waves Per SM|Theoretical Occ|No Eligible|One or More" $OUT/ncu_$r.txt | head -30
done
