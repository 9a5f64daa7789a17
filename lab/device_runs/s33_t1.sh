#!/bin/bash
# thirtieth session, call 1 (pack .carry/gpu-s33.tar.xz, 0cc5d62's tests): test_cuda_memory alone, then test_cuda_ops
# (the W4A8 GEMVs' staging without divisions, gemv.groups=auto; new: test_moe_w4a8_token_small / test_moe_token_large,
# route moe.act_scale=token against the cpu emulation) beside test_cuda_ops_fused (test_router_cluster, the fused
# router's one-variant instances), 8 threads each; then memcheck of the token GEMM's small cases beside the racecheck
# of test_router_cluster
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT
timeout 90 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-t0)) s"
export OMP_NUM_THREADS=8
(timeout 400 $T/test_cuda_ops > $L/ops.log 2>&1; echo "ops rc $? $((SECONDS-t0)) s") &
(timeout 400 $T/test_cuda_ops_fused > $L/ops_fused.log 2>&1; echo "ops_fused rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops.log $L/ops_fused.log | head -20
grep -A12 "RUN      \] test_moe_w4a8_token_small" $L/ops.log | head -14
grep -A6 "RUN      \] test_moe_token_large" $L/ops.log | head -8
left=$((575-SECONDS))
(FM_TEST_FILTER=test_moe_w4a8_token_small timeout $left compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $L/memcheck_token.log 2>&1; echo "memcheck token rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=8 FM_TEST_FILTER=test_router_cluster timeout $left compute-sanitizer --tool racecheck \
  --error-exitcode 3 $T/test_cuda_ops_fused > $L/racecheck_cluster.log 2>&1; echo "racecheck cluster rc $? $((SECONDS-t0)) s") &
wait
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $L/memcheck_token.log $L/racecheck_cluster.log
