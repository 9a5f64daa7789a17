#!/bin/bash
# forty-sixth session: w4a8.early_l2 (with the early codes, the rest of a CTA's codes prefetched into L2 before the PDL
# wait), one binary (`OUT=.carry/gpu-s51f.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused`:
# build/new = cb8cdb0), the route switched: test_w4a8_early_codes (on = off bit for bit, with and without L2), fp8
# decode B = 1, 8, 64 and bench moe T = 8..64, alternating, two rounds.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s51f.tar.xz.
set -u
LIMIT=${LIMIT:-240}
source .carry/env.sh
mkdir -p s51 && tar -xJf .carry/gpu-s51f.tar.xz -C s51 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s51/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
for rd in 1 2; do for v in off l2; do
  r=$R; [ $v = l2 ] && r=$R,w4a8.early_l2=on
  f=$L/dec_${v}_$rd.log; timeout 60 $N/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== decode $v round $rd rc $? $SECONDS s: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $f | awk -F'|' '{printf "B=%s %s ", $3, $4}')"
  $N/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $r > $L/moe_${v}_$rd.log 2>&1
  echo "== moe $v round $rd: $(grep -E '^\| fp8-grouped' $L/moe_${v}_$rd.log | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
done; done
if left 90; then
  FM_TEST_FILTER='test_w4a8_early_codes' timeout 120 $N/test_cuda_ops_fused > $L/test_early.log 2>&1
  echo "== test_w4a8_early_codes rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_early.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_early.log) failed, $(grep -c 'early_l2=on.*bit for bit' $L/test_early.log) L2 cases"
  grep -E "FAIL|rror" $L/test_early.log | cut -c1-160 | head -4
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
