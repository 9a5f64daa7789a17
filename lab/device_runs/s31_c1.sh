#!/bin/bash
# session 29 (s31 scripts), call with what is left: route router.cluster's op test (= router.cluster=off bit for bit),
# decode B = 1, 8 with it off / on twice, memcheck of the op test
set -u
tar -xJf .carry/gpu-s31c.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$SECONDS
FM_TEST_FILTER=test_router_cluster timeout 60 build/tests/gpu/test_cuda_ops_fused > $OUT/t_cluster.log 2>&1
echo "test rc $? $((SECONDS-t0)) s"; grep -E "router.cluster|PASSED|FAILED|skipped" $OUT/t_cluster.log | head -12
for r in 1 2; do for v in off on; do
  timeout 30 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1,8 --context 2048 --presets fp8 --backend cuda \
    --route router.cluster=$v > $OUT/dec_${v}_$r.log 2>&1; echo "$v r$r rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $OUT/dec_${v}_$r.log | head -2 | awk -F'|' '{print $3, $4}' | tr '\n' ';'; echo
done; done
FM_TEST_FILTER=test_router_cluster timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 \
  build/tests/gpu/test_cuda_ops_fused > $OUT/memcheck_cluster.log 2>&1
echo "memcheck rc $? $((SECONDS-t0)) s"; grep -E "ERROR SUMMARY" $OUT/memcheck_cluster.log
