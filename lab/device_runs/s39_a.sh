#!/bin/bash
# the thirty-sixth session's device call: mixed steps as CUDA graphs (route mixed.graphs, on by default in this tree):
# (1) test_cuda_mixed_steps, (2) the mixed-step bench with the route on and off beside decode steps, (3) the serving
# rows of 2.26 with the route on and off, (4) variants 10 / 11 of the expert GEMM's ceiling, (5) test_cuda_generate
# in the time left (the call's limit is 600 s)
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s39.tar.xz || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
L=$OUT/logs; mkdir -p $L
t=test_cuda_mixed_steps; timeout 150 build/tests/gpu/$t > $L/$t.log 2>&1; echo "== $t rc $? $SECONDS s"
grep -hE "^\[  FAILED|ERROR:|Aborted|passes replayed|mixed steps run without" $L/$t.log | cut -c1-230 | head -8
D="decode --synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8+w8a8 --backend cuda"
build/fp8moe-bench $D > $L/dec.log 2>&1; echo "== decode B 8 rc $?"; grep -E "^\| fp8" $L/dec.log | head -1
for r in 1 2; do
  for g in on off; do
    build/fp8moe-bench $D --prompt-rows 64 --route mixed.graphs=$g > $L/mix_${g}_$r.log 2>&1
    echo "== mixed B 8 + 64 mixed.graphs=$g round $r rc $?"; grep -E "^\| fp8|rror|without CUDA" $L/mix_${g}_$r.log | head -2
  done
done
echo "== $SECONDS s"
row() { # server args..., then -- client args
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > $L/serve_$1_$t0.log 2>&1
  echo "== ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"
  grep -E '^\||^steps|without CUDA' $L/serve_$1_$t0.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row --route mixed.graphs=off -- "${ARR[@]}"
row -- "${ARR[@]}"
row --route mixed.graphs=off -- "${LOAD[@]}"
row -- "${LOAD[@]}"
echo "== $SECONDS s"
if [ -f .carry/gpu-pipe4.tar.xz ] && [ $SECONDS -lt 330 ]; then
  tar -xJf .carry/gpu-pipe4.tar.xz
  PIPE_VARIANTS="base 4 7 10 11" PIPE_TILE="auto 64" PIPE_ROUNDS=1 sh lab/w4a8_pipe_ceiling.sh run \
      build/pipebase/fp8moe-bench build/pipe/fp8moe-bench > $L/pipe.log 2>&1
  grep -E "^==|^\| fp8|exit|skipped" $L/pipe.log | cut -c1-150
fi
left=$((570 - SECONDS)); echo "== $SECONDS s, $left s left"
if [ $left -gt 30 ]; then
  t=test_cuda_generate; timeout $left build/tests/gpu/$t > $L/$t.log 2>&1; echo "== $t rc $?"
  grep -hE "^\[  FAILED|^\[  PASSED|ERROR:|Aborted" $L/$t.log | cut -c1-230 | head -8
fi
