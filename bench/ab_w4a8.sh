#!/usr/bin/env bash
# A/B of W4A8 kernel versions in one run on one GPU: builds each lab/w4a8_gemm_V.cu in place of the current
# kernel into build/ab-V, then times one Qwen3 MoE layer with each binary in turn (the current build first and
# last), so that every comparison is within one run and one machine (kernel timings move between machines and
# builds more than the differences measured). Make the variants here, e.g.
#   mkdir -p lab && git show f2ccc8d:src/backend/cuda/w4a8_gemm.cu > lab/w4a8_gemm_v5.cu
# (lab/ is ignored: carry it), then on the GPU machine: source .carry/env.sh; bench/ab_w4a8.sh v5 [v6 ...]
set -uo pipefail
cur=src/backend/cuda/w4a8_gemm.cu
cp "$cur" /tmp/w4a8_current.cu
for v in "$@"; do
  cp "lab/w4a8_gemm_$v.cu" "$cur"
  make -j"$(nproc)" BUILD="build/ab-$v" all >/dev/null 2>&1 || echo "build $v failed"
done
cp /tmp/w4a8_current.cu "$cur"
make -j"$(nproc)" all >/dev/null 2>&1
for bin in build/fp8moe $(for v in "$@"; do echo "build/ab-$v/fp8moe"; done) build/fp8moe; do
  echo "== $bin"
  "$bin" bench moe --shape qwen3 --tokens 16,2048,8192 --routes bf16-cublas,fp8-grouped --repeat 10 2>/dev/null | grep -E "^\| (bf16|fp8)"
done
