#!/bin/bash
# thirtieth session, call 2 of 2 (the same packs as s33_a1.sh, and gpu-s33-ops.tar.xz): every other GPU test program
# 10 at a time, the model-level ones again with moe.act_scale=token (prompts on the grouped GEMM: greedy against
# transformers' on the golden models), the token GEMM's small cases under forced tiles and moe.gemv=off, 3e9ee89's
# test_cuda_ops under w4a8.kernel=mma (the mma.sync kernel's token instances); then decode round 2, Qwen3-Next base
# / new, bench moe round 2 and Mixtral
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
[ -x build/wt/test_cuda_ops ] || tar -xJf .carry/gpu-s33-ops.tar.xz || exit 1 # 3e9ee89's: token on mma.sync too
T=./build/tests/gpu; L=/tmp/logs2; mkdir -p $L
export OMP_NUM_THREADS=2 T L OUT
cat > /tmp/jobs <<'J'
generate|200||$T/test_cuda_generate
models|200||$T/test_cuda_models
qnext|200||$T/test_cuda_qnext
graph|200||$T/test_cuda_graph
prefix|200||$T/test_cuda_prefix_cache
shared|200||$T/test_cuda_shared_routing
prequant_models|200||$T/test_cuda_prequant_models
ep|200||$T/test_cuda_ep
pdl|200||$T/test_cuda_pdl
fold|200||$T/test_cuda_fold
mixed|200||$T/test_cuda_mixed_steps
fold_gemv|200||$T/test_cuda_fold_gemv
warmup|200||$T/test_cuda_warmup
mask|200||$T/test_cuda_mask_overlap
prequant|200||$T/test_cuda_prequant
requant|200||$T/test_cuda_requantized
sampler|200||$T/test_cuda_sampler
offload|200||$T/test_cuda_offload
debug|200||$T/test_cuda_debug
tp|200||$T/test_cuda_tp
cublaslt|200||$T/test_cuda_moe_cublaslt
generate_tok|200||$T/test_cuda_generate --route moe.act_scale=token
models_tok|200||$T/test_cuda_models --route moe.act_scale=token
graph_tok|200||$T/test_cuda_graph --route moe.act_scale=token
tok_tile16|200|test_moe_w4a8_token*|$T/test_cuda_ops --route w4a8.tile=16
tok_tile32|200|test_moe_w4a8_token*|$T/test_cuda_ops --route w4a8.tile=32
tok_tile64|200|test_moe_w4a8_token*|$T/test_cuda_ops --route w4a8.tile=64
tok_gemv_off|200|test_moe_w4a8_token*|$T/test_cuda_ops --route moe.gemv=off
tok_mma|300|test_moe_*token*|./build/wt/test_cuda_ops --route w4a8.kernel=mma
J
job() { IFS='|' read -r n lim f cmd <<< "$1"; local s=$SECONDS
  FM_TEST_FILTER="${f:-*}" eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s" | tee -a $OUT/tests.txt; }
export -f job
timeout 330 xargs -d '\n' -P 10 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
tar -czf $OUT/logs2.tgz -C /tmp logs2
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]" $L/*.log | head -20
grep -hE "skipped" $L/tok_*.log | head -3
t0=$SECONDS; B=/tmp/logsb; mkdir -p $B
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $B/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $B/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow base_r2 build/base/fp8moe-bench "${c[@]}"; drow new_r2 build/fp8moe-bench "${c[@]}"
drow tok_r2 build/fp8moe-bench "${c[@]}" --route moe.act_scale=token
drow qbase_r1 build/base/fp8moe-bench "${q[@]}"; drow qnew_r1 build/fp8moe-bench "${q[@]}"
timeout 90 build/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token --tokens 16,512,2048,8192 \
  --repeat 20 --backend cuda > $B/moe_r2.log 2>&1; echo "moe r2 rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_r2.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
timeout 80 build/fp8moe-bench moe --shape mixtral --routes fp8-grouped,fp8-grouped-token --tokens 512,4096 --repeat 10 \
  --backend cuda > $B/moe_mixtral.log 2>&1; echo "moe mixtral rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_mixtral.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
cp $B/*.log $OUT/ 2>/dev/null
