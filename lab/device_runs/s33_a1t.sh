#!/bin/bash
# thirtieth session, the last try's shortest form: the token GEMM's op tests (small cases) and generation with the route
# (greedy against transformers), then bench moe qwen3 fp8-grouped against fp8-grouped-token and decode base / new
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
(OMP_NUM_THREADS=8 FM_TEST_FILTER='test_moe_w4a8*' timeout 150 $T/test_cuda_ops > $L/ops_w4a8.log 2>&1; echo "ops w4a8 rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 timeout 150 $T/test_cuda_generate --route moe.act_scale=token > $L/generate_tok.log 2>&1; echo "generate tok rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=4 FM_TEST_FILTER='test_linear*' timeout 150 $T/test_cuda_ops > $L/ops_linear.log 2>&1; echo "ops linear rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops_w4a8.log $L/generate_tok.log $L/ops_linear.log | head -12
timeout 90 build/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token --tokens 16,512,2048,8192 \
  --repeat 10 --backend cuda > $B/moe_r1.log 2>&1; echo "moe r1 rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_r1.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8 --backend cuda)
for l in base new; do b=build/fp8moe-bench; [ $l = base ] && b=build/base/fp8moe-bench
  timeout 40 $b decode "${c[@]}" > $B/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $B/dec_$l.log | head -3 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; done
cp $B/*.log $OUT/ 2>/dev/null
