#!/bin/bash
# forty-sixth session: serving 64 clients (1,800-token prompts, 256 new) and 8 streams while 1,800-token prompts
# arrive, fp8 (W4A8 dense: the q|k|v rows quantized by the MoE block's end), base 269c61a against new 763a42d, one
# round a row. Pack `BASE=269c61a BASE_PROGRAMS=fp8moe OUT=.carry/gpu-s51b.tar.xz tools/gpu-pack-ab.sh fp8moe`.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s51b.tar.xz.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
tar -xJf .carry/gpu-s51b.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
L=$OUT/logs; mkdir -p $L
row() { # binary dir, server args..., then -- client args
  local d=$1; shift
  [ $((SECONDS + 90)) -gt $LIMIT ] && { echo "== skipped (time): $d $*"; return; }
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=$d/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b \
    --backend cuda --preset fp8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- \
    --vocab 4096 "$@" --duration 20 > $L/serve_$t0.log 2>&1
  echo "== $d ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"
  grep -E '^\||^steps|without CUDA' $L/serve_$t0.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row build -- "${LOAD[@]}"
row build/new -- "${LOAD[@]}"
row build/new -- "${ARR[@]}"
row build -- "${ARR[@]}"
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
