#!/usr/bin/env bash
# Per-kernel device time of one prefill pass (ncu) of the Qwen3-30B-A3B shape, fp8 + w8a8: where the glue goes.
# Usage on the GPU machine: lab/profile_prefill.sh [BIN] [LAYERS] [TOKENS] (default build/fp8moe 2 2048); logs under
# $OUT (or /tmp). The totals by kernel name are per pass: divide by LAYERS for one layer (the embedding, final norm
# and lm_head run once).
BIN=${1:-build/fp8moe}; L=${2:-2}; T=${3:-2048}; OUT=${OUT:-/tmp}
ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_prefill_t$T.csv" \
  "$BIN" bench prefill --synthetic qwen3-30b-a3b --backend cuda --preset fp8 --dense w8a8 --layers "$L" --tokens "$T" \
  --repeat 1 --warmup 0 > "$OUT/bench_prefill_t$T.txt" 2>&1
echo "== prefill L=$L T=$T rc $?"
python3 lab/ncu_kernels.py "$OUT/ncu_prefill_t$T.csv" > "$OUT/kernels_prefill_t$T.txt"; cat "$OUT/kernels_prefill_t$T.txt"
