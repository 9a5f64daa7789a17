#!/bin/bash
# forty-second session, after s46_a (H100): where paged.swap wins on the e4m3 cache (decode fp8 at B = 16, 32, 64,
# off / on, two rounds alternating), the chunked dense GEMV's K slices at B = 64 (fp8: gemv.groups auto / 4 / 2: its
# one-wave rule gives q|k|v's four chunks one slice, 16 groups a warp), and the swapped kernel's stall reasons and
# instruction count under ncu (B = 64).
# Carry .carry/env.sh, .carry/debs and .carry/gpu-s46b.tar.xz.
set -u
LIMIT=${LIMIT:-300}
source .carry/env.sh
[ -x sw/build/new/fp8moe-bench ] || { mkdir -p sw && tar -xJf .carry/gpu-s46b.tar.xz -C sw; } || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
S=sw/build/new
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --kv-cache e4m3)
for rd in 1 2; do for r in off on; do
  left 40 || break
  f=$L/swap_${r}_$rd.log; timeout 90 $S/fp8moe-bench "${D[@]}" --batch 16,32,64 --route paged.swap=$r > $f 2>&1
  echo "== decode e4m3 swap $r round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \|" $f | cut -c1-80
done; done
for g in auto 4 2; do
  left 40 || break
  f=$L/groups_$g.log; timeout 60 $S/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 \
    --backend cuda --steps 32 --batch 64 --route gemv.groups=$g --per-op > $f 2>&1
  echo "== decode B=64 gemv.groups=$g rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \||qkv_proj|o_proj" $f | cut -c1-80
done
for r in off on; do
  left 60 || break
  k=aps_kernel; [ $r = off ] && k=apg_split_kernel
  timeout 120 ncu --kernel-name regex:$k --launch-skip 4 --launch-count 1 --section WarpStateStats \
    --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    $S/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 2048 --presets fp8 \
    --backend cuda --kv-cache e4m3 --route decode.graphs=off,paged.swap=$r > $L/ncu_stall_$r.txt 2>&1
  echo "== ncu $r rc $?"
  grep -E "stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+" $L/ncu_stall_$r.txt | awk '$NF > 0.2' | sed 's/smsp__average_warps_issue_stalled_//' | head -12
  grep -E "Executed Instructions  |Issued Instructions  " $L/ncu_stall_$r.txt | head -2
done
echo "== $SECONDS s"
