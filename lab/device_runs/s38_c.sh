#!/bin/bash
# the latency budget by default: the GPU tests that run the scheduler (mixed steps against lone runs, generation,
# prefix caching) on this tree, then the serving rows with no step-budget option (the default: latency, R = 1.5, W = 40)
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s38b.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
cat > /tmp/jobs <<'J'
mixed|200|4|$T/test_cuda_mixed_steps
generate|200|4|$T/test_cuda_generate
prefix|200|4|$T/test_cuda_prefix_cache
J
job() { IFS='|' read -r n lim th cmd <<< "$1"; local s=$SECONDS
  OMP_NUM_THREADS=$th eval timeout $lim env $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
export -f job; export T L
timeout 220 xargs -d '\n' -P 3 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR:|Aborted|not implemented" $L/*.log | head -10
grep -hE "budget|PASSED" $L/mixed.log | head -12
cp $L/*.log "$OUT/"
row() { # client args
  local t0=$SECONDS
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 -- --vocab 4096 "$@" \
    --duration 20 > /tmp/s.log 2>&1
  echo "== default | $* rc $? $((SECONDS - t0)) s"; grep -E '^\||^steps|mixed steps of' /tmp/s.log | grep -vE '^\|---|^\| clients' | cut -c1-260 | tail -4
}
row --clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800
row --clients 64 --prompt-tokens 1800 --max-tokens 256
