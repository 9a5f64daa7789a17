#!/bin/bash
# the persistent block's second form (top-k by ranks, L2 prefetch of later rounds and of the down phase, barrier by
# acquire / release, x quantized from the staged row): its op test, its phases (lab build), decode off / on
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s36.tar.xz || exit 1
t0=$SECONDS
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_moe_persistent timeout 150 build/tests/gpu/test_cuda_ops_fused > $OUT/persist.log 2>&1
echo "persistent op test rc $? $((SECONDS-t0)) s"; grep -hE "^\[  (FAILED|PASSED)|FAIL|rror" $OUT/persist.log | head -5
bash lab/device_runs/s36_d.sh 2>&1 | tail -11
for r in 1 2; do for v in off on; do
  timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route moe.persistent=$v > $OUT/dec_${v}_$r.log 2>&1
  echo "decode $v round $r rc $? $((SECONDS-t0)) s"; grep -E "^\| fp8" $OUT/dec_${v}_$r.log | head -2
done; done
