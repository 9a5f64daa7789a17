#!/bin/bash
# thirty-second session, first call (~260 s, the thirty-first session's pack): which kernel instance fails the chunked
# steps under moe.act_scale=token; decode base 41d6c88 against 6c40918 (the default path's GEMV staging and one-variant
# router, not yet measured against a same-run base), two rounds; attention per op at B = 64 with each cache
set -u
[ -x build/tests/gpu/test_cuda_generate ] || tar -xJf .carry/gpu-s34.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsb; mkdir -p $B
tk() { local n=$1 r=$2
  (OMP_NUM_THREADS=2 FM_TEST_FILTER=test_cached_steps timeout 150 $T/test_cuda_generate --route $r > $L/tok_$n.log 2>&1
   echo "tok $n [$r] rc $? $((SECONDS-t0)) s: $(grep -hE 'cosine|FAILED|PASSED' $L/tok_$n.log | head -3 | tr '\n' ' ')") & }
tk plain moe.act_scale=group
tk token moe.act_scale=token
tk mma moe.act_scale=token,w4a8.kernel=mma
tk regs moe.act_scale=token,w4a8.codes=regs
tk smem moe.act_scale=token,w4a8.codes=smem
tk t32 moe.act_scale=token,w4a8.tile=32
tk t64 moe.act_scale=token,w4a8.tile=64
wait
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 50 $b decode "$@" > $B/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $B/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow base_r1 build/base/fp8moe-bench "${c[@]}"; drow new_r1 build/fp8moe-bench "${c[@]}"
drow base_r2 build/base/fp8moe-bench "${c[@]}"; drow new_r2 build/fp8moe-bench "${c[@]}"
for kv in auto e4m3; do
  timeout 40 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 64 --context 2048 --presets fp8 --backend cuda \
    --per-op --kv-cache $kv > $B/perop_$kv.log 2>&1; echo "per-op $kv rc $? $((SECONDS-t0)) s"
  grep -iE "attention" $B/perop_$kv.log | head -4; done
cp $B/*.log $OUT/ 2>/dev/null
