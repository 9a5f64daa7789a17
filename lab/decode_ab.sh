#!/usr/bin/env bash
# Decode A/B on the GPU machine: the changed kernels' op tests first (CUDA vs CPU, compute-sanitizer), generation and
# graph tests, then `bench decode` of binary A (the baseline) and B (this tree) alternated A B A B in one run, and B
# with the new routes switched off (C). Usage: lab/decode_ab.sh A_BIN B_BIN OPS GEN GRAPH (test binaries); logs in $OUT.
set -u
OUT=${OUT:-/tmp}; A=$1; B=$2; OPS=$3; GEN=$4; GRAPH=$5
for t in test_router test_moe_w4a8 test_norm_embed_elementwise; do
    FM_TEST_FILTER=$t timeout 300 $OPS >"$OUT/ops_$t.log" 2>&1; echo "$t rc $?"
    grep -E "FAILED|differently|Error|error" "$OUT/ops_$t.log" | sort | uniq -c | sort -rn | head -8
done
FM_TEST_FILTER=test_moe_w4a8 timeout 300 $OPS --route moe.gemv=off >"$OUT/ops_nomoegemv.log" 2>&1; echo "moe.gemv=off rc $?"
FM_TEST_FILTER=test_router compute-sanitizer --tool memcheck --error-exitcode 3 $OPS >"$OUT/memcheck_router.log" 2>&1
echo "memcheck router rc $? $(grep 'ERROR SUMMARY' "$OUT/memcheck_router.log" | tail -1)"
FM_TEST_FILTER=test_router compute-sanitizer --tool racecheck $OPS >"$OUT/racecheck_router.log" 2>&1
echo "racecheck router rc $? $(grep -c 'Race reported' "$OUT/racecheck_router.log") races"
FM_TEST_FILTER=test_moe_w4a8 compute-sanitizer --tool memcheck --error-exitcode 3 $OPS >"$OUT/memcheck_moe.log" 2>&1
echo "memcheck moe rc $? $(grep 'ERROR SUMMARY' "$OUT/memcheck_moe.log" | tail -1)"
timeout 300 $GEN >"$OUT/gen.log" 2>&1; echo "generate rc $?"; grep -E "cos|greedy|FAILED" "$OUT/gen.log" | head -20
timeout 300 $GRAPH >"$OUT/graph.log" 2>&1; echo "graph rc $?"; grep -c "bitwise equal" "$OUT/graph.log"
args="bench decode --synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --steps 32 --warmup 8 --presets fp8,fp8+w8a8"
for r in 1 2; do
    $A $args --json "$OUT/decode_A$r.json" >"$OUT/decode_A$r.txt" 2>&1
    $B $args --json "$OUT/decode_B$r.json" >"$OUT/decode_B$r.txt" 2>&1
done
$B $args --route moe.gemv=off --route router.fused=off >"$OUT/decode_C.txt" 2>&1
for f in A1 B1 A2 B2 C; do echo "== $f"; grep -E "^\| fp8" "$OUT/decode_$f.txt" | head -6; done
