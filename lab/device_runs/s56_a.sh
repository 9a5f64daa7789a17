#!/bin/bash
# For the next session: is the last CTA's tail (RESULTS 2.46: the block's end ~1.1 us shorter, both GEMV phases
# 0.5-0.9 us longer, the step level) level because of its 8 KB of staged norm weights (47 KB a CTA)?
# lab/last_cta_tail.patch is that change with the weights loaded in the tail instead (39.8 KB, 120-124 registers, no
# spills). Also the first
# measurement of the fiftieth session's last tree (slice_top without the last CTA's tail) as a baseline, and
# Qwen3-Next's per-kernel table at one token (bench/kernel_table.py: where its 3.1 ms go, launch by launch). Third:
# lab/rank_parts.patch (up to 256 candidates, P adjacent lanes rank each expert over a part of the keys each, counts
# summed by shuffles: at 128 experts every warp busy and half the chain; the first ranking took 1.17 us at
# Qwen3-30B-A3B, RESULTS 2.46), measured at Qwen3-30B-A3B only (Qwen3-Next's 512 take slice_top).
#   pack: BASE=$(git rev-parse HEAD) BASE_PROGRAMS=fp8moe-bench PATCH=lab/last_cta_tail.patch \
#         OUT=.carry/gpu-s56a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused
#   (main's fp8moe-bench under build/, the patched tree's programs under build/new/; the base is a full build), then
#   rank_parts.patch's fp8moe-bench and test_cuda_ops_fused under build/rank/ (the same, PATCH=lab/rank_parts.patch,
#   its build/new/ renamed). The fiftieth session left that pack built in .carry/gpu-s56a.tar.xz (main's sources as
#   of 5e88dcd, each patch on them; 8.9 MB): where .carry survived, run it as it is.
#   carry .carry/env.sh, .carry/debs, .carry/gpu-s56a.tar.xz
set -u
source .carry/env.sh
mkdir -p s56a && tar -xJf .carry/gpu-s56a.tar.xz -C s56a || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for d in new rank; do
  for f in test_moe_persistent test_moe_block_barriers; do
    FM_TEST_FILTER=$f timeout 120 s56a/build/$d/test_cuda_ops_fused > $L/${d}_$f.log 2>&1
    echo "== $d $f rc $? $SECONDS s: $(grep -c 'bit for bit' $L/${d}_$f.log) bit-for-bit lines"
    grep -E "FAIL|rror" $L/${d}_$f.log | head -5
  done
done
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for m in qwen3-next-80b-a3b qwen3-30b-a3b; do
  V="main tail tail main main tail tail main"
  [ $m = qwen3-30b-a3b ] && V="main tail rank rank tail main main tail rank rank tail main"
  for v in $V; do
    b=s56a/build; [ $v = tail ] && b=s56a/build/new; [ $v = rank ] && b=s56a/build/rank
    f=$L/${m}_${v}_$SECONDS.log
    timeout 60 $b/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1 \
      --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | head -1 | cut -d'|' -f3,4)
  done
done
# Qwen3-Next's every kernel at B = 1 (4 layers: three Gated DeltaNet, one gated attention; H100 bandwidth), main's
timeout 150 python3 bench/kernel_table.py run --bandwidth 3350 --csv $L/kt_next.csv -- s56a/build/fp8moe-bench decode \
  --synthetic qwen3-next-80b-a3b --layers 4 --batch 1 --context 2048 --presets fp8 --backend cuda --warmup 2 --steps 1 \
  > $L/kernel_table_next.md 2>&1
echo "== kernel_table Qwen3-Next B=1 rc $? $SECONDS s"; sed -n '/per kernel/,$p' $L/kernel_table_next.md | head -30
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
