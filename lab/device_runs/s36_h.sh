#!/bin/bash
# the block's expert rows with all 8 groups of a warp's slice in flight by cp.async into shared memory (64 KB a CTA,
# lab build "stg") against the library's 4 in registers (two rounds), route off as the base, alternating, two rounds
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s36.tar.xz || exit 1
xz -dc .carry/lab/fp8moe-bench-stg.xz > /tmp/stg && chmod +x /tmp/stg
for r in 1 2; do for v in off regs stg; do
  b=build/fp8moe-bench; [ $v = stg ] && b=/tmp/stg; route=on; [ $v = off ] && route=off
  timeout 60 $b decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route moe.persistent=$route > /tmp/d.log 2>&1
  echo "decode $v round $r rc $?"; grep -E "^\| fp8" /tmp/d.log | head -2
done; done
