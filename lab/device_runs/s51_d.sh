#!/bin/bash
# forty-sixth session: (1) w4a8.early_codes (the W4A8 GEMM's first weight codes before its PDL wait: the grouped down
# GEMM, the dense projections on the GEMM) and the q|k|v rows quantized by the MoE block's end above one token, one
# pack (`OUT=.carry/gpu-s51d.tar.xz BASE=269c61a tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused
# tests/gpu/test_cuda_generate`: build/ = 269c61a, build/new = f2ab30f): test_w4a8_early_codes, the whole
# test_cuda_ops_fused (out_q checks), test_cuda_generate with the route on, memcheck of the early-codes test; (2) fp8
# decode B = 1, 8, 64: base / new (early off) / new (early on), alternating, two rounds; (3) bench moe T = 8..64 new
# off / on.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s51d.tar.xz.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s51 && tar -xJf .carry/gpu-s51d.tar.xz -C s51 || exit 1
V3=""; [ -f .carry/gpu-s50d.tar.xz ] && mkdir -p sd && tar -xJf .carry/gpu-s50d.tar.xz -C sd && V3=3cta
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s51/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
FM_TEST_FILTER='test_w4a8_early_codes' timeout 120 $N/test_cuda_ops_fused > $L/test_early.log 2>&1
echo "== test_w4a8_early_codes rc $? $SECONDS s: $(grep -c 'bit for bit' $L/test_early.log) cases"; grep -E "FAIL|rror" $L/test_early.log | cut -c1-160 | head -4
timeout 200 $N/test_cuda_ops_fused > $L/test_fused.log 2>&1
echo "== test_cuda_ops_fused rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_fused.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_fused.log) failed"
grep -E "FAIL|rror|Assert" $L/test_fused.log | cut -c1-160 | head -6
timeout 150 $N/test_cuda_generate --route w4a8.early_codes=on > $L/test_generate.log 2>&1
echo "== test_cuda_generate (early on) rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_generate.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_generate.log) failed"
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
for rd in 1 2; do for v in base off on $V3; do
  left 30 || break
  B=$N; r=$R; [ $v = base ] && B=s51/build; [ $v = 3cta ] && B=sd/build/new
  [ $v = on ] && r=$R,w4a8.early_codes=on
  f=$L/dec_${v}_$rd.log; timeout 60 $B/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== decode $v round $rd rc $? $SECONDS s: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $f | awk -F'|' '{printf "B=%s %s ", $3, $4}')"
done; done
for rd in 1 2; do for v in off on $V3; do
  left 25 || break
  B=$N; r=$R; [ $v = 3cta ] && B=sd/build/new; [ $v = on ] && r=$R,w4a8.early_codes=on
  $B/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $r > $L/moe_${v}_$rd.log 2>&1
  echo "== moe $v round $rd: $(grep -E '^\| fp8-grouped' $L/moe_${v}_$rd.log | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
done; done
if left 70; then
  FM_TEST_FILTER='test_w4a8_early_codes' timeout 65 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_ops_fused > $L/memcheck.log 2>&1
  echo "== memcheck early codes rc $? $SECONDS s"; tail -1 $L/memcheck.log
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
