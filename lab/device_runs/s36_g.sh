#!/bin/bash
# down GEMV rows with 6 groups in flight (one round at Qwen3's 6 groups; lab build, 24-40 bytes spilled) against
# fa536de's 4 (two rounds), route off as the base, alternating, two rounds
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s36.tar.xz || exit 1
xz -dc .carry/lab/fp8moe-bench-u6.xz > /tmp/u6 && chmod +x /tmp/u6
for r in 1 2; do for v in off u4 u6; do
  b=build/fp8moe-bench; [ $v = u6 ] && b=/tmp/u6; route=on; [ $v = off ] && route=off
  timeout 60 $b decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route moe.persistent=$route > /tmp/d.log 2>&1
  echo "decode $v round $r rc $?"; grep -E "^\| fp8" /tmp/d.log | head -2
done; done
