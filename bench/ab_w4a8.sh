#!/usr/bin/env bash
# A/B of W4A8 kernel versions in one run on one GPU: builds each lab/w4a8_gemm_V.cu in place of the current
# kernel, in a copy of the sources (the tracked src/backend/cuda/w4a8_gemm.cu is never written), into build/ab-V,
# then times one Qwen3 MoE layer with each binary in turn (the current build first and last), so that every
# comparison is within one run and one machine (kernel timings move between machines and builds more than the
# differences measured). Make the variants here, e.g.
#   git show f2ccc8d:src/backend/cuda/w4a8_gemm.cu > lab/w4a8_gemm_v5.cu
# (lab/w4a8_gemm_*.cu is ignored by git: carry it), then on the GPU machine:
#   source .carry/env.sh; bench/ab_w4a8.sh v5 [v6 ...]
set -uo pipefail
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -j"$(nproc)" all >/dev/null 2>&1 || echo "build of the current sources failed"
for v in "$@"; do
  src="$tmp/$v"
  mkdir -p "$src" "build/ab-$v"
  cp -r Makefile include src bench "$src"/
  # a variant is a whole w4a8_gemm.cu (all three kernels, as before the file was split by kernel): the copy drops
  # the split kernel files
  rm -f "$src"/src/backend/cuda/w4a8_gemm_{mma,wgmma,fp4}.cu
  cp "lab/w4a8_gemm_$v.cu" "$src/src/backend/cuda/w4a8_gemm.cu"
  if make -C "$src" -j"$(nproc)" all >/dev/null 2>&1; then cp "$src/build/fp8moe" "$src/build/fp8moe-bench" "$root/build/ab-$v/"
  else echo "build $v failed"; fi
done
for bin in build/fp8moe $(for v in "$@"; do echo "build/ab-$v/fp8moe"; done) build/fp8moe; do
  echo "== $bin"
  "$bin" bench moe --shape qwen3 --tokens 16,2048,8192 --routes bf16-cublas,fp8-grouped --repeat 10 2>/dev/null | grep -E "^\| (bf16|fp8)"
done
