#!/bin/bash
# the thirty-sixth session's first call: mixed steps as CUDA graphs (route mixed.graphs, on by default in this tree):
# (1) the GPU tests of the scheduler's paths, (2) the mixed-step bench with the route on and off beside decode steps,
# (3) the serving rows of 2.26 with the route on and off
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s39.tar.xz || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
L=$OUT/logs; mkdir -p $L
for t in test_cuda_mixed_steps test_cuda_generate; do
  timeout 240 build/tests/gpu/$t > $L/$t.log 2>&1; echo "== $t rc $?"
  grep -hE "^\[  FAILED|ERROR:|Aborted|passes replayed" $L/$t.log | cut -c1-230 | head -8
done
D="decode --synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8+w8a8 --backend cuda"
for r in 1 2; do
  build/fp8moe-bench $D > $L/dec_$r.log 2>&1; echo "== decode B 8 round $r rc $?"; grep -E "^\| fp8" $L/dec_$r.log | head -1
  for g in on off; do
    build/fp8moe-bench $D --prompt-rows 64 --route mixed.graphs=$g > $L/mix_${g}_$r.log 2>&1
    echo "== mixed B 8 + 64 mixed.graphs=$g round $r rc $?"; grep -E "^\| fp8|rror" $L/mix_${g}_$r.log | head -1
  done
done
build/fp8moe-bench $D --prompt-rows 64 --per-op > $L/mix_op.log 2>&1; echo "== mixed per-op rc $?"
row() { # server args..., then -- client args
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > /tmp/s.log 2>&1
  echo "== ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"; grep -E '^\||^steps' /tmp/s.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row --route mixed.graphs=off -- "${ARR[@]}"
row -- "${ARR[@]}"
row --route mixed.graphs=off -- "${LOAD[@]}"
row -- "${LOAD[@]}"
