#!/bin/bash
# forty-third session, one call: (1) the GPU suite under the new `w4a8.gemv_max_m` default (64 rows: the fp8
# preset's decode paths at 17..64 rows), (2) cuBLASLt FP8's candidates and split-K at decode sizes (lab/lt_decode:
# does any beat the heuristic's first at q|k|v and o, n 1..64?), then s46_c.sh's rows (paged.swap by batch, the
# chunked GEMV's K slices, ncu stall reasons) on the remaining time.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s47a.tar.xz, build/lab/lt_decode (the bundled model is models/; s46_c.sh
# runs on this pack's fp8moe-bench, the same routes as gpu-s46b's).
set -u
LIMIT=${LIMIT:-540}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s47 && tar -xJf .carry/gpu-s47a.tar.xz -C s47 || exit 1
mkdir -p sw/build && ln -sfn ../../s47/build/new sw/build/new
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
T=s47/build/new
for t in "generate|$T/test_cuda_generate" "graph|$T/test_cuda_graph" "mixed|$T/test_cuda_mixed_steps" \
         "qnext|$T/test_cuda_qnext" "tp|$T/test_cuda_tp" \
         "chunks|env FM_TEST_FILTER=test_linear_w4a8* $T/test_cuda_ops"; do
  n=${t%%|*}; c=${t#*|}
  left 60 || break
  timeout 150 $c > $L/suite_$n.log 2>&1; rc=$?
  echo "== suite $n rc $rc $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/suite_$n.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/suite_$n.log) failed"
  [ $rc = 0 ] || tail -5 $L/suite_$n.log
done
if left 90; then
  timeout 120 build/lab/lt_decode > $L/lt_decode.log 2>&1; echo "== lt_decode rc $? $SECONDS s"
  grep SUMMARY $L/lt_decode.log
fi
echo "== $SECONDS s, s46_c rows next"
LIMIT=$((LIMIT - SECONDS - 130)) bash lab/device_runs/s46_c.sh
# the SASS of both decode attention kernels with per-instruction counts and stall samples (ncu source page; the
# engine is built with -lineinfo), for the tile's instruction budget (bench/NOTES.md, forty-second session)
S=sw/build/new
for r in on off; do
  [ $((SECONDS + 60)) -le ${LIMIT_ALL:-$LIMIT} ] || break
  k=aps_kernel; [ $r = off ] && k=apg_split_kernel
  timeout 100 ncu --kernel-name regex:$k --launch-skip 4 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --import-source yes -o $L/src_$r -f $S/fp8moe-bench decode --synthetic qwen3-30b-a3b \
    --layers 2 --batch 64 --context 2048 --presets fp8 --backend cuda --kv-cache e4m3 \
    --route decode.graphs=off,paged.swap=$r > $L/src_${r}_collect.txt 2>&1
  timeout 60 ncu -i $L/src_$r.ncu-rep --page source --print-source sass --csv > $L/src_${r}_sass.csv 2>&1
  echo "== ncu source $r rc $? $(wc -l < $L/src_${r}_sass.csv) lines"; xz -9 $L/src_${r}_sass.csv
done
echo "== all $SECONDS s"
