#!/bin/bash
# Fifty-first session (no device lent then): the persistent MoE block's tail compiled for one chunk a thread
# (lab/tail_one_chunk.patch: H <= 2048 and H % 128 == 0 known at compile time, so the two-chunk combine, the second
# chunk's loads and stores and the warps' fallback quantizer are not in the kernel; the same arithmetic, the same
# bits). The question it answers (bench/NOTES.md, fiftieth session): is the tail's ~4 us on one CTA partly
# instruction fetch? Prediction: the tail phase 3.8-4.7 -> 3.0-4.0 us (MDB clocks), B = 1 -0.5 to -1.5 % at both
# models if so; refuted (the tail within 0.2 us, the step level) otherwise.
#   1 test_moe_persistent and test_moe_block_barriers on the patched binary (bit for bit against the chain), memcheck
#     of the first
#   2 decode B = 1, base and one, ABBA twice, Qwen3-30B-A3B and Qwen3-Next
#   3 the phase clocks of both (-DMDB_TIMES builds), through lab/device_runs/mdb_medians.py
# Pack .carry/gpu-s56d.tar.xz: build/base/fp8moe-bench (s56_b.sh's, the tree of f8deaf5), build/base-mdb/fp8moe-bench
# (the same with -DMDB_TIMES), build/one/{fp8moe-bench,test_cuda_ops_fused} and build/one-mdb/fp8moe-bench (that tree
# with the patch), built here for sm_90a (the fifty-first session left the pack built).
#   carry .carry/env.sh, .carry/debs, .carry/gpu-s56d.tar.xz
set -u
source .carry/env.sh
mkdir -p s56d && tar -xJf .carry/gpu-s56d.tar.xz -C s56d || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
L=$OUT/logs; mkdir -p $L
N=s56d/build/one
for f in test_moe_persistent test_moe_block_barriers; do
  FM_TEST_FILTER=$f timeout 120 $N/test_cuda_ops_fused > $L/$f.log 2>&1
  echo "== $f rc $? $SECONDS s: $(grep -c 'bit for bit' $L/$f.log) bit-for-bit lines"
  grep -E "FAIL|rror" $L/$f.log | head -5
done
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
  for v in base one one base base one one base; do
    f=$L/${m}_${v}_$SECONDS.log
    timeout 60 s56d/build/$v/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 \
      --batch 1 --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | head -1 | cut -d'|' -f3,4)
  done
done
for v in base one; do
  for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
    timeout 60 s56d/build/$v-mdb/fp8moe-bench decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 \
      --route $R > $L/mdb_${v}_$m.log 2>&1
    echo "== mdb $v $m rc $?"
    grep -E "^mdbt? " $L/mdb_${v}_$m.log | tail -4000 | python3 lab/device_runs/mdb_medians.py $MHZ
  done
done
left=$((${CALL_S:-560} - SECONDS)); LIM=$((left > 30 ? left : 30))
FM_TEST_FILTER=test_moe_persistent timeout $LIM compute-sanitizer --tool memcheck $N/test_cuda_ops_fused \
  > $L/memcheck.log 2>&1
echo "== memcheck rc $?: $(grep -cE 'bit for bit' $L/memcheck.log) bit-for-bit lines"; grep "ERROR SUMMARY" $L/memcheck.log
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
