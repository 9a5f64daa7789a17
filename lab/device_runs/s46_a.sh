#!/bin/bash
# forty-second session, one call: s45_a.sh on main's newer programs (the swapped decode attention and the dense W4A8
# GEMV in 16-row chunks, the W8A8 quantizer's fused launch to 64 blocks): (1) route paged.swap under its op tests, then decode A/B in one binary (off, on, x2) on both
# caches; (2) route w4a8.gemv_max_m (16, 64) under its op test, then decode A/B at B = 32 and 64 (fp8: int4 dense
# projections); (3) route w8a8.quant (auto, fused) under its op tests, decode fp8 + w8a8 at B = 32 and 64, and the fp8 +
# w8a8 per-op table at B = 64; (4) s44_a's fold tests (the 16-rows threshold, base; the
# split blocks, new) and bench moe + prefill of base against the split blocks. Carry .carry/env.sh, .carry/debs,
# .carry/gpu-s44a.tar.xz and .carry/gpu-s46b.tar.xz (`OUT=.carry/gpu-s46b.tar.xz tools/gpu-pack-ab.sh fp8moe-bench
# tests/gpu/test_cuda_ops`: main's programs, unpacked under sw/build/new/).
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
tar -xJf .carry/gpu-s44a.tar.xz || exit 1
mkdir -p sw && tar -xJf .carry/gpu-s46b.tar.xz -C sw || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
S=sw/build/new B=build N=build/new
# the tests, side by side (the GPU is shared; no timing here)
(FM_TEST_FILTER=test_paged_e4m3 timeout ${TT:-170} $S/test_cuda_ops > $L/swap_e4m3.log 2>&1; echo "== rc $? $SECONDS s" >> $L/swap_e4m3.log) &
(FM_TEST_FILTER=test_paged_attention timeout ${TT:-170} $S/test_cuda_ops > $L/swap_bf16.log 2>&1; echo "== rc $? $SECONDS s" >> $L/swap_bf16.log) &
(FM_TEST_FILTER=test_linear_w4a8_chunks timeout ${TT:-170} $S/test_cuda_ops > $L/chunks.log 2>&1; echo "== rc $? $SECONDS s" >> $L/chunks.log) &
(FM_TEST_FILTER='test_linear_w8a8*' timeout ${TT:-170} $S/test_cuda_ops > $L/w8a8q.log 2>&1; echo "== rc $? $SECONDS s" >> $L/w8a8q.log) &
(timeout ${TT:-170} $N/test_cuda_fold > $L/fold_new.log 2>&1; echo "== rc $? $SECONDS s" >> $L/fold_new.log) &
(timeout ${TT:-170} $B/test_cuda_fold > $L/fold_base.log 2>&1; echo "== rc $? $SECONDS s" >> $L/fold_base.log) &
wait
for f in swap_e4m3 swap_bf16 chunks w8a8q fold_new fold_base; do
  echo "-- $f: $(tail -1 $L/$f.log)"; grep -E "FAILED|ERROR|Assert|fail|illegal" $L/$f.log | cut -c1-200 | head -6
  grep -E "PASSED" $L/$f.log | head -2
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32)
for kv in e4m3 auto; do for r in off on x2; do
  [ $kv = auto ] && [ $r = x2 ] && continue # x2 is the e4m3 form's
  left 45 || break
  f=$L/dec_${kv}_$r.log; timeout 120 $S/fp8moe-bench "${D[@]}" --batch 8,64 --kv-cache $kv --route paged.swap=$r --per-op \
    > $f 2>&1; echo "== decode kv $kv swap $r rc $? $SECONDS s"
  grep -E "^\| fp8 " $f | cut -c1-110; grep -E "attention \(paged\)|step total" $f | cut -c1-110
done; done
# the dense W4A8 GEMV in chunks (fp8: int4 dense projections), B = 32 and 64, graphs on, two rounds alternating
for rd in 1 2; do for m in 16 64; do
  left 40 || break
  f=$L/chunks_${m}_$rd.log; timeout 60 $S/fp8moe-bench "${D[@]}" --batch 32,64 --route w4a8.gemv_max_m=$m > $f 2>&1
  echo "== decode w4a8.gemv_max_m=$m round $rd rc $? $SECONDS s"; grep -E "^\| fp8 " $f | cut -c1-110
done; done
if left 40; then
  f=$L/chunks_64_perop.log; timeout 60 $S/fp8moe-bench "${D[@]}" --batch 64 --route w4a8.gemv_max_m=64 --per-op > $f 2>&1
  echo "== decode per-op w4a8.gemv_max_m=64 rc $? $SECONDS s"; grep -E "qkv_proj|o_proj|step total" $f | cut -c1-110
fi
# the W8A8 quantizer's fused launch past 8 blocks (fp8 + w8a8), B = 32 and 64, two rounds alternating
for rd in 1 2; do for q in auto fused; do
  left 40 || break
  f=$L/w8a8q_${q}_$rd.log; timeout 60 $S/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8+w8a8 \
    --backend cuda --steps 32 --batch 32,64 --route w8a8.quant=$q > $f 2>&1
  echo "== decode w8a8.quant=$q round $rd rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-110
done; done
# the per-op table of fp8 + w8a8 at B = 64 on the e4m3 cache, swap on (what the dense projections take)
if left 45; then
  f=$L/dec_w8a8_on.log; timeout 60 $S/fp8moe-bench decode --synthetic qwen3-30b-a3b \
    --context 2048 --presets fp8+w8a8 --backend cuda --steps 32 --batch 64 --kv-cache e4m3 \
    --route paged.swap=on,w8a8.quant=fused --per-op > $f 2>&1; echo "== decode w8a8 e4m3 on rc $? $SECONDS s"; grep -E "^\| " $f | cut -c1-110
fi
for b in $B $N; do
  left 40 || break
  f=$L/moe_${b//\//_}.log; timeout 80 $b/fp8moe-bench moe --shape qwen3 --routes fp8-grouped,fp8-fold-ws \
    --tokens 512,2048,8192 --backend cuda > $f 2>&1; echo "== moe $b rc $? $SECONDS s"; grep -E "^\| fp8" $f | cut -c1-100
done
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 3)
for b in $B $N; do
  left 40 || break
  f=$L/pre_${b//\//_}.log; timeout 80 $b/fp8moe-bench "${P[@]}" --int4-scales p2 --route w4a8.kernel=fold > $f 2>&1
  echo "== prefill fold $b rc $? $SECONDS s"; grep -E "^latency|^\| experts" $f | cut -c1-120
done
echo "== $SECONDS s"
