#!/bin/bash
# forty-seventh session, NOT RUN (the device time ran out): the merge's preloads as n loads (3dfd1f2, reverted after
# this pack was built; lab/combine_n_preloads.patch: `OUT=.carry/gpu-s52d.tar.xz tools/gpu-pack-ab.sh fp8moe-bench`)
# against 32 predicated ones (7392b14, the s52_b pack's fp8moe-bench), fp8 decode B = 1, 8, 64, three
# rounds in ABBA order (the new binary with moe.plan_slots=off, which 7392b14 lacks). Carry .carry/env.sh, .carry/debs, .carry/gpu-s52b.tar.xz, .carry/gpu-s52d.tar.xz.
set -u
source .carry/env.sh
mkdir -p s53 s55 && tar -xJf .carry/gpu-s52b.tar.xz -C s53 && tar -xJf .carry/gpu-s52d.tar.xz -C s55 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=s53/build/new; N=s55/build/new
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64 --route w4a8.gemv_max_m=16,w4a8.splits=fill)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
att() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' $1 | awk -F'|' '{printf "%s ", $5}'; }
run() { local bin=$N r=,moe.plan_slots=off; [ $1 = p32 ] && bin=$B r=; local f=/tmp/dec_$1_$2.log
  timeout 60 $bin/fp8moe-bench "${D[@]}"$r > $f 2>&1; echo "== $1 round $2 rc $? $SECONDS s: $(row $f)| attention per op $(att $f)"; }
run p32 1; run pn 1; run pn 2; run p32 2; run p32 3; run pn 3
echo "== all $SECONDS s"
