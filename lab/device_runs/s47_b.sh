#!/bin/bash
# forty-third session, one call on the pack of the working tree (.carry/gpu-s47b.tar.xz: fp8moe-bench, test_cuda_ops,
# the suite): (1) the split-K dense W4A8 GEMM's op test (route w4a8.splits) and the GPU suite under the chunked GEMV
# default (w4a8.gemv_max_m = 64); (2) fp8 decode at B = 32, 64: the default (GEMV chunks) / the unsplit GEMM
# (w4a8.gemv_max_m=16) / the split GEMM (w4a8.gemv_max_m=16,w4a8.splits=fill), two rounds, and per op at B = 64;
# (3) cuBLASLt FP8's candidates at decode sizes (lab/lt_decode); (4) memcheck of the split kernel; (5) s46_c.sh's
# rows and the attention kernels' SASS under ncu on the time left.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s47b.tar.xz, build/lab/lt_decode.
set -u
LIMIT=${LIMIT:-540}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s47 && tar -xJf ${PACK:-.carry/gpu-s47b.tar.xz} -C s47 || exit 1
mkdir -p sw/build && ln -sfn ../../s47/build/new sw/build/new
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
T=s47/build/new
suite() { # name, command...
  local n=$1; shift
  left 40 || return
  timeout 150 "$@" > $L/suite_$n.log 2>&1; local rc=$?
  echo "== $n rc $rc $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/suite_$n.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/suite_$n.log) failed"
  [ $rc = 0 ] || tail -4 $L/suite_$n.log
}
suite w4a8_ops env FM_TEST_FILTER='test_linear_w4a8*' $T/test_cuda_ops
S=$T
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32)
decode_round() {
  for r in default unsplit split; do
    left 40 || break
    case $r in default) R=pdl=auto;; unsplit) R=w4a8.gemv_max_m=16;; split) R=w4a8.gemv_max_m=16,w4a8.splits=fill;; esac
    f=$L/dec_${r}_$1.log; timeout 90 $S/fp8moe-bench "${D[@]}" --batch 32,64 --route $R > $f 2>&1
    echo "== decode $r round $1 rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \|" $f | cut -c1-80
  done
}
decode_round 1
for r in default split; do
  left 40 || break
  R=pdl=auto; [ $r = split ] && R=w4a8.gemv_max_m=16,w4a8.splits=fill
  f=$L/perop_$r.log; timeout 60 $S/fp8moe-bench "${D[@]}" --batch 64 --route $R --per-op > $f 2>&1
  echo "== per-op B=64 $r rc $? $SECONDS s"; grep -E "qkv_proj|o_proj|^\| fp8 \| 64" $f | cut -c1-100
done
if left 100; then
  FM_TEST_FILTER='test_linear_w4a8_splits' timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 \
    $T/test_cuda_ops > $L/memcheck_splits.log 2>&1
  echo "== memcheck splits rc $? $SECONDS s"; tail -3 $L/memcheck_splits.log
fi
if left 70; then
  timeout 120 build/lab/lt_decode > $L/lt_decode.log 2>&1; echo "== lt_decode rc $? $SECONDS s"
  grep SUMMARY $L/lt_decode.log
fi
decode_round 2
for t in generate graph mixed_steps qnext tp; do suite $t $T/test_cuda_$t; done
echo "== $SECONDS s, s46_c rows next"
left 100 && LIMIT=$((LIMIT - SECONDS - 100)) bash lab/device_runs/s46_c.sh
S=sw/build/new
for r in on off; do
  left 60 || break
  k=aps_kernel; [ $r = off ] && k=apg_split_kernel
  timeout 100 ncu --kernel-name regex:$k --launch-skip 4 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --import-source yes -o $L/src_$r -f $S/fp8moe-bench decode --synthetic qwen3-30b-a3b \
    --layers 2 --batch 64 --context 2048 --presets fp8 --backend cuda --kv-cache e4m3 \
    --route decode.graphs=off,paged.swap=$r > $L/src_${r}_collect.txt 2>&1
  timeout 60 ncu -i $L/src_$r.ncu-rep --page source --print-source sass --csv > $L/src_${r}_sass.csv 2>&1
  echo "== ncu source $r rc $? $(wc -l < $L/src_${r}_sass.csv) lines"; xz -9 $L/src_${r}_sass.csv
done
echo "== all $SECONDS s"
