#!/bin/bash
# thirtieth session, the one call left, short form (ops: the MoE and linear cases only; no Qwen3-Next) (device time lost to failed starts: t1, t2 and b1 merged and cut): test_cuda_ops
# beside test_cuda_ops_fused (the staging without divisions, the one-variant router, moe.act_scale=token's op tests),
# memcheck of the token GEMM's small cases, racecheck of test_router_cluster, generation (greedy against
# transformers) with and without the route, the models test with it, 3e9ee89's token op tests on the mma.sync kernel;
# then decode base / new / new with moe.act_scale=token (one round), Qwen3-Next base / new, bench moe qwen3
# (fp8-grouped, fp8-grouped-token) and the 48-layer prefill with and without the route
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
[ -x build/wt/test_cuda_ops ] || tar -xJf .carry/gpu-s33-ops.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
export OMP_NUM_THREADS=4
(OMP_NUM_THREADS=5 FM_TEST_FILTER='test_moe*' timeout 230 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops moe rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=3 FM_TEST_FILTER='test_linear*' timeout 230 $T/test_cuda_ops > $L/ops_linear.log 2>&1; echo "ops linear rc $? $((SECONDS-t0)) s") &
(timeout 230 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_generate > $L/generate.log 2>&1; echo "generate rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_generate --route moe.act_scale=token > $L/generate_tok.log 2>&1; echo "generate tok rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_models --route moe.act_scale=token > $L/models_tok.log 2>&1; echo "models tok rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 FM_TEST_FILTER='test_moe_*token*' timeout 230 ./build/wt/test_cuda_ops --route w4a8.kernel=mma > $L/tok_mma.log 2>&1; echo "tok mma rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 FM_TEST_FILTER=test_moe_w4a8_token_small timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $L/memcheck_token.log 2>&1; echo "memcheck token rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 FM_TEST_FILTER=test_router_cluster timeout 200 compute-sanitizer --tool racecheck \
  --error-exitcode 3 $T/test_cuda_ops_fused > $L/racecheck_cluster.log 2>&1; echo "racecheck cluster rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops.log $L/ops_linear.log $L/ops_fused.log $L/generate*.log $L/models_tok.log $L/tok_mma.log | head -24
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $L/memcheck_token.log $L/racecheck_cluster.log
grep -A3 "RUN      \] test_moe_token_large" $L/ops.log | head -4
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $B/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $B/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow base_r1 build/base/fp8moe-bench "${c[@]}"; drow new_r1 build/fp8moe-bench "${c[@]}"
drow tok_r1 build/fp8moe-bench "${c[@]}" --route moe.act_scale=token
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
timeout 90 build/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token --tokens 16,512,2048,8192 \
  --repeat 10 --backend cuda > $B/moe_r1.log 2>&1; echo "moe r1 rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_r1.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
p=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for rt in "" "--route moe.act_scale=token"; do
  timeout 60 build/fp8moe-bench "${p[@]}" $rt > $B/pre.log 2>&1
  echo "prefill [$rt] rc $? $((SECONDS-t0)) s: $(grep -E '^latency|^\| experts ' $B/pre.log | head -2 | tr '\n' ' ')"
  cat $B/pre.log >> $OUT/prefill.txt; done
# the token GEMM's instances and the dispatch kernels under ncu at T = 2048 (which kernel the gain or loss is in)
for r in fp8-grouped fp8-grouped-token; do
  timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    -k regex:'w4a8_wgmma_kernel|gather_quantize|moe_dispatch|plan_kernel|slot_kernel' --launch-skip 12 --launch-count 12 \
    build/fp8moe-bench moe --shape qwen3 --routes $r --tokens 2048 --repeat 2 --warmup 1 --backend cuda > $OUT/ncu_moe_$r.csv 2>/dev/null
  echo "ncu moe $r rc $?: $(grep gpu__time_duration $OUT/ncu_moe_$r.csv | awk -F'","' '{split($5,a,"(");print substr(a[1],1,40), $NF}' | tr '\n' ';')"
done
cp $B/*.log $OUT/ 2>/dev/null
