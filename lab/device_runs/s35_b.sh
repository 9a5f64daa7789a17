#!/bin/bash
# thirty-second session (~420 s): the e4m3 split kernel on f16 codes (new) against 6c40918's e4m3 form (converted to
# bf16 values) and against the bf16 cache; its op test and memcheck; the token route's new op cases and the chunked
# steps with each phase's worst position; a prompt chunk over a cached prefix with each cache (the tiled kernel's
# e4m3 form against the split kernel); perplexity through the e4m3 cache on the GPU
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s35.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
(OMP_NUM_THREADS=6 FM_TEST_FILTER='test_paged*' timeout 200 $T/test_cuda_ops > $L/ops_paged.log 2>&1; echo "ops paged rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=3 FM_TEST_FILTER=test_paged_e4m3 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $L/memcheck_e4m3.log 2>&1; echo "memcheck e4m3 rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=3 FM_TEST_FILTER=test_moe_w4a8_token_small timeout 200 $T/test_cuda_ops > $L/ops_token.log 2>&1; echo "ops token rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 FM_TEST_FILTER=test_cached_steps timeout 200 $T/test_cuda_generate --route moe.act_scale=token > $L/gen_tok.log 2>&1; echo "gen token rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=1 FM_TEST_FILTER=test_cached_steps timeout 200 $T/test_cuda_generate > $L/gen_grp.log 2>&1; echo "gen group rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops_paged.log $L/ops_token.log $L/gen_*.log | head -12
grep -hE "ERROR SUMMARY" $L/memcheck_e4m3.log
grep -h "e4m3 ~ bf16" $L/ops_paged.log | awk '{print $NF, $0}' | sort -g | tail -3 | cut -c1-200
grep -h "cached steps vs full" $L/gen_*.log | grep tiny-code | cut -c1-220
k=(--synthetic qwen3-30b-a3b --batch 8,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 40 $b decode "$@" > $B/dec_$l.log 2>&1
  echo "$l rc $? $((SECONDS-t0)) s: $(grep -E '^\| fp8' $B/dec_$l.log | head -3 | awk '{print $3, $5}' | tr '\n' ';')"
  grep -E "^\| fp8" $B/dec_$l.log | sed "s/^/$l /" >> $OUT/decode_rows.txt; }
O=build/old/fp8moe-bench N=build/fp8moe-bench S3=build/lab-st3/fp8moe-bench
for r in 1 2; do
  drow old_e4m3_r$r $O "${k[@]}" --kv-cache e4m3; drow new_e4m3_r$r $N "${k[@]}" --kv-cache e4m3
  drow st3_e4m3_r$r $S3 "${k[@]}" --kv-cache e4m3; drow new_auto_r$r $N "${k[@]}"; done
drow new_b1_e4m3 $N --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda --kv-cache e4m3
drow new_b1_auto $N --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda
for v in old new; do b=$O; [ $v = new ] && b=$N; [ $v = st3 ] && b=$S3
  timeout 40 $b decode --synthetic qwen3-30b-a3b --batch 64 --context 2048 --presets fp8 --backend cuda --per-op \
    --kv-cache e4m3 > $B/perop_$v.log 2>&1; echo "per-op $v rc $? $((SECONDS-t0)) s: $(grep -A6 'per stage' $B/perop_$v.log | grep -E '^\| fp8' | head -1)"; done
pc=(prefill --synthetic qwen3-30b-a3b --preset fp8 --tokens 512 --at 3584 --repeat 3 --warmup 1 --backend cuda)
for v in "--kv-cache e4m3" "" "--kv-cache e4m3 --route paged.tiled=off"; do
  timeout 60 $N "${pc[@]}" $v > $B/chunk.log 2>&1
  echo "chunk [$v] rc $? $((SECONDS-t0)) s: $(grep -E '^latency' $B/chunk.log)"; cat $B/chunk.log >> $OUT/chunk.txt; done
M=models/tiny-code-moe
timeout 40 build/fp8moe perplexity --model $M --ids $M/eval_ids.i32 --backend cuda --preset fp8 --cache-chunk 64 \
  --kv-cache e4m3 > $B/ppl_e4m3.log 2>&1; echo "ppl e4m3 rc $? $((SECONDS-t0)) s: $(grep 'perplexity =' $B/ppl_e4m3.log)"
cp $B/*.log $OUT/ 2>/dev/null
