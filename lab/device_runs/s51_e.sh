#!/bin/bash
# forty-sixth session: the weights' and keys' first loads before the PDL wait, one pack (`OUT=.carry/gpu-s51e.tar.xz
# BASE=269c61a tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops_fused tests/gpu/test_cuda_ops
# tests/gpu/test_cuda_generate`: build/ = 269c61a, build/new = a7c5bb6). (1) test_cuda_ops_fused, test_paged_*
# (paged.early_kv = off, bit for bit), test_cuda_generate with both routes on, memcheck of the paged tests under the
# route; (2) fp8 decode B = 1, 8, 64: base / new with neither / w4a8.early_codes / paged.early_kv / both, alternating,
# two rounds; (3) bench moe T = 8..64 new off / on.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s51e.tar.xz.
set -u
LIMIT=${LIMIT:-450}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s51 && tar -xJf .carry/gpu-s51e.tar.xz -C s51 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s51/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
cnt() { echo "$(grep -cE '^\[ +OK +\]' $1) ok, $(grep -cE '^\[ +FAILED +\]' $1) failed"; }
timeout 200 $N/test_cuda_ops_fused > $L/test_fused.log 2>&1
echo "== test_cuda_ops_fused rc $? $SECONDS s: $(cnt $L/test_fused.log); early_codes cases $(grep -c 'early_codes=on.*bit for bit' $L/test_fused.log), out_q checked $(grep -c "out_q = the quantizer" $L/test_fused.log)"
grep -E "FAIL|rror" $L/test_fused.log | cut -c1-160 | head -4
FM_TEST_FILTER='test_paged_*' timeout 150 $N/test_cuda_ops > $L/test_paged.log 2>&1
echo "== test_paged_* rc $? $SECONDS s: $(cnt $L/test_paged.log), $(grep -c 'early_kv' $L/test_paged.log) early_kv lines"
grep -E "FAIL|rror" $L/test_paged.log | cut -c1-160 | head -4
timeout 150 $N/test_cuda_generate --route w4a8.early_codes=on,paged.early_kv=on > $L/test_generate.log 2>&1
echo "== test_cuda_generate (both on) rc $? $SECONDS s: $(cnt $L/test_generate.log)"
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
for rd in 1 2; do for v in base off codes kv both; do
  left 40 || break
  B=$N; r=$R; [ $v = base ] && B=s51/build
  [ $v = codes ] && r=$R,w4a8.early_codes=on; [ $v = kv ] && r=$R,paged.early_kv=on
  [ $v = both ] && r=$R,w4a8.early_codes=on,paged.early_kv=on
  f=$L/dec_${v}_$rd.log; timeout 60 $B/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== decode $v round $rd rc $? $SECONDS s: $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $f | awk -F'|' '{printf "B=%s %s ", $3, $4}')"
done; done
for rd in 1 2; do for v in off on; do
  left 25 || break
  r=$R; [ $v = on ] && r=$R,w4a8.early_codes=on
  $N/fp8moe-bench moe --shape qwen3 --tokens 8,16,32,64 --routes fp8-grouped --backend cuda --route $r > $L/moe_${v}_$rd.log 2>&1
  echo "== moe $v round $rd: $(grep -E '^\| fp8-grouped' $L/moe_${v}_$rd.log | awk -F'|' '{printf "T=%s %s ", $3, $4}')"
done; done
if left 80; then
  FM_TEST_FILTER='test_paged_attention' timeout 75 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_ops --route paged.early_kv=on > $L/memcheck.log 2>&1
  echo "== memcheck paged (early_kv on) rc $? $SECONDS s"; tail -1 $L/memcheck.log
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
