#!/bin/bash
# thirty-third session, second call: the persistent decode MoE block (route moe.persistent). Its op test against the
# chain (bit for bit, one launch), the fused router's test after the router code moved into router_device.cuh, greedy
# generation under the route, then decode at B = 1 with the route off / on alternating, two rounds.
set -u
source .carry/env.sh
[ -x build/tests/gpu/test_cuda_ops_fused ] || tar -xJf .carry/gpu-s36.tar.xz || exit 1
t0=$SECONDS
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_moe_persistent timeout 150 build/tests/gpu/test_cuda_ops_fused > $OUT/persist.log 2>&1
echo "persistent op test rc $? $((SECONDS-t0)) s"; grep -hE "moe.persistent|FAIL|PASSED|Error|error" $OUT/persist.log | head -20
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_router_dispatch_fused timeout 120 build/tests/gpu/test_cuda_ops_fused > $OUT/router.log 2>&1
echo "router op test rc $? $((SECONDS-t0)) s"; grep -hE "^\[  (FAILED|PASSED)" $OUT/router.log
timeout 90 build/tests/gpu/test_cuda_generate --route moe.persistent=on > $OUT/gen.log 2>&1
echo "generate (persistent) rc $? $((SECONDS-t0)) s"; grep -hE "^\[  (FAILED|PASSED)|FAIL" $OUT/gen.log | head -5
for r in 1 2; do for v in off on; do
  timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route moe.persistent=$v > $OUT/dec_${v}_$r.log 2>&1
  echo "decode $v round $r rc $? $((SECONDS-t0)) s"; grep -E "^\| fp8" $OUT/dec_${v}_$r.log | head -2
done; done
