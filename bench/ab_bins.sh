#!/usr/bin/env bash
# A/B of whole binaries in one run on one GPU: times one Qwen3 MoE layer with each binary in turn, twice over
# (A B A B), so that every comparison is within one run and one machine. Carry the older binary (for example
# `mkdir -p .carry/ab && cp build/fp8moe .carry/ab/fp8moe_old` before rebuilding), then on the GPU machine:
#   source .carry/env.sh; bench/ab_bins.sh .carry/ab/fp8moe_old build/fp8moe [routes] [tokens]
set -uo pipefail
a=$1 b=$2 routes=${3:-fp8-grouped} tokens=${4:-16,512,2048,8192}
for bin in "$a" "$b" "$a" "$b"; do
  echo "== $bin"
  timeout 300 "$bin" bench moe --shape qwen3 --tokens "$tokens" --routes "$routes" --repeat 10 2>/dev/null | grep -E "^\| (bf16|fp8|int4)"
done
