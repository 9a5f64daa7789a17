#!/bin/bash
# thirty-second session, second measurement (~300 s): the paged kernels' slot arithmetic by shifts a tile and o
# rescaled only when a factor moves (new) against the first form of this session (prev, 797bee7) and 6c40918 (old):
# the op tests with blocks of 24 and 8 keys, memcheck; decode at B = 8 and 64 with each cache; attention per op; a
# prompt chunk over a cached prefix
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-s35c.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; T=./build/tests/gpu; L=$OUT; B=/tmp/logsc; mkdir -p $B
(OMP_NUM_THREADS=8 FM_TEST_FILTER='test_paged*' timeout 200 $T/test_cuda_ops > $L/ops_paged.log 2>&1; echo "ops paged rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=4 FM_TEST_FILTER=test_paged_e4m3 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $T/test_cuda_ops > $B/memcheck.log 2>&1; echo "memcheck e4m3 rc $? $((SECONDS-t0)) s") &
(OMP_NUM_THREADS=2 timeout 200 $T/test_cuda_generate > $B/gen.log 2>&1; echo "generate rc $? $((SECONDS-t0)) s") &
wait
grep -hE "^\[  FAILED|^\[  PASSED|ERROR" $L/ops_paged.log $B/gen.log | head -8
grep -hE "ERROR SUMMARY" $B/memcheck.log
grep -h "e4m3 ~" $L/ops_paged.log | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/worst e4m3 err /'
k=(--synthetic qwen3-30b-a3b --batch 8,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 40 $b decode "$@" > $B/dec.log 2>&1
  echo "$l rc $? $((SECONDS-t0)) s: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|' $B/dec.log | head -2 | awk -F'|' '{printf "B=%s %s ms; ", $3, $4}')"; }
O=build/old/fp8moe-bench P=build/prev/fp8moe-bench N=build/fp8moe-bench
for r in 1 2; do
  drow prev_e4m3_r$r $P "${k[@]}" --kv-cache e4m3; drow new_e4m3_r$r $N "${k[@]}" --kv-cache e4m3
  drow prev_auto_r$r $P "${k[@]}"; drow new_auto_r$r $N "${k[@]}"; done
drow old_e4m3 $O "${k[@]}" --kv-cache e4m3
for b in 1; do drow prev_b1 $P --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda
  drow new_b1 $N --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda; done
for v in prev new; do b=$P; [ $v = new ] && b=$N
  for kv in e4m3 auto; do
    timeout 40 $b decode --synthetic qwen3-30b-a3b --batch 64 --context 2048 --presets fp8 --backend cuda --per-op \
      --kv-cache $kv > $B/perop.log 2>&1
    echo "per-op $v $kv rc $? $((SECONDS-t0)) s: $(grep -A6 'per stage' $B/perop.log | grep -E '^\| fp8' | head -1)"; done; done
pc=(prefill --synthetic qwen3-30b-a3b --preset fp8 --tokens 512 --at 3584 --repeat 3 --warmup 1 --backend cuda)
for v in "$N --kv-cache e4m3" "$N " "$P --kv-cache e4m3" "$P "; do
  timeout 60 ${v%% *} "${pc[@]}" ${v#* } > $B/chunk.log 2>&1
  echo "chunk [$v] rc $? $((SECONDS-t0)) s: $(grep -E '^latency' $B/chunk.log | cut -c1-60)"; done
