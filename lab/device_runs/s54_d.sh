#!/bin/bash
# Forty-ninth session, second call: the persistent MoE block's top-k values made by its 8 warps (branch topk-parallel).
# test_moe_persistent (bit for bit against the chain: Qwen3-30B-A3B, Qwen3-Next's 512 + 1, 1,000 experts), then
# fp8 decode B = 1, old = 270846b's fp8moe-bench (.carry/gpu-s54cm.tar.xz, with --route gdn.decode_fused=on: b8b6bd1's
# default) against new, three rounds ABBA, Qwen3-Next and Qwen3-30B-A3B; then the phase clocks of both (-DMDB_TIMES
# builds: old in gpu-s54cm, new in gpu-s54d's build/mdb).
# Packs: .carry/gpu-s54cm.tar.xz (s54_all.sh's) and `OUT=.carry/gpu-s54d.tar.xz tools/gpu-pack-ab.sh fp8moe-bench
# tests/gpu/test_cuda_ops_fused` with the -DMDB_TIMES build of the same tree added as build/mdb/fp8moe-bench.
set -u
source .carry/env.sh
mkdir -p s54c s54d && tar -xJf .carry/gpu-s54cm.tar.xz -C s54c && tar -xJf .carry/gpu-s54d.tar.xz -C s54d || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
L=$OUT/logs; mkdir -p $L
O=s54c/build/new; N=s54d/build/new
FM_TEST_FILTER=test_moe_persistent timeout 120 $N/test_cuda_ops_fused > $L/persistent.log 2>&1
echo "== test_moe_persistent rc $? $SECONDS s: $(grep -c 'bit for bit' $L/persistent.log) bit-for-bit lines"
grep -E "FAIL|rror" $L/persistent.log | head -5
R=w4a8.gemv_max_m=16,w4a8.splits=fill,gdn.decode_fused=on
for m in qwen3-next-80b-a3b qwen3-30b-a3b; do
  for v in old new new old old new; do
    b=$O; [ $v = new ] && b=$N
    f=$L/${m}_${v}_$SECONDS.log
    timeout 45 $b/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1 \
      --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s: $(grep -E '^\| fp8 \| 1 \| [0-9.]+ \|' $f | head -1 | cut -c1-60)"
  done
done
for v in old new; do
  F=s54c/build/mdb/fp8moe-bench; [ $v = new ] && F=s54d/build/mdb/fp8moe-bench
  for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
    timeout 60 $F decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 --route $R > /tmp/t.log 2>&1
    echo "== mdb $v $m rc $?"
    grep "^mdb" /tmp/t.log | tail -2000 | python3 lab/device_runs/mdb_medians.py $MHZ
  done
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
