#!/bin/bash
# forty-seventh session: moe.plan_slots (the grouped dispatch's plan block assigns the slots too: one launch fewer a
# MoE layer above the GEMVs' pairs), one binary (abee19c: `OUT=.carry/gpu-s52c.tar.xz tools/gpu-pack-ab.sh
# fp8moe-bench tests/gpu/test_cuda_ops_fused`), the route switched: fp8 decode B = 1, 8, 64 in the order off on, on
# off, off on; bench moe T = 8..64 both; then test_moe_plan_slots. Carry .carry/env.sh, .carry/debs,
# .carry/gpu-s52c.tar.xz.
set -u
LIMIT=${LIMIT:-130}
source .carry/env.sh
mkdir -p s54 && tar -xJf .carry/gpu-s52c.tar.xz -C s54 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s54/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
run() { # off|on ROUND
  local f=$L/dec_$1_$2.log; timeout 60 $N/fp8moe-bench "${D[@]}" --route $R,moe.plan_slots=$1 > $f 2>&1
  echo "== plan_slots=$1 round $2 rc $? $SECONDS s: $(row $f)"
}
run off 1; run on 1; run on 2; run off 2; run off 3; run on 3
for v in off on on off; do
  f=$L/moe_$v.log; $N/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $R,moe.plan_slots=$v > $f 2>&1
  echo "== moe plan_slots=$v: $(grep -E '^\| fp8-grouped' $f | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
done
if left 60; then
  FM_TEST_FILTER='test_moe_plan_slots' timeout $((LIMIT - SECONDS - 5)) $N/test_cuda_ops_fused > $L/test_plan_slots.log 2>&1
  echo "== test_moe_plan_slots rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_plan_slots.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_plan_slots.log) failed, $(grep -c 'bit for bit' $L/test_plan_slots.log) cases bit for bit"
  grep -E "FAIL|rror" $L/test_plan_slots.log | cut -c1-200 | head -4
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
