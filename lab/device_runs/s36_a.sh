#!/bin/bash
# thirty-third session, first call: s35_d.sh (the final commit's e4m3 paged op test and the 64-client serving rows
# with each cache), then per-kernel tables of one decode step at B = 8 and B = 64 (8 layers, fp8, ncu without cache
# flushes or locked clocks): time, grid and DRAM bytes of each kernel, so each one's achieved bandwidth is readable
set -u
source .carry/env.sh
bash lab/device_runs/s35_d.sh
t0=$SECONDS
for B in 8 64; do
  timeout 120 ncu --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --clock-control none --csv build/fp8moe bench decode --synthetic qwen3-30b-a3b --layers 8 --batch $B --context 2048 \
    --presets fp8 --steps 2 --warmup 1 > /tmp/n_$B.csv 2>/dev/null
  echo "ncu B=$B rc $? $((SECONDS-t0)) s"
  xz -c /tmp/n_$B.csv > $OUT/n_$B.csv.xz
  python3 lab/device_runs/ncu_bw.py /tmp/n_$B.csv
done
