#!/bin/bash
# session 26, device call B: the memory test alone (it measures the device's free memory), then the paged attention
# op tests under paged.splits=waves and default, the whole GPU's threads for the CPU reference
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-all-s26.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; L=$OUT
T=./build/tests/gpu
timeout 60 $T/test_cuda_memory > $L/memory.log 2>&1; echo "memory rc $? $((SECONDS-t0)) s"
grep -E "^\[  FAILED|^\[  PASSED" $L/memory.log | head
export OMP_NUM_THREADS=8
FM_TEST_FILTER='test_paged*' timeout 160 $T/test_cuda_ops --route paged.splits=waves > $L/ops_waves.log 2>&1 &
FM_TEST_FILTER='test_paged*' timeout 160 $T/test_cuda_ops > $L/ops_paged.log 2>&1 &
wait
echo "ops done $((SECONDS-t0)) s"
for f in ops_waves ops_paged; do echo "$f:"; grep -E "^\[  FAILED|^\[  PASSED|^\[       OK|splits" $L/$f.log | head -20; done
