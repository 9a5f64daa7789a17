#!/bin/bash
# forty-fourth session: every kernel of a B = 8 and a B = 1 decode step (2 layers) with its duration, its warp
# instructions and its stall reasons per issued instruction (no instruction: the instruction cache; long
# scoreboard; barrier; wait), to find the kernels that, like route_warp_kernel, wait for instructions. The binary of
# .carry/gpu-s48g.tar.xz. Carry .carry/env.sh, .carry/debs, .carry/gpu-s48g.tar.xz.
set -u
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s48g && tar -xJf .carry/gpu-s48g.tar.xz -C s48g || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio
for r in no_instruction long_scoreboard barrier wait short_scoreboard membar; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for bb in 8 1; do
  f=$L/ncu_stalls_$bb.csv
  timeout 200 ncu --metrics $M --cache-control none --clock-control none --csv s48g/build/new/fp8moe-bench decode \
    --synthetic qwen3-30b-a3b --layers 2 --batch $bb --context 256 --presets fp8 --backend cuda --warmup 1 --steps 2 \
    --route decode.graphs=off,w4a8.gemv_max_m=16,w4a8.splits=fill > $f 2>&1
  echo "== ncu B=$bb rc $? $SECONDS s $(wc -l < $f) lines"
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
