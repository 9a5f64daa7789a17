#!/bin/bash
# session 29, call 2 (the same pack; the machine keeps build/ while warm): every other GPU test program 10 at a
# time, the prefix cache with paged.tiled on (the default since 332f2fc) and off, the generation test under the down
# GEMV's fused forms (their own instantiation since b8e3743), racecheck of the fold GEMM (per-group release) and of
# the tiled paged kernel's op test, synccheck of the fold GEMM
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s29.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs2; mkdir -p $L
export OMP_NUM_THREADS=2 T L OUT
cat > /tmp/jobs <<'J'
ep|200||$T/test_cuda_ep
pdl|200||$T/test_cuda_pdl
fold|200||$T/test_cuda_fold
rcf_fold|300||compute-sanitizer --tool racecheck --error-exitcode 3 $T/test_cuda_fold
sc_fold|300||compute-sanitizer --tool synccheck --error-exitcode 3 $T/test_cuda_fold
rc_paged_chunks|300|test_paged_chunks|compute-sanitizer --tool racecheck --error-exitcode 3 $T/test_cuda_ops
prefix|200||$T/test_cuda_prefix_cache
prefix_split|200||$T/test_cuda_prefix_cache --route paged.tiled=off
mixed|200||$T/test_cuda_mixed_steps
generate|200||$T/test_cuda_generate
generate_fused|200||$T/test_cuda_generate --route moe.down_quant=fused,moe.combine=fused,decode.fused=on
fold_gemv|200||$T/test_cuda_fold_gemv
shared|200||$T/test_cuda_shared_routing
shared_rf|200||$T/test_cuda_shared_routing --route router.fused=on
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
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]|Race reported|request .* token" $L/*.log | head -20
