#!/bin/bash
# the thirty-seventh session's issue-41 rows on the card at hand (pack .carry/gpu-s39.tar.xz = main's engine since
# eaa44d9): decode B = 1 / 8 / 64 (both presets), Qwen3-Next B = 1, then the serving rows (arrivals and 64 clients)
# with mixed.graphs on / off and the fixed step budget, one round each, within the call's 600 s
set -u
LIMIT=${LIMIT:-560} # the call's limit in s: the rows that would not finish in it are skipped
source .carry/env.sh
tar -xJf .carry/gpu-s39.tar.xz || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
L=$OUT/logs; mkdir -p $L
build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda \
  --steps 32 > $L/dec.log 2>&1; echo "== decode rc $? $SECONDS s"; grep -E "^\| (fp8|preset)" $L/dec.log | head -8
build/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --batch 1 --context 2048 --presets fp8+w8a8 --backend cuda \
  --steps 32 > $L/next.log 2>&1; echo "== next rc $? $SECONDS s"; grep -E "^\| fp8" $L/next.log | head -2
row() { # server args..., then -- client args
  [ $((SECONDS + 90)) -gt $LIMIT ] && { echo "== skipped (time): $*"; return; }
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- --vocab 4096 "$@" \
    --duration 20 > $L/serve_$t0.log 2>&1
  echo "== ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"
  grep -E '^\||^steps|without CUDA' $L/serve_$t0.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row -- "${ARR[@]}"
row --route mixed.graphs=off -- "${ARR[@]}"
row -- "${LOAD[@]}"
row --route mixed.graphs=off -- "${LOAD[@]}"
row --step-budget fixed -- "${ARR[@]}"
row --step-budget fixed -- "${LOAD[@]}"
echo "== $SECONDS s"
