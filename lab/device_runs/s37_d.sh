#!/bin/bash
# issue 41's arrivals target (the 8 streams' ITL p99 <= 2x p50 while 1,800-token prompts arrive): the step budget
# fixed against latency at R = 2, 1.5 and 1.25, 20 s a row, one server each, the c90fb55 pack
set -u
source .carry/env.sh
[ -x build/fp8moe ] || tar -xJf .carry/gpu-s37a.tar.xz || exit 1
for b in "fixed" "latency 2" "latency 1.5" "latency 1.25"; do
  set -- $b
  extra=(--step-budget $1); [ $# -gt 1 ] && extra+=(--max-step-latency-ratio $2)
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 150 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${extra[@]}" -- --vocab 4096 \
    --clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800 --duration 20 \
    > /tmp/s.log 2>&1
  echo "== $b rc $?"; grep -E '^\||^steps' /tmp/s.log | grep -vE '^\|---' | cut -c1-260 | tail -6
done
