A=/tmp/fp8moe_cur; B=/tmp/fp8moe_new; GEN=/tmp/test_cuda_generate; OPS=/tmp/test_cuda_ops
for r in "" "--route moe.gemv=off" "--route moe.gemv=64"; do
  echo "== moe ops $r"; FM_TEST_FILTER=test_moe_w4a8 timeout 200 $OPS $r 2>&1 | grep -E "E=128|FAILED" | head -8
done
FM_TEST_FILTER=test_router timeout 200 $OPS --route router.fused=on 2>&1 | grep -E "FAILED|PASSED|E=128 k=8 H=2048 T=8"
timeout 250 $GEN 2>&1 | grep -E "cached steps|FAILED|PASSED|greedy: " | head -30
args="bench decode --synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --steps 32 --warmup 8 --presets fp8,fp8+w8a8"
for r in 1 2; do for bin in A B; do echo "== $bin$r"; ${!bin} $args 2>&1 | grep -E "^\| fp8" | head -6; done; done
