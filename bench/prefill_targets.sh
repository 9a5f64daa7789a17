#!/usr/bin/env bash
# Every figure of the prefill speed targets in one run (docs/RESULTS.md 2.9): the 48-layer Qwen3-30B-A3B prefill
# (fp8 + --dense w8a8 and plain fp8 at T = 2048, the first at T = 8192), the 32-layer Mixtral-8x7B prefill, one MoE
# layer's experts (ours and cuBLASLt's FP8 loop), the 96 dense projections' GEMM (ours and cuBLASLt FP8), and the
# prefill attention (lab/attention: the wgmma kernels and the mma.sync engine). Builds first; each command's output
# goes to $OUT/targets.log, its stderr to $OUT/targets.err; the summary lines are printed last.
# Usage (device tool): source .carry/env.sh; bench/prefill_targets.sh
set -u
out=${OUT:-/tmp}
arch=${CUDA_ARCHS:--gencode=arch=compute_90a,code=sm_90a}
make -j"$(nproc)" CUDA_ARCHS="$arch" build/fp8moe build/fp8moe-bench >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
make -C lab -j"$(nproc)" CUDA_ARCHS="$arch" attention >>"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
b=./build/fp8moe
P="$b bench prefill --backend cuda --repeat 5 --warmup 2 --synthetic qwen3-30b-a3b --layers 48 --preset fp8"
L="$out/targets.log"
{
echo "## prefill qwen3 T=2048 fp8+w8a8"; $P --dense w8a8 --tokens 2048
echo "## prefill qwen3 T=2048 fp8"; $P --tokens 2048
echo "## prefill qwen3 T=8192 fp8+w8a8"; $P --dense w8a8 --tokens 8192
echo "## prefill mixtral T=2048 fp8+w8a8"
$b bench prefill --backend cuda --repeat 3 --warmup 1 --synthetic mixtral-8x7b --layers 32 --preset fp8 --dense w8a8 \
    --tokens 2048
echo "## moe qwen3"; $b bench moe --shape qwen3 --tokens 16,512,2048,8192 --routes fp8-grouped,fp8-cublaslt-loop --repeat 10
echo "## moe mixtral"; $b bench moe --shape mixtral --tokens 512,2048,4096 --routes fp8-grouped,fp8-cublaslt-loop --repeat 10
echo "## gemm"; $b bench gemm --rows 2048 --routes w4a8-gemm,fp8-cublaslt-tensor,fp8-cublaslt-row --repeat 20
echo "## attention"; ./build/lab/attention --wgmma
} >"$L" 2>"$out/targets.err"
grep -E "^## |^latency|^\| (attention|routing|experts|other) |^\| (fp8|w4a8)[^|]*\| *[0-9]+ \||^(engine|wgmma \()[^=]*T=(2048|8192) .*ms" "$L"
