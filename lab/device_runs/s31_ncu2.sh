#!/bin/bash
# source-level (CUDA lines) stall samples of the fused router and the QKV GEMV at B = 1 (fp8, no graph)
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s30.tar.xz || exit 1
for k in router_fused w4a8_gemv_kernel; do
timeout 200 ncu --clock-control none --cache-control none --section SourceCounters --section WarpStateStats \
  --import-source yes -k regex:$k --launch-skip 8 --launch-count 1 -o /tmp/p_$k \
  build/base/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --steps 1 --warmup 0 \
  --presets fp8 --backend cuda --route decode.graphs=off > $OUT/run_$k.log 2>&1; echo "$k rc $?"
ncu -i /tmp/p_$k.ncu-rep --page source --csv --print-source cuda > $OUT/src_$k.csv 2>&1
ncu -i /tmp/p_$k.ncu-rep --page details --csv --print-details all > $OUT/det_$k.csv 2>&1
ls -la $OUT/src_$k.csv
done
