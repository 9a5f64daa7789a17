#!/bin/bash
# thirty-third session: every GPU test program with moe.persistent on by default at B = 1 (sm_90): test_cuda_memory
# alone, then the rest 10 at a time (the two op programs with 6 threads for their CPU references)
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s36all.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
export T L OUT
s=$SECONDS; timeout 100 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-s)) s"
cat > /tmp/jobs <<'J'
ops|300|6|$T/test_cuda_ops
ops_fused|300|6|$T/test_cuda_ops_fused
generate|200|2|$T/test_cuda_generate
generate_off|200|2|$T/test_cuda_generate --route moe.persistent=off
graph|200|2|$T/test_cuda_graph
models|200|2|$T/test_cuda_models
warmup|200|2|$T/test_cuda_warmup
prefix|200|2|$T/test_cuda_prefix_cache
mixed|200|2|$T/test_cuda_mixed_steps
qnext|200|2|$T/test_cuda_qnext
shared|200|2|$T/test_cuda_shared_routing
sampler|200|2|$T/test_cuda_sampler
offload|200|2|$T/test_cuda_offload
debug|200|2|$T/test_cuda_debug
pdl|200|2|$T/test_cuda_pdl
mask|200|2|$T/test_cuda_mask_overlap
prequant|200|2|$T/test_cuda_prequant
prequant_models|200|2|$T/test_cuda_prequant_models
requant|200|2|$T/test_cuda_requantized
tp|200|2|$T/test_cuda_tp
ep|200|2|$T/test_cuda_ep
cublaslt|200|2|$T/test_cuda_moe_cublaslt
fold|200|2|$T/test_cuda_fold
fold_gemv|200|2|$T/test_cuda_fold_gemv
J
job() { IFS='|' read -r n lim th cmd <<< "$1"; local s=$SECONDS
  OMP_NUM_THREADS=$th eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
export -f job
timeout 430 xargs -d '\n' -P 10 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]|request .* token|fail" $L/*.log | head -20
tar -czf $OUT/logs.tgz -C /tmp logs
