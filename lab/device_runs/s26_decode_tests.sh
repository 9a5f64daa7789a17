#!/bin/bash
# session 26, device call A (one pack: fp8moe + GPU tests of ec4db55's src, base 8474e61 in build/base):
# decode base / new (PDL released after the wait) two rounds with the route rows, Qwen3-Next base / new / routed, then
# the short GPU tests 10 at a time (the long op programs left to call B)
set -u
tar -xJf .carry/gpu-all-s26.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; L=/tmp/logsA; mkdir -p $L
LIMIT=${LIMIT:-560}
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
drow() { # label binary args...: one bench decode, its rows to $OUT/decode_rows.txt at once
  local l=$1 b=$2; shift 2
  timeout 40 $b bench decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do
  drow base_r$r build/base/fp8moe "${c[@]}"
  drow new_r$r build/fp8moe "${c[@]}"
  drow waves_r$r build/fp8moe "${c[@]}" --route paged.splits=waves
  drow nopdl_r$r build/fp8moe "${c[@]}" --route pdl=off
  [ $r = 1 ] && drow moetail_r1 build/fp8moe "${c[@]}" --route moe.down_quant=fused --route moe.combine=fused --route decode.fused=on
  [ $r = 1 ] && drow rdisp_r1 build/fp8moe "${c[@]}" --route moe.dispatch=fused --route decode.fused=on
done
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
for r in 1 2; do
  drow qbase_r$r build/base/fp8moe "${q[@]}"
  drow qnew_r$r build/fp8moe "${q[@]}"
  drow qrouted_r$r build/fp8moe "${q[@]}" --route moe.shared=routed
done
timeout 40 build/fp8moe bench decode "${c[@]}" --presets fp8 --batch 1,64 --per-op > $OUT/per_op_new.txt 2>&1
timeout 40 build/fp8moe bench decode "${c[@]}" --presets fp8 --batch 64 --per-op --route paged.splits=waves > $OUT/per_op_waves.txt 2>&1
echo "decode done $((SECONDS-t0)) s"
T=./build/tests/gpu
export OMP_NUM_THREADS=2 T L OUT
cat > /tmp/jobs <<'J'
pdl|120||$T/test_cuda_pdl
fold|120||$T/test_cuda_fold
prefix|120||$T/test_cuda_prefix_cache
prefix_tiled|120||$T/test_cuda_prefix_cache --route paged.tiled=on
mixed|120||$T/test_cuda_mixed_steps
generate|120||$T/test_cuda_generate
generate_waves|120||$T/test_cuda_generate --route paged.splits=waves
generate_tail|120||$T/test_cuda_generate --route decode.fused=on,moe.down_quant=fused,moe.combine=fused
fold_gemv|120||$T/test_cuda_fold_gemv
shared|120||$T/test_cuda_shared_routing
qnext|120||$T/test_cuda_qnext
qnext_tcoff|120||$T/test_cuda_qnext --route gdn.tc=off
graph|120||$T/test_cuda_graph
warmup|120||$T/test_cuda_warmup
mask|120||$T/test_cuda_mask_overlap
prequant|120||$T/test_cuda_prequant
prequant_models|120||$T/test_cuda_prequant_models
requant|120||$T/test_cuda_requantized
models|120||$T/test_cuda_models
sampler|120||$T/test_cuda_sampler
offload|120||$T/test_cuda_offload
debug|120||$T/test_cuda_debug
tp|120||$T/test_cuda_tp
cublaslt|120||$T/test_cuda_moe_cublaslt
memory|120||$T/test_cuda_memory
mc_qnext|120|test_gdn_*|compute-sanitizer --tool memcheck --error-exitcode 3 $T/test_cuda_qnext
rcf_fold|120||compute-sanitizer --tool racecheck --error-exitcode 3 $T/test_cuda_fold
J
job() { IFS='|' read -r n lim f cmd <<< "$1"; local s=$SECONDS
  FM_TEST_FILTER="${f:-*}" eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s" | tee -a $OUT/tests.txt; }
export -f job
left=$((LIMIT - 15 - SECONDS)); [ $left -gt 200 ] && left=200; [ $left -lt 20 ] && left=20
timeout $left xargs -d '\n' -P 10 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
echo "tests $((SECONDS-t0)) s"
tar -czf $OUT/logsA.tgz -C /tmp logsA
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]|Race reported" $L/*.log | head -20
