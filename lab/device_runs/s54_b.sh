#!/bin/bash
# Forty-ninth session, measurements (after s54_a.sh, same packs): old = f7526e8's fp8moe-bench (the session's base),
# new = 270846b's (the Gated DeltaNet's qkvz and out projections from their producers' rows). Qwen3-Next fp8 B = 1: old, new, new +
# gdn.decode_fused=on, that + moe.block_norm=on, then the reverse; B = 64: new, new + gdn.decode_fused=on and back; Qwen3-30B-A3B fp8 B = 1 moe.block_norm off / on / on / off.
set -u
source .carry/env.sh
[ -d s54c ] || { mkdir -p s54a s54c && tar -xJf .carry/gpu-s54a.tar.xz -C s54a && tar -xJf .carry/gpu-s54cm.tar.xz -C s54c; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
R=w4a8.gemv_max_m=16,w4a8.splits=fill
b() { # label, binary, model, batch, extra routes
  local f=$L/$1_$4_$SECONDS.log
  timeout 45 $2/fp8moe-bench decode --synthetic $3 --context 2048 --presets fp8 --backend cuda --steps 32 --batch $4 \
    --route $R$5 > $f 2>&1
  echo "== $1 B=$4 rc $? $SECONDS s: $(grep -E "^\| fp8 \| $4 \| [0-9.]+ \|" $f | head -1 | cut -c1-60)"
}
O=s54a/build/new; N=s54c/build/new; Q=qwen3-next-80b-a3b
for v in old new gdn gdn_norm gdn_norm gdn new old; do
  case $v in old) b old $O $Q 1 "";; new) b new $N $Q 1 "";; gdn) b gdn $N $Q 1 ",gdn.decode_fused=on";;
    gdn_norm) b gdn_norm $N $Q 1 ",gdn.decode_fused=on,moe.block_norm=on";; esac
done
for v in new gdn gdn new; do
  case $v in new) b new $N $Q 64 "";; gdn) b gdn $N $Q 64 ",gdn.decode_fused=on";; esac
done
for r in off on on off; do b norm_$r $N qwen3-30b-a3b 1 ",moe.block_norm=$r"; done
(cd $OUT && tar -cJf bench.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
