#!/bin/bash
# thirty-second session, last call (~200 s): the final commit's e4m3 paged op test, then the 64-client serving load
# (tools/gpu-measure.sh's serve-kv row: 1,800-token prompts, 256 new tokens, fp8 + w8a8) with each KV cache, one
# round, 20 s a row
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s35d.tar.xz || exit 1
t0=$SECONDS
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_paged_e4m3 timeout 100 build/tests/gpu/test_cuda_ops > $OUT/ops_e4m3.log 2>&1
echo "ops e4m3 rc $? $((SECONDS-t0)) s"; grep -hE "^\[  FAILED|^\[  PASSED" $OUT/ops_e4m3.log
for kv in auto e4m3; do
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 75 bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda \
    --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256 --kv-cache $kv -- --vocab 4096 \
    --clients 64 --prompt-tokens 1800 --max-tokens 256 --duration 20 > $OUT/serve_$kv.log 2>&1
  echo "serve $kv rc $? $((SECONDS-t0)) s"; grep -E "^\|" $OUT/serve_$kv.log | tail -1
done
