#!/bin/bash
# session 30, call 1 (pack .carry/gpu-tests-s30.tar.xz, HEAD's tests): test_cuda_ops_fused (the new test_gemv_prefetch:
# gemv.prefetch=on bit for bit against off) beside test_cuda_ops, 8 threads each for their CPU references (2.18: 154
# and 205 s), then memcheck of test_gemv_prefetch alone (the bulk L2 prefetches' addresses)
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s30.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT
timeout 90 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-t0)) s"
export OMP_NUM_THREADS=8
(timeout 400 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops rc $? $((SECONDS-t0)) s") &
(timeout 400 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops.log $L/ops_fused.log | head -20
grep -A3 "test_gemv_prefetch" $L/ops_fused.log | head -8
OMP_NUM_THREADS=16 FM_TEST_FILTER=test_gemv_prefetch timeout $((560-SECONDS)) compute-sanitizer --tool memcheck \
  --error-exitcode 3 $T/test_cuda_ops_fused > $L/memcheck_prefetch.log 2>&1
echo "memcheck test_gemv_prefetch rc $? $((SECONDS-t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck_prefetch.log
