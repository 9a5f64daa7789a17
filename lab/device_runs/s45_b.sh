#!/bin/bash
# forty-first session, the short form of s45_a.sh for a nearly spent budget: the swapped kernel's e4m3 op test, then
# decode at B = 64 with paged.swap off / on / x2 on the e4m3 cache and off / on on the bf16 one. Carry .carry/env.sh,
# .carry/debs and .carry/gpu-s45sw.tar.xz (s45_a.sh's header has its command).
set -u
LIMIT=${LIMIT:-240}
source .carry/env.sh
mkdir -p sw && tar -xJf .carry/gpu-s45sw.tar.xz -C sw || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
S=sw/build/new
FM_TEST_FILTER=test_paged_e4m3 timeout ${TT:-80} $S/test_cuda_ops > $L/swap_e4m3.log 2>&1; echo "== e4m3 op test rc $? $SECONDS s"
grep -E "FAILED|ERROR|illegal|paged.swap" $L/swap_e4m3.log | cut -c1-200 | head -8; grep -E "PASSED" $L/swap_e4m3.log
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 16 --warmup 4 --batch 64)
for kv in e4m3 auto; do for r in off on x2; do
  [ $kv = auto ] && [ $r = x2 ] && continue
  left 30 || break
  f=$L/dec_${kv}_$r.log; timeout 60 $S/fp8moe-bench "${D[@]}" --kv-cache $kv --route paged.swap=$r --per-op > $f 2>&1
  echo "== decode B=64 kv $kv swap $r rc $? $SECONDS s"
  grep -E "^\| fp8 " $f | cut -c1-110; grep -E "attention \(paged\)|step total" $f | cut -c1-110
done; done
echo "== $SECONDS s"
