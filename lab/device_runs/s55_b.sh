#!/bin/bash
# Fiftieth session, second call: the MoE block's tail by the last CTA to arrive (af1e85b, "new": grid_arrive_last, no
# CTA polls the last barrier; the tail's norm weights staged in shared memory), then the first ranking above 256
# candidates on the keys at or above the kc-th largest lane maximum (f6df502, "new2": slice_top), against ddb2346
# ("old", s55_all.sh's new).
#   1 test_moe_persistent and test_moe_block_barriers (both barrier forms, grids in turn) on new2
#   2 decode B = 1, three rounds (old new new2 new2 new old old new new2), Qwen3-Next and Qwen3-30B-A3B; the phase
#     clocks of the three (-DMDB_TIMES)
#   3 memcheck of test_moe_persistent; test_cuda_ops_fused whole, test_cuda_generate, test_cuda_qnext at once (new2)
# Pack .carry/gpu-s55b.tar.xz: build/old/{fp8moe-bench,fp8moe-bench-mdb} (ddb2346, s55_all.sh's build/new),
# build/new/{fp8moe-bench,fp8moe-bench-mdb} (af1e85b) and build/new2/{fp8moe-bench,fp8moe-bench-mdb,
# test_cuda_ops_fused,test_cuda_generate,test_cuda_qnext} (f6df502).
set -u
source .carry/env.sh
mkdir -p s55b && tar -xJf .carry/gpu-s55b.tar.xz -C s55b || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
L=$OUT/logs; mkdir -p $L
N=s55b/build/new2
for f in test_moe_persistent test_moe_block_barriers; do
  FM_TEST_FILTER=$f timeout 120 $N/test_cuda_ops_fused > $L/$f.log 2>&1
  echo "== $f rc $? $SECONDS s: $(grep -c 'bit for bit' $L/$f.log) bit-for-bit lines"
  grep -E "FAIL|rror" $L/$f.log | head -5
done
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for m in qwen3-next-80b-a3b qwen3-30b-a3b; do
  for v in old new new2 new2 new old old new new2; do
    f=$L/${m}_${v}_$SECONDS.log
    timeout 60 s55b/build/$v/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1 \
      --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | head -1 | cut -d'|' -f3,4)
  done
done
for v in old new new2; do
  for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
    timeout 60 s55b/build/$v/fp8moe-bench-mdb decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 \
      --route $R > $L/mdb_${v}_$m.log 2>&1
    echo "== mdb $v $m rc $?"
    grep -E "^mdbt? " $L/mdb_${v}_$m.log | tail -4000 | python3 lab/device_runs/mdb_medians.py $MHZ
  done
done
left=$((${CALL_S:-400} - SECONDS)); LIM=$((left > 30 ? left : 30))
echo "== tests, $LIM s each"
t() { # name, command...: in the background, all at once (correctness only)
  local name=$1; shift
  (timeout $LIM "$@" > $L/$name.log 2>&1; echo $? > $L/$name.rc) &
}
FM_TEST_FILTER=test_moe_persistent t memcheck compute-sanitizer --tool memcheck $N/test_cuda_ops_fused
t ops_fused $N/test_cuda_ops_fused
t generate $N/test_cuda_generate
t qnext $N/test_cuda_qnext
wait
for n in memcheck ops_fused generate qnext; do
  echo "== $n rc $(cat $L/$n.rc): $(grep -cE 'bit for bit' $L/$n.log) bit-for-bit lines"
  grep -E "FAIL|PASSED|rror|ERROR SUMMARY" $L/$n.log | head -4
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
