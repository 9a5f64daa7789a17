#!/bin/bash
# For the forty-eighth session (built in the forty-seventh, not run): (1) the merge's preloads as n loads
# (lab/combine_n_preloads.patch) against 32 predicated ones (7392b14: the s52_b pack's fp8moe-bench); (2) the
# persistent MoE block's counting barrier (route moe.block_barrier=count) against the generation barrier. The new
# binary: `PATCH=lab/combine_n_preloads.patch OUT=.carry/gpu-s52e.tar.xz tools/gpu-pack-ab.sh fp8moe-bench
# tests/gpu/test_cuda_ops_fused tests/gpu/test_cuda_ops` at 2395d59, run with moe.plan_slots=off (7392b14 has the
# slot kernel). fp8 decode B = 1, 8, 64 in the orders A B C, C B A, A B C; then test_paged_attention on the patched
# merge, test_moe_block_barrier_count and test_moe_persistent. The forty-eighth session packed both in one archive
# (its checkout had no .carry): `BASE=7392b14 PATCH=lab/combine_n_preloads.patch OUT=.carry/gpu-s53.tar.xz
# tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused tests/gpu/test_cuda_ops` at 0fc8c2d.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s53.tar.xz.
set -u
LIMIT=${LIMIT:-220}
source .carry/env.sh
mkdir -p s53 && tar -xJf .carry/gpu-s53.tar.xz -C s53 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=s53/build; N=s53/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
att() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' $1 | awk -F'|' '{printf "%s ", $5}'; }
run() { # p32|pn|count ROUND
  local bin=$N r=$R,moe.plan_slots=off
  case $1 in p32) bin=$B r=$R ;; count) r=$r,moe.block_barrier=count ;; esac
  local f=$L/dec_$1_$2.log; timeout 60 $bin/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== $1 round $2 rc $? $SECONDS s: $(row $f)| attention stage per op $(att $f)"
}
run p32 1; run pn 1; run count 1; run count 2; run pn 2; run p32 2; run p32 3; run pn 3; run count 3
t() { # NAME PROGRAM FILTER LIMIT
  left $4 || { echo "== $1 skipped (time)"; return; }
  FM_TEST_FILTER=$3 timeout $4 $N/$2 > $L/$1.log 2>&1
  echo "== $1 rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/$1.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/$1.log) failed, $(grep -c 'bit for bit' $L/$1.log) bit-for-bit lines"
  grep -E "FAIL|rror" $L/$1.log | cut -c1-200 | head -4
}
t block_barrier test_cuda_ops_fused test_moe_block_barrier_count 60
t moe_persistent test_cuda_ops_fused test_moe_persistent 60
t paged_attention test_cuda_ops test_paged_attention 120
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
