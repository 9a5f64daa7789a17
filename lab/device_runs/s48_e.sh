#!/bin/bash
# forty-fourth session: the sampler's log-sum-exp a load's 8 logits at a time (.carry/gpu-s48e.tar.xz) against the
# binary of s48_c (.carry/gpu-s48c.tar.xz: two passes; s48_d has the online form a logit at a time against it), the
# split routes given to both. (1) test_cuda_sampler, test_cuda_generate,
# test_cuda_graph on the new binary; (2) fp8 decode B = 1, 8, 64, the two alternating, two rounds; (3)
# sample_kernel under ncu at B = 1 and 64 (each binary; the last two launches).
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s48c.tar.xz, .carry/gpu-s48e.tar.xz.
set -u
LIMIT=${LIMIT:-400}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s48c s48e && tar -xJf .carry/gpu-s48c.tar.xz -C s48c && tar -xJf .carry/gpu-s48e.tar.xz -C s48e || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for t in sampler generate graph; do
  timeout 150 s48e/build/new/test_cuda_$t > $L/test_$t.log 2>&1
  echo "== test_cuda_$t rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_$t.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_$t.log) failed"
  grep -E "vocab .*differ|FAIL" $L/test_$t.log | head -8
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --route $R)
for rd in 1 2; do for b in two new; do
  left 30 || break
  B=s48$(case $b in two) echo c;; new) echo e;; esac)/build/new
  f=$L/dec_${b}_$rd.log; timeout 90 $B/fp8moe-bench "${D[@]}" --batch 1,8,64 > $f 2>&1
  echo "== decode $b round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
for b in two new; do for bb in 1 64; do
  left 40 || break
  B=s48$(case $b in two) echo c;; new) echo e;; esac)/build/new
  f=$L/ncu_sample_${b}_$bb.txt
  timeout 60 ncu --kernel-name sample_kernel --launch-count 200 --cache-control none \
    --clock-control none --metrics gpu__time_duration.sum $B/fp8moe-bench decode --synthetic qwen3-30b-a3b \
    --layers 2 --batch $bb --context 256 --presets fp8 --backend cuda --warmup 1 --steps 4 \
    --route decode.graphs=off,$R > $f 2>&1
  echo "== ncu sample $b B=$bb rc $? $SECONDS s: $(grep gpu__time_duration $f | tail -2 | sed 's/  */ /g' | tr '\n' ' ')"
done; done
# (4) the B = 64 routing kernel's SASS (ncu source page): where its ~11 us go (the prefill of 64 sequences x 2
# layers launches it 128 times first; grid 16 is a decode step's)
if left 40; then
  timeout 90 ncu --kernel-name route_warp_kernel --launch-skip 132 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight --section LaunchStats --import-source yes -o $L/src_route -f \
    s48e/build/new/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch 64 --context 256 --presets fp8 \
    --backend cuda --warmup 1 --steps 4 --route decode.graphs=off,$R > $L/src_route_collect.txt 2>&1
  echo "== ncu route rc $? $SECONDS s"; grep -E "Duration|Registers|Stall|Grid Size|Block Size" $L/src_route_collect.txt | sed 's/  */ /g' | head
  timeout 60 ncu -i $L/src_route.ncu-rep --page source --print-source sass --csv > $L/src_route_sass.csv 2>&1
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
