#!/bin/bash
# the persistent MoE block under ncu (one launch at B = 1): duration, stall reasons, the source lines warps wait on;
# then the chain's kernels of one layer (route off) for their durations, both without a graph
set -u
source .carry/env.sh
[ -x build/fp8moe-bench ] || tar -xJf .carry/gpu-s36.tar.xz || exit 1
B="build/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 1 --context 2048 --presets fp8 --backend cuda --route decode.graphs=off"
timeout 200 ncu --kernel-name regex:moe_decode_block --launch-skip 6 --launch-count 1 --set full --import-source no \
  --print-details all $B --route moe.persistent=on > $OUT/ncu_block.txt 2>&1
echo "ncu block rc $?"
grep -E "^    Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Eligible Warps|No Eligible|Issued Warp|Grid Size|Waves Per" $OUT/ncu_block.txt | head -14
grep -E "Stall|stall" $OUT/ncu_block.txt | head -30
timeout 200 ncu --launch-skip 40 --launch-count 20 --metrics gpu__time_duration.sum $B --route moe.persistent=off > $OUT/ncu_chain.txt 2>&1
echo "ncu chain rc $?"
grep -E "^  [a-z_].*\(|gpu__time_duration" $OUT/ncu_chain.txt | paste - - | awk '{print $1, $(NF)}' | head -24
