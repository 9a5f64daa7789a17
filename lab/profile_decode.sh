#!/usr/bin/env bash
# Per-kernel device time of one decode step (ncu, no graph) at B = 1, 8, 64 for fp8 + w8a8: where a step goes.
# Usage on the GPU machine: lab/profile_decode.sh [BIN] (default build/fp8moe); logs under $OUT (or /tmp).
BIN=${1:-build/fp8moe}; OUT=${OUT:-/tmp}
for B in 1 8 64; do
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_b$B.csv \
    $BIN bench decode --synthetic qwen3-30b-a3b --batch $B --context 2048 --steps 1 --warmup 0 --presets fp8+w8a8 --route decode.graphs=off > $OUT/bench_b$B.txt 2>&1
  echo "== B=$B rc $?"; tail -3 $OUT/bench_b$B.txt
  python3 lab/ncu_kernels.py $OUT/ncu_b$B.csv > $OUT/kernels_b$B.txt; cat $OUT/kernels_b$B.txt | head -30
done
