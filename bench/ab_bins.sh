#!/usr/bin/env bash
# A/B of whole binaries in one run on one GPU: times one Qwen3 MoE layer with each binary in turn, twice over
# (A B .. A B ..), so that every comparison is within one run and one machine. `fp8moe bench` runs the fp8moe-bench
# beside each fp8moe: carry the older pair in a directory of its own (for example
# `mkdir -p .carry/ab/old && cp build/fp8moe build/fp8moe-bench .carry/ab/old/` before rebuilding; xz them if the
# carry is too big), then on the GPU machine:
#   source .carry/env.sh; ROUTES=fp8-grouped TOKENS=16,2048 bench/ab_bins.sh .carry/ab/old/fp8moe build/fp8moe
set -uo pipefail
routes=${ROUTES:-fp8-grouped} tokens=${TOKENS:-16,512,2048,8192} shape=${SHAPE:-qwen3}
for round in 1 2; do
  for bin in "$@"; do
    echo "== $bin (round $round)"
    timeout 300 "$bin" bench moe --shape "$shape" --tokens "$tokens" --routes "$routes" --repeat 10 2>/dev/null |
      grep -E "^\| (bf16|fp8|int4)"
  done
done
