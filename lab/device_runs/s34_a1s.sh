#!/bin/bash
# thirty-first session, s34_a1.sh's shorter form (~420 s): the whole test_cuda_ops (the default decode path's unmeasured
# changes and the e4m3 KV cache's test_paged_e4m3) beside test_cuda_ops_fused, generation against transformers with and
# without moe.act_scale=token, the models test, memcheck of test_paged_e4m3; then decode new / new --kv-cache e4m3 (no
# base, one round), bench moe group against token, prefill group against token, perplexity through the cache
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s34.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
(OMP_NUM_THREADS=6 timeout 240 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=3 timeout 280 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_generate > $L/generate.log 2>&1; echo "generate rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_generate --route moe.act_scale=token > $L/generate_tok.log 2>&1; echo "generate tok rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 timeout 200 $T/test_cuda_models > $L/models.log 2>&1; echo "models rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 FM_TEST_FILTER=test_paged_e4m3 timeout 280 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $L/memcheck_e4m3.log 2>&1; echo "memcheck e4m3 rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops.log $L/ops_fused.log $L/generate*.log $L/models.log | head -24
grep -hE "ERROR SUMMARY" $L/memcheck_e4m3.log
grep -hA8 "RUN      \] test_paged_e4m3" $L/ops.log | grep -vE "^\[" | head -8
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 50 $b decode "$@" > $B/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $B/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow new_r1 build/fp8moe-bench "${c[@]}"
drow kv8_r1 build/fp8moe-bench "${c[@]}" --kv-cache e4m3
timeout 60 build/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token --tokens 16,512,2048,8192 \
  --repeat 10 --backend cuda > $B/moe_r1.log 2>&1; echo "moe r1 rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_r1.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
p=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for rt in "" "--route moe.act_scale=token"; do
  timeout 45 build/fp8moe-bench "${p[@]}" $rt > $B/pre.log 2>&1
  echo "prefill [$rt] rc $? $((SECONDS-t0)) s: $(grep -E '^latency|^\| experts ' $B/pre.log | head -2 | tr '\n' ' ')"
  cat $B/pre.log >> $OUT/prefill.txt; done
M=models/tiny-code-moe
for kv in auto e4m3; do
  timeout 40 build/fp8moe perplexity --model $M --ids $M/eval_ids.i32 --backend cuda --preset fp8 --cache-chunk 64 \
    --kv-cache $kv > $B/ppl_$kv.log 2>&1; echo "ppl $kv rc $? $((SECONDS-t0)) s: $(grep 'perplexity =' $B/ppl_$kv.log)"; done
cp $B/*.log $OUT/ 2>/dev/null
