#!/bin/bash
# Forty-ninth session: where the persistent MoE block's time goes at Qwen3-Next's shape (512 + 1 experts, top-10 + 1,
# I 512) against Qwen3-30B-A3B's (128, top-8, I 768): CTA 0's clock at each phase boundary, lab build -DMDB_TIMES of
# 270846b (`cp -a build/gpu-ab build/mdb; rm build/mdb/src/backend/cuda/moe_decode_block.o; make BUILD=build/mdb
# CUDA_ARCHS="-gencode=arch=compute_90a,code=sm_90a -DMDB_TIMES" build/mdb/fp8moe-bench`, stripped, xz into
# build/mdb/ of the pack .carry/gpu-s54cm.tar.xz, beside s54c's build/new/). B = 1 under the decode graph; median over
# the last 2,000 launches of each run.
set -u
source .carry/env.sh
[ -d s54c ] || { mkdir -p s54c && tar -xJf .carry/gpu-s54cm.tar.xz -C s54c; } || exit 1
F=s54c/build/mdb/fp8moe-bench
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
  timeout 120 $F decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 > /tmp/t.log 2>&1
  echo "== $m rc $? $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' /tmp/t.log | head -1 | cut -c1-60)"
  grep "^mdb" /tmp/t.log | tail -2000 | python3 lab/device_runs/mdb_medians.py $MHZ
done
echo "== all $SECONDS s"
