#!/bin/bash
# session 30, call 2 (the same pack): every other GPU test program 10 at a time, and the model-level ones again under
# gemv.prefetch=on (generation against transformers' golden tokens, the models, Qwen3-Next, graphs, prefix cache)
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s30.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs2; mkdir -p $L
export OMP_NUM_THREADS=2 T L OUT
cat > /tmp/jobs <<'J'
generate_pf|200||$T/test_cuda_generate --route gemv.prefetch=on
models_pf|200||$T/test_cuda_models --route gemv.prefetch=on
qnext_pf|200||$T/test_cuda_qnext --route gemv.prefetch=on
graph_pf|200||$T/test_cuda_graph --route gemv.prefetch=on
prefix_pf|200||$T/test_cuda_prefix_cache --route gemv.prefetch=on
shared_pf|200||$T/test_cuda_shared_routing --route gemv.prefetch=on
prequant_pf|200||$T/test_cuda_prequant_models --route gemv.prefetch=on
ep|200||$T/test_cuda_ep
pdl|200||$T/test_cuda_pdl
fold|200||$T/test_cuda_fold
prefix|200||$T/test_cuda_prefix_cache
mixed|200||$T/test_cuda_mixed_steps
generate|200||$T/test_cuda_generate
fold_gemv|200||$T/test_cuda_fold_gemv
shared|200||$T/test_cuda_shared_routing
qnext|200||$T/test_cuda_qnext
graph|200||$T/test_cuda_graph
warmup|200||$T/test_cuda_warmup
mask|200||$T/test_cuda_mask_overlap
prequant|200||$T/test_cuda_prequant
prequant_models|200||$T/test_cuda_prequant_models
requant|200||$T/test_cuda_requantized
models|200||$T/test_cuda_models
sampler|200||$T/test_cuda_sampler
offload|200||$T/test_cuda_offload
offload_pf|200||$T/test_cuda_offload --route gemv.prefetch=on
debug|200||$T/test_cuda_debug
tp|200||$T/test_cuda_tp
cublaslt|200||$T/test_cuda_moe_cublaslt
J
job() { IFS='|' read -r n lim f cmd <<< "$1"; local s=$SECONDS
  FM_TEST_FILTER="${f:-*}" eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s" | tee -a $OUT/tests.txt; }
export -f job
timeout 560 xargs -d '\n' -P 10 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
tar -czf $OUT/logs2.tgz -C /tmp logs2
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]|request .* token" $L/*.log | head -20
