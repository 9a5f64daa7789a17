#!/bin/bash
# Forty-eighth session: the persistent MoE block with Qwen3-Next's shared expert in the bank (423087d on branch
# shared-block: moe.persistent takes moe.shared=routed's bank). One binary, the routes switched: Qwen3-Next fp8 decode
# B = 1 and 64 under moe.shared=separate (today's default), routed (now one persistent launch a MoE layer at B = 1) and
# routed with moe.persistent=off (the routed chain as measured before), in the orders S R P, P R S, S R P; then
# test_moe_persistent (the shared pair, Qwen3-Next's routing, E 1000 k 32) and test_cuda_shared_routing (toy-next
# routed = separate, greedy generations in graphs). Pack: `OUT=.carry/gpu-s53b.tar.xz tools/gpu-pack-ab.sh
# fp8moe-bench tests/gpu/test_cuda_ops_fused tests/gpu/test_cuda_shared_routing` at 423087d.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s53b.tar.xz.
set -u
LIMIT=${LIMIT:-330}
source .carry/env.sh
mkdir -p s53b && tar -xJf .carry/gpu-s53b.tar.xz -C s53b || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s53b/build/new
D=(decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,64)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
run() { # sep|routed|routed_np ROUND
  left 60 || { echo "== $1 round $2 skipped (time)"; return; }
  local r=moe.shared=separate
  case $1 in routed) r=moe.shared=routed ;; routed_np) r=moe.shared=routed,moe.persistent=off ;; esac
  local f=$L/next_$1_$2.log; timeout 90 $N/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== $1 round $2 rc $? $SECONDS s: $(row $f)| kernels a step $(grep -E '^\| fp8 \| [0-9]+ \| [0-9]+ \| [0-9]+ \| [0-9]+ \|$' $f | awk -F'|' '{printf "%s ", $4}')"
}
run sep 1; run routed 1; run routed_np 1; run routed_np 2; run routed 2; run sep 2; run sep 3; run routed 3; run routed_np 3
t() { # NAME PROGRAM FILTER LIMIT
  left $4 || { echo "== $1 skipped (time)"; return; }
  if [ -n "$3" ]; then FM_TEST_FILTER=$3 timeout $4 $N/$2 > $L/$1.log 2>&1; else timeout $4 $N/$2 > $L/$1.log 2>&1; fi
  echo "== $1 rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/$1.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/$1.log) failed"
  grep -E "FAIL|rror|one launch" $L/$1.log | cut -c1-200 | head -12
}
t moe_persistent test_cuda_ops_fused test_moe_persistent 90
t shared_routing test_cuda_shared_routing '' 120
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
