#!/bin/bash
# fortieth session: issue 41's rows on the H200 (any card works; the rows say which). Pack .carry/gpu-s43b.tar.xz
# (`BASE=b5c95b4 BASE_PROGRAMS="fp8moe fp8moe-bench" OUT=.carry/gpu-s43b.tar.xz tools/gpu-pack-ab.sh fp8moe
# fp8moe-bench`): build/ holds b5c95b4 (RESULTS 2.18's H200 "new"), build/new/ main. Decode B = 1 / 8 / 64 of both
# (both presets), Qwen3-Next B = 1 of both, then the serving rows of main (arrivals and 64 clients, default budget
# and fixed), one round each, within LIMIT seconds.
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
tar -xJf .carry/gpu-s43b.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for d in build build/new; do
  f=$L/dec_${d//\//_}.log
  timeout 120 $d/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 \
    --backend cuda --steps 32 > $f 2>&1; echo "== decode $d rc $? $SECONDS s"; grep -E "^\| (fp8|preset)" $f | head -8
done
for d in build build/new; do
  f=$L/next_${d//\//_}.log
  timeout 90 $d/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --batch 1 --context 2048 --presets fp8+w8a8 \
    --backend cuda --steps 32 > $f 2>&1; echo "== next $d rc $? $SECONDS s"; grep -E "^\| fp8" $f | head -2
done
row() { # server args..., then -- client args
  [ $((SECONDS + 90)) -gt $LIMIT ] && { echo "== skipped (time): $*"; return; }
  local b=(); while [ "$1" != "--" ]; do b+=("$1"); shift; done; shift
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/new/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b \
    --backend cuda --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 "${b[@]}" -- \
    --vocab 4096 "$@" --duration 20 > $L/serve_$t0.log 2>&1
  echo "== ${b[*]:-default} | $* rc $? $((SECONDS - t0)) s"
  grep -E '^\||^steps|without CUDA' $L/serve_$t0.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -3
}
LOAD=(--clients 64 --prompt-tokens 1800 --max-tokens 256)
ARR=(--clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800)
row -- "${ARR[@]}"
row -- "${LOAD[@]}"
row --step-budget fixed -- "${ARR[@]}"
row --step-budget fixed -- "${LOAD[@]}"
echo "== $SECONDS s"
