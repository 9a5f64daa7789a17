#!/bin/bash
# the default step budget (latency, R = 1.5, W = 40) against --step-budget fixed, each workload, one server a row
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s38b.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
row() { # budget args..., then -- client args
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > /tmp/s.log 2>&1
  echo "== ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"; grep -E '^\||^steps' /tmp/s.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row --step-budget fixed -- "${ARR[@]}"
row -- "${ARR[@]}"
row --step-budget fixed -- "${LOAD[@]}"
row -- "${LOAD[@]}"
