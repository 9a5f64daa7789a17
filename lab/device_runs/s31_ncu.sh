#!/bin/bash
# session 29 (s31 scripts), call: ncu with source counters of the decode GEMVs and the fused router at B = 1 (fp8,
# no graph), b5c95b4's bench (build/base): where the in-kernel time goes beyond the read floor (lab/read_floor.cu)
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s30.tar.xz || exit 1
t0=$SECONDS
timeout 400 ncu --clock-control none --cache-control none --set full --import-source yes \
  -k regex:"router_fused|w4a8_gemv_kernel" --launch-skip 10 --launch-count 10 -o /tmp/prof \
  build/base/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --steps 1 --warmup 0 \
  --presets fp8 --backend cuda --route decode.graphs=off > $OUT/ncu_run.log 2>&1
echo "ncu rc $? $((SECONDS-t0)) s"; tail -3 $OUT/ncu_run.log
ncu -i /tmp/prof.ncu-rep --page details --csv > $OUT/details.csv 2>&1; echo "details rc $?"
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $OUT/source_sass.csv 2>&1; echo "source rc $?"
ncu -i /tmp/prof.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,smsp__average_warp_latency_issue_stalled_long_scoreboard > $OUT/raw.csv 2>&1
ls -la $OUT; cut -c1-200 $OUT/raw.csv | head -14
