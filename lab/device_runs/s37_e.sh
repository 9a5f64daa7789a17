#!/bin/bash
# the latency budget with the prompts' turn (the whole budget while more prompts wait than sequences decode): the
# 64-client load of 1,800-token prompts under fixed and latency R = 1.5, and the arrivals row under latency R = 1.5
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37e.tar.xz || exit 1
row() { # budget args..., then -- client args
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 150 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > /tmp/s.log 2>&1
  echo "== ${b[*]} | $* rc $?"; grep -E '^\||^steps' /tmp/s.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
row --step-budget fixed -- --clients 64 --prompt-tokens 1800 --max-tokens 256
row --step-budget latency --max-step-latency-ratio 1.5 -- --clients 64 --prompt-tokens 1800 --max-tokens 256
row --step-budget latency --max-step-latency-ratio 1.5 -- --clients 8 --workload arrivals --prompt-tokens 128 \
  --max-tokens 1024 --probe-prompt-tokens 1800
