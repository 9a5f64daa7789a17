#!/bin/bash
# Fifty-first session: the call after s56_b.sh, on its pack (.carry/gpu-s56b.tar.xz, already under s56b/ where the
# machine is the same; unpacked again otherwise).
#   1 Qwen3-Next per op without a graph, gdn.decode_ba and gdn.early_state off and on: "in_proj (qkvz, ba)" against
#     "in_proj (qkvz)" and the GDN op's line
#   2 ncu's dense stall sample of the persistent MoE block at Qwen3-30B-A3B, one token, 20 launches (bench/NOTES.md,
#     fiftieth session: is its one-CTA tail waiting on instruction fetch?); the SASS table comes back
#   3 per op at Qwen3-30B-A3B with --lm-head dense against float (the final_norm+lm_head line), fp8 and fp8 + w8a8
#   carry .carry/env.sh, .carry/debs, .carry/gpu-s56b.tar.xz
set -u
source .carry/env.sh
[ -x s56b/build/fp8moe-bench ] || { mkdir -p s56b && tar -xJf .carry/gpu-s56b.tar.xz -C s56b; } || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
B=s56b/build
R=w4a8.gemv_max_m=16,w4a8.splits=fill
# per op without a graph, off and both: "in_proj (qkvz, ba)" against "in_proj (qkvz)" and the GDN op's line
for v in off both; do
  X=; [ $v = both ] && X=,gdn.decode_ba=on,gdn.early_state=on
  timeout 60 $B/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
    --steps 16 --batch 1 --route $R$X --per-op > $L/next_perop_$v.log 2>&1
  echo "== next per-op $v rc $? $SECONDS s"; grep -E "in_proj|conv|gated norm|out_proj" $L/next_perop_$v.log | head -6
done
# the persistent MoE block's stalls densely sampled (bench/NOTES.md fiftieth session: is its one-CTA tail waiting on
# instruction fetch?), Qwen3-30B-A3B at one token, 20 launches; the SASS table comes back for the tail's region
if [ $SECONDS -lt 400 ]; then
  t0=$SECONDS
  timeout 120 ncu --clock-control none --sampling-interval 0 --section WarpStateStats --section SourceCounters \
    -k regex:moe_decode_block --launch-skip 48 --launch-count 20 -o /tmp/blk $B/fp8moe-bench decode --synthetic \
    qwen3-30b-a3b --batch 1 --context 2048 --steps 2 --warmup 0 --presets fp8 --backend cuda \
    --route $R,decode.graphs=off > $L/ncu_run.log 2>&1
  echo "== ncu rc $? $((SECONDS - t0)) s"; tail -2 $L/ncu_run.log
  ncu -i /tmp/blk.ncu-rep --page details --csv > $L/ncu_details.csv 2>&1
  ncu -i /tmp/blk.ncu-rep --page source --csv --print-source sass > $L/ncu_sass.csv 2>&1
  grep -iE "no_instruction|warp cycles per issued" $L/ncu_details.csv | cut -c1-200 | head -6
fi
for p in fp8 fp8+w8a8; do
  for v in float dense; do
    timeout 60 $B/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets $p --backend cuda \
      --steps 16 --batch 1 --route $R --lm-head $v --per-op > $L/perop_30b_${p}_$v.log 2>&1
    echo "== 30b per-op $p lm_head $v rc $? $SECONDS s"; grep -E "lm_head" $L/perop_30b_${p}_$v.log | head -3
  done
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
