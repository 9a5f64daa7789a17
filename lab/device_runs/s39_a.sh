#!/bin/bash
# the thirty-sixth session's first call: (1) variants 10 / 11 of the expert GEMM's ceiling (a producer warp feeding
# an 8-stage mbarrier ring), (2) the mixed-step bench against decode steps, with and without a graph, (3) on an H200 the serving rows of 2.26
set -u
source .carry/env.sh
tar -xJf .carry/gpu-pipe4.tar.xz || exit 1
tar -xJf .carry/gpu-s39.tar.xz || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
L=$OUT/logs; mkdir -p $L
PIPE_VARIANTS="base 4 7 10 11" PIPE_TILE="auto 64" sh lab/w4a8_pipe_ceiling.sh run build/pipebase/fp8moe-bench \
    build/pipe/fp8moe-bench > $L/pipe.log 2>&1
grep -E "^==|^\| fp8|exit|skipped" $L/pipe.log | cut -c1-150
D="decode --synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8+w8a8 --backend cuda"
for r in 1 2; do
  build/fp8moe-bench $D > $L/dec_$r.log 2>&1; echo "== decode B 8 round $r rc $?"; grep -E "^\| fp8" $L/dec_$r.log | head -3
  build/fp8moe-bench $D --prompt-rows 64 > $L/mix_$r.log 2>&1; echo "== mixed B 8 + 64 round $r rc $?"
  grep -E "^\| fp8" $L/mix_$r.log | head -3
  build/fp8moe-bench $D --prompt-rows 64 --prompt-graph > $L/mixg_$r.log 2>&1; echo "== mixed B 8 + 64 graph round $r rc $?"
  grep -E "^\| fp8|rror" $L/mixg_$r.log | head -3
done
build/fp8moe-bench $D --per-op > $L/dec_op.log 2>&1; echo "== decode per-op rc $?"
build/fp8moe-bench $D --prompt-rows 64 --per-op > $L/mix_op.log 2>&1; echo "== mixed per-op rc $?"
case "$gpu" in *H200*) ;; *) echo "not an H200: no serving rows"; exit 0;; esac
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
