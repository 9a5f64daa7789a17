#!/bin/bash
# the persistent block's third form (the second without the L2 prefetches, which slowed the gate|up phase): op test,
# greedy generation under the route, phases (lab build), decode off / on at B = 1 (two rounds) and B = 8 (the route
# does not apply: level), then memcheck and racecheck of the op test
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s36.tar.xz || exit 1
t0=$SECONDS
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_moe_persistent timeout 150 build/tests/gpu/test_cuda_ops_fused > $OUT/persist.log 2>&1
echo "persistent op test rc $? $((SECONDS-t0)) s"; grep -hE "^\[  (FAILED|PASSED)|FAIL|rror" $OUT/persist.log | head -5
timeout 90 build/tests/gpu/test_cuda_generate --route moe.persistent=on > $OUT/gen.log 2>&1
echo "generate (persistent) rc $? $((SECONDS-t0)) s"; grep -hE "^\[  (FAILED|PASSED)" $OUT/gen.log | head -3
bash lab/device_runs/s36_d.sh 2>&1 | tail -10
for r in 1 2; do for v in off on; do
  timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route moe.persistent=$v > $OUT/dec_${v}_$r.log 2>&1
  echo "decode $v round $r rc $? $((SECONDS-t0)) s"; grep -E "^\| fp8" $OUT/dec_${v}_$r.log | head -2
done; done
for v in off on; do
  timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8 \
    --route moe.persistent=$v > $OUT/dec8_$v.log 2>&1
  echo "decode B=8 $v rc $?"; grep -E "^\| fp8" $OUT/dec8_$v.log | head -1
done
for tool in memcheck racecheck; do
  OMP_NUM_THREADS=14 FM_TEST_FILTER=test_moe_persistent timeout 200 compute-sanitizer --tool $tool \
    build/tests/gpu/test_cuda_ops_fused > $OUT/$tool.log 2>&1
  echo "$tool rc $? $((SECONDS-t0)) s"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|hazard|^\[  (FAILED|PASSED)" $OUT/$tool.log | head -4
done
