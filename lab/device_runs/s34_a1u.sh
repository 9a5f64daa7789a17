#!/bin/bash
# thirty-first session, the smallest form (~250 s): the paged attention op tests (test_paged_e4m3 among them) and
# test_cuda_generate beside memcheck of test_paged_e4m3, then decode at B = 8 and 64 with each cache, and perplexity
# through the cache on the GPU
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s34.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
(OMP_NUM_THREADS=8 FM_TEST_FILTER='test_paged*' timeout 150 $T/test_cuda_ops > $L/ops_paged.log 2>&1; echo "ops paged rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 timeout 150 $T/test_cuda_generate > $L/generate.log 2>&1; echo "generate rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=4 FM_TEST_FILTER=test_paged_e4m3 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $L/memcheck_e4m3.log 2>&1; echo "memcheck e4m3 rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops_paged.log $L/generate.log | head -12
grep -hE "ERROR SUMMARY" $L/memcheck_e4m3.log
k=(--synthetic qwen3-30b-a3b --batch 8,64 --context 2048 --presets fp8 --backend cuda)
for kv in auto e4m3 auto e4m3; do
  timeout 30 build/fp8moe-bench decode "${k[@]}" --kv-cache $kv > $B/dec.log 2>&1
  echo "decode $kv rc $? $((SECONDS-t0)) s: $(grep -E '^\| fp8' $B/dec.log | head -2 | awk '{print $3, $5, $7}' | tr '\n' ';')"
  cat $B/dec.log >> $OUT/decode.txt; done
M=models/tiny-code-moe
for kv in auto e4m3; do
  timeout 30 build/fp8moe perplexity --model $M --ids $M/eval_ids.i32 --backend cuda --preset fp8 --cache-chunk 64 \
    --kv-cache $kv > $B/ppl_$kv.log 2>&1; echo "ppl $kv rc $? $((SECONDS-t0)) s: $(grep 'perplexity =' $B/ppl_$kv.log)"; done
cp $B/*.log $OUT/ 2>/dev/null
