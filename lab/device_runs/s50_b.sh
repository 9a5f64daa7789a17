#!/bin/bash
# forty-fifth session, last call: the session's first binary (.carry/gpu-s49a.tar.xz: 57cb649's fp8moe-bench) against
# its last (.carry/gpu-s50b.tar.xz: 3a98649, dense.quant=producer by default), on whichever GPU comes (for issue 41's
# tables on an H200): fp8 and fp8 + w8a8 decode at B = 1, 8, 64, two rounds alternating, then Qwen3-Next B = 1; then
# test_cuda_generate and test_cuda_graph with the new defaults. Carry .carry/env.sh, .carry/debs and both packs.
set -u
LIMIT=${LIMIT:-330}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s49 s50 && tar -xJf .carry/gpu-s49a.tar.xz -C s49 && tar -xJf .carry/gpu-s50b.tar.xz -C s50 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8,fp8+w8a8 --backend cuda --steps 32 --batch 1,8,64
   --route $R)
for rd in 1 2; do for b in old new; do
  left 50 || break
  B=s49/build/new; [ $b = new ] && B=s50/build/new
  f=$L/dec_${b}_$rd.log; timeout 100 $B/fp8moe-bench "${D[@]}" > $f 2>&1
  echo "== decode $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8[ +a-z0-9]* \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
for b in old new; do
  left 40 || break
  B=s49/build/new; [ $b = new ] && B=s50/build/new
  f=$L/next_${b}.log; timeout 80 $B/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 \
    --backend cuda --steps 32 --batch 1 --route $R > $f 2>&1
  echo "== qwen3-next $b rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \|" $f | cut -c1-80
done
for t in generate graph; do
  left 60 || break
  timeout 100 s50/build/new/test_cuda_$t > $L/test_$t.log 2>&1
  echo "== test_cuda_$t (defaults) rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_$t.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_$t.log) failed"
done
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
