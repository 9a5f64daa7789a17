#!/bin/bash
# the prompt wait, a second round: the arrivals row twice under latency R = 1.5 with W = 40 (the default) and 20,
# then the 64-client load once more with each (s38_a.sh has the first round and the fixed rows)
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s38.tar.xz || exit 1
row() { # budget args..., then -- client args
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > /tmp/s.log 2>&1
  echo "== ${b[*]} | $* rc $? $((SECONDS - t0)) s"; grep -E '^\||^steps' /tmp/s.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
  cp /tmp/s.log "$OUT/row_$((++n)).log"
}
n=0
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
for r in 1 2; do
  row --step-budget latency --max-step-latency-ratio 1.5 -- "${ARR[@]}"
  row --step-budget latency --max-step-latency-ratio 1.5 --max-prompt-wait-steps 20 -- "${ARR[@]}"
done
row --step-budget latency --max-step-latency-ratio 1.5 -- "${LOAD[@]}"
row --step-budget latency --max-step-latency-ratio 1.5 --max-prompt-wait-steps 20 -- "${LOAD[@]}"
row --step-budget fixed -- "${ARR[@]}"
