#!/bin/bash
# forty-third session, after s47_b: the block table's entry an iteration ahead (apg_next_block) against the binary
# before it: base = .carry/gpu-s47b.tar.xz (5a00448), new = .carry/gpu-s47c.tar.xz (96371e2), both run with the same
# explicit routes (w4a8.gemv_max_m=16,w4a8.splits=fill: 3a0b5a6 made them the defaults), so the attention code is the
# only difference. The paged attention op tests on the new binary, then fp8 decode at B = 8, 64 on the e4m3 and the
# bf16 cache, base / new alternating, two rounds (the step and its attention stage).
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s47b.tar.xz, .carry/gpu-s47c.tar.xz.
set -u
LIMIT=${LIMIT:-1000}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s47b s47c && tar -xJf .carry/gpu-s47b.tar.xz -C s47b && tar -xJf .carry/gpu-s47c.tar.xz -C s47c || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
FM_TEST_FILTER='test_paged*' timeout 400 s47c/build/new/test_cuda_ops > $L/ops_paged.log 2>&1
echo "== test_paged* rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_paged.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/ops_paged.log) failed"
FM_TEST_FILTER='test_paged*' timeout 400 s47c/build/new/test_cuda_ops --route paged.swap=on > $L/ops_paged_swap.log 2>&1
echo "== test_paged* swap rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/ops_paged_swap.log) ok"
for rd in 1 2; do for kv in e4m3 auto; do for b in base new; do
  left 25 || break
  B=s47b/build/new; [ $b = new ] && B=s47c/build/new
  f=$L/dec_${kv}_${b}_$rd.log
  timeout 60 $B/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 \
    --batch 8,64 --kv-cache $kv --route w4a8.gemv_max_m=16,w4a8.splits=fill > $f 2>&1
  echo "== $kv $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \||^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| 0.000" $f | cut -c1-90
done; done; done
echo "== all $SECONDS s"
