#!/bin/bash
# forty-second session, the short form of s46_a.sh for a nearly spent budget: the swapped kernel's e4m3 op test and
# the chunked dense GEMV's op test side by side, then at B = 64 decode with paged.swap off / on / x2 on the e4m3 cache,
# and w4a8.gemv_max_m 16 / 64 (fp8). Carry .carry/env.sh, .carry/debs and .carry/gpu-s46b.tar.xz (s46_a.sh's header
# has its command).
set -u
LIMIT=${LIMIT:-260}
source .carry/env.sh
mkdir -p sw && tar -xJf .carry/gpu-s46b.tar.xz -C sw || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
S=sw/build/new
(FM_TEST_FILTER=test_paged_e4m3 timeout ${TT:-80} $S/test_cuda_ops > $L/swap_e4m3.log 2>&1; echo "== rc $? $SECONDS s" >> $L/swap_e4m3.log) &
(FM_TEST_FILTER=test_linear_w4a8_chunks timeout ${TT:-80} $S/test_cuda_ops > $L/chunks.log 2>&1; echo "== rc $? $SECONDS s" >> $L/chunks.log) &
wait
for f in swap_e4m3 chunks; do
  echo "-- $f: $(tail -1 $L/$f.log)"; grep -E "FAILED|ERROR|Assert|fail|illegal" $L/$f.log | cut -c1-200 | head -6
  grep -E "PASSED" $L/$f.log | head -2
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 16 --warmup 4 --batch 64)
for r in off on x2; do
  left 30 || break
  f=$L/dec_e4m3_$r.log; timeout 60 $S/fp8moe-bench "${D[@]}" --kv-cache e4m3 --route paged.swap=$r --per-op > $f 2>&1
  echo "== decode B=64 kv e4m3 swap $r rc $? $SECONDS s"
  grep -E "^\| fp8 " $f | cut -c1-110; grep -E "attention \(paged\)|step total" $f | cut -c1-110
done
for m in 16 64; do
  left 30 || break
  f=$L/chunks_$m.log; timeout 60 $S/fp8moe-bench "${D[@]}" --route w4a8.gemv_max_m=$m > $f 2>&1
  echo "== decode B=64 w4a8.gemv_max_m=$m rc $? $SECONDS s"; grep -E "^\| fp8 " $f | cut -c1-110
done
echo "== $SECONDS s"
