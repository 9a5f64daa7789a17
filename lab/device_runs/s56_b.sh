#!/bin/bash
# Fifty-first session (no device lent then): Qwen3-Next's in_proj_ba projection inside the fused GDN decode kernel
# (route gdn.decode_ba: the cuBLAS GEMM between the qkvz GEMV and that kernel goes, its two dot products a value head
# computed before the kernel's PDL wait) and the kernel's recurrent state loads before its wait (gdn.early_state).
# Both routes are opt-in in the binary, so one binary measures all three forms. Run it before s56_a.sh (the call
# after it, within the 30 s the machine stays warm).
#   1 test_gdn_decode_fused (the op with ba = the chain fed the host's sums in the kernel's order, bit for bit;
#     hidden 2048 and 40, early state on and off; the linear op's fallback at 36 and dk 256)
#   2 decode Qwen3-Next B = 1 and 64, the forms off / ba / ba + early state in ABC CBA order
#   3 --lm-head dense at Qwen3-30B-A3B, fp8 and fp8 + w8a8, B = 1 and 64, float / dense / dense / float
#   4 memcheck of test_gdn_decode_fused; test_cuda_generate with both routes on (greedy equal to transformers on
#     every golden model, Qwen3-Next's graphs against its eager steps, cached steps against prefill);
#     test_cuda_models (every preset against its CPU emulation and the oracle; --lm-head dense likewise)
# s56_c.sh (the next call, same pack): Qwen3-Next per op with the routes, ncu's dense sample of the MoE block.
# Pack .carry/gpu-s56b.tar.xz: build/{fp8moe-bench,test_cuda_ops_fused,test_cuda_generate,test_cuda_models} of the
# tree of f8deaf5 (the routes of 1fa3655, --lm-head of b04fea1; built in build/gpu-ab for sm_90a; the
# fifty-first session left the pack built):
#   mkdir -p /tmp/p/build && cp build/gpu-ab/fp8moe-bench build/gpu-ab/tests/gpu/test_cuda_{ops_fused,generate,models} \
#     /tmp/p/build/ && strip /tmp/p/build/* && (cd /tmp/p && find build -type f | sort | tar -cf - -T - | \
#     xz --lzma2=preset=6,dict=192MiB -T1) > .carry/gpu-s56b.tar.xz
#   carry .carry/env.sh, .carry/debs, .carry/gpu-s56b.tar.xz
set -u
source .carry/env.sh
mkdir -p s56b && tar -xJf .carry/gpu-s56b.tar.xz -C s56b || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
B=s56b/build
FM_TEST_FILTER=test_gdn_decode_fused timeout 150 $B/test_cuda_ops_fused > $L/gdn_ops.log 2>&1
echo "== test_gdn_decode_fused rc $? $SECONDS s: $(grep -c 'bit for bit' $L/gdn_ops.log) bit-for-bit lines"
grep -E "FAIL|rror|\+ ba" $L/gdn_ops.log | head -8
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for v in off ba both both ba off; do
  X=; [ $v = ba ] && X=,gdn.decode_ba=on; [ $v = both ] && X=,gdn.decode_ba=on,gdn.early_state=on
  f=$L/next_${v}_$SECONDS.log
  timeout 100 $B/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
    --steps 32 --batch 1,64 --route $R$X > $f 2>&1
  echo "== next $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | head -2 | cut -d'|' -f3,4 | tr '\n' ' ')
done
# --lm-head dense (the lm_head in the dense projections' format: int4-tc W4A8 under fp8, e4m3 per tensor under
# --dense w8a8), Qwen3-30B-A3B, float / dense / dense / float
for v in float dense dense float; do
  [ $SECONDS -gt 420 ] && break
  f=$L/lm_head_${v}_$SECONDS.log
  timeout 100 $B/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8,fp8+w8a8 --backend cuda \
    --steps 32 --batch 1,64 --route $R --lm-head $v > $f 2>&1
  echo "== 30b lm_head $v rc $? $SECONDS s:" $(grep -E '^\| fp8(\+w8a8)? \| [0-9]+ \| [0-9.]+ \|' $f | head -4 | cut -d'|' -f2,3,4 | tr '\n' ' ')
done
left=$((${CALL_S:-560} - SECONDS)); LIM=$((left > 30 ? left : 30))
echo "== tests, $LIM s each"
t() { # name, command...: in the background, all at once (correctness only)
  local name=$1; shift
  (timeout $LIM "$@" > $L/$name.log 2>&1; echo $? > $L/$name.rc) &
}
FM_TEST_FILTER=test_gdn_decode_fused t memcheck compute-sanitizer --tool memcheck $B/test_cuda_ops_fused
t generate $B/test_cuda_generate --route gdn.decode_ba=on,gdn.early_state=on
t models $B/test_cuda_models
wait
for n in memcheck generate models; do
  echo "== $n rc $(cat $L/$n.rc): $(grep -cE 'bit for bit' $L/$n.log) bit-for-bit lines"
  grep -E "FAIL|PASSED|rror|ERROR SUMMARY" $L/$n.log | head -4
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
