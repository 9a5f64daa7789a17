#!/bin/bash
# next session, call 1 (pack .carry/gpu-tests-s29.tar.xz, HEAD's tests): the memory test alone, then the two long op
# programs side by side with 8 threads each for their CPU references (at 2 threads beside 8 other programs they ran
# past 400 s in the twenty-fifth session)
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s29.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT
timeout 90 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-t0)) s"
export OMP_NUM_THREADS=8
(timeout 520 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops rc $? $((SECONDS-t0)) s") &
(timeout 520 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/memory.log $L/ops.log $L/ops_fused.log | head -30
