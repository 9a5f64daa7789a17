#!/bin/bash
# lab: the e4m3 split kernel with 4 resident CTAs an SM (registers capped at 128, 152 bytes spilled) against 3
[ -x build/lab-m4/fp8moe-bench ] || tar -xJf .carry/gpu-s35m.tar.xz || exit 1
k=(--synthetic qwen3-30b-a3b --batch 8,64 --context 2048 --presets fp8 --backend cuda --kv-cache e4m3)
for r in 1 2; do for b in build/fp8moe-bench build/lab-m4/fp8moe-bench; do
  timeout 40 $b decode "${k[@]}" > /tmp/d.log 2>&1
  echo "$b r$r rc $?: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|' /tmp/d.log | head -2 | awk -F'|' '{printf "B=%s %s ms; ", $3, $4}')"; done; done
for b in build/fp8moe-bench build/lab-m4/fp8moe-bench; do
  timeout 40 $b decode --synthetic qwen3-30b-a3b --batch 64 --context 2048 --presets fp8 --backend cuda --per-op \
    --kv-cache e4m3 > /tmp/p.log 2>&1; echo "per-op $b: $(grep -A6 'per stage' /tmp/p.log | grep -E '^\| fp8' | head -1)"; done
