#!/bin/bash
# thirtieth session, the last try's smallest form (~170 s): bench moe qwen3 fp8-grouped against fp8-grouped-token,
# then the W4A8 MoE op tests (the token GEMM's cases among them)
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; B=/tmp/logsb; mkdir -p $B
timeout 80 build/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token --tokens 16,512,2048,8192 \
  --repeat 10 --backend cuda > $B/moe_r1.log 2>&1; echo "moe r1 rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $B/moe_r1.log | awk -F'|' '{print $2, $3, $4, $12}' | tr '\n' ';'; echo
OMP_NUM_THREADS=16 FM_TEST_FILTER='test_moe_w4a8*' timeout 110 ./build/tests/gpu/test_cuda_ops > $OUT/ops_w4a8.log 2>&1
echo "ops w4a8 rc $? $((SECONDS-t0)) s"; grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $OUT/ops_w4a8.log | head -8
cp $B/*.log $OUT/ 2>/dev/null
