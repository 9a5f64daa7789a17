#!/usr/bin/env bash
# Same-run A/B of the decode GEMVs (bench gemm, Qwen3-30B-A3B attention projections x 48 layers): the prefetching
# GEMVs (gemv_fp8_prefetch.cu, default on sm_90) against the register GEMVs (FP8MOE_GEMV_PREFETCH=0), twice over
# (A B A B), with the W8A8 GEMV allowed up to 16 rows so that its M = 16 row can be compared with cuBLASLt's.
# On the GPU machine: source .carry/env.sh; ROWS=1,8,16 bench/gemv_ab.sh [build/fp8moe]
set -uo pipefail
bin=${1:-build/fp8moe} rows=${ROWS:-1,8,16} routes=${ROUTES:-fp8-cublaslt-tensor,w8a8-gemm,w8a8,w4a8-gemm,w4a8}
for round in 1 2; do
  for prefetch in 1 0; do
    echo "== FP8MOE_GEMV_PREFETCH=$prefetch (round $round)"
    FP8MOE_GEMV_PREFETCH=$prefetch FP8MOE_W8A8_GEMV_MAX_M=16 timeout 300 "$bin" bench gemm --rows "$rows" \
      --routes "$routes" --repeat 30 2>/dev/null | grep -E "^\| (fp8|w8a8|w4a8|bf16|route)"
  done
done
