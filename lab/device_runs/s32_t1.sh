#!/bin/bash
# next session, call 1 (pack .carry/gpu-tests-s32.tar.xz, HEAD's tests): test_cuda_memory alone, then test_cuda_ops
# beside test_cuda_ops_fused (8 threads each for their CPU references; 2.18: 205 and 154 s): the W4A8 GEMVs' staging
# without divisions and gemv.groups=auto by default (every GEMV op test), test_router_cluster; then racecheck of
# test_router_cluster alone (distributed shared memory across the cluster's CTAs)
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s32.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT
timeout 90 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-t0)) s"
export OMP_NUM_THREADS=8
(timeout 420 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops rc $? $((SECONDS-t0)) s") &
(timeout 420 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops.log $L/ops_fused.log | head -20
grep -A9 "RUN      \] test_router_cluster" $L/ops_fused.log | head -10
OMP_NUM_THREADS=16 FM_TEST_FILTER=test_router_cluster timeout $((570-SECONDS)) compute-sanitizer --tool racecheck \
  --error-exitcode 3 $T/test_cuda_ops_fused > $L/racecheck_cluster.log 2>&1
echo "racecheck test_router_cluster rc $? $((SECONDS-t0)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $L/racecheck_cluster.log
