#!/bin/bash
# Fiftieth session, one call (refused starts cost ~2 minutes each: everything in one script). The persistent MoE
# block's top-k on 64-bit keys with its weights by warp 0's lanes, its tail's 8 routed rows at once and its quantizer
# from registers (ddb2346) against the session's start (b7e410d):
#   1 test_moe_persistent on the new binary (bit for bit against the chain), the correctness gate
#   2 decode, three rounds ABBA: Qwen3-Next B = 1, 64; Qwen3-30B-A3B fp8 B = 1, 8, 64 (the combine kernel's quantizer
#     from registers runs above one token)
#   3 the block's phase clocks (-DMDB_TIMES builds of both trees, with the top-k's pieces and the tail's quantizer)
#   4 Qwen3-Next B = 1 per op (new), ncu's warp states and SASS stall samples of the new block (Qwen3-Next)
#   5 the tests at once with what is left of CALL_S
# Pack .carry/gpu-s55.tar.xz: build/old/{fp8moe-bench,fp8moe-bench-mdb} (b7e410d + the lab stamps of cf290d3) and
# build/new/{fp8moe-bench,fp8moe-bench-mdb,test_cuda_ops_fused,test_cuda_pdl,test_cuda_generate,test_cuda_qnext,
# test_cuda_graph} (ddb2346), stripped, one xz stream. Carry .carry/env.sh, .carry/debs, .carry/gpu-s55.tar.xz.
set -u
source .carry/env.sh
mkdir -p s55 && tar -xJf .carry/gpu-s55.tar.xz -C s55 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
MHZ=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -1)
L=$OUT/logs; mkdir -p $L
O=s55/build/old; N=s55/build/new
FM_TEST_FILTER=test_moe_persistent timeout 120 $N/test_cuda_ops_fused > $L/persistent.log 2>&1
echo "== test_moe_persistent rc $? $SECONDS s: $(grep -c 'bit for bit' $L/persistent.log) bit-for-bit lines"
grep -E "FAIL|rror" $L/persistent.log | head -5
R=w4a8.gemv_max_m=16,w4a8.splits=fill
for m in qwen3-next-80b-a3b qwen3-30b-a3b; do
  B=1,64; [ $m = qwen3-30b-a3b ] && B=1,8,64
  for v in old new new old old new; do
    b=$O; [ $v = new ] && b=$N
    f=$L/${m}_${v}_$SECONDS.log
    timeout 60 $b/fp8moe-bench decode --synthetic $m --context 2048 --presets fp8 --backend cuda --steps 32 --batch $B \
      --route $R > $f 2>&1
    echo "== $m $v rc $? $SECONDS s:" $(grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \|' $f | cut -d'|' -f3,4 | tr '\n' ';')
  done
done
for v in old new; do
  for m in qwen3-30b-a3b qwen3-next-80b-a3b; do
    timeout 60 s55/build/$v/fp8moe-bench-mdb decode --synthetic $m --batch 1 --context 2048 --presets fp8 --steps 64 \
      --route $R > $L/mdb_${v}_$m.log 2>&1
    echo "== mdb $v $m rc $?"
    grep "^mdb" $L/mdb_${v}_$m.log | tail -2000 | python3 lab/device_runs/mdb_medians.py $MHZ
  done
done
timeout 60 $N/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
  --steps 16 --batch 1 --route $R --per-op > $L/next_perop.log 2>&1
echo "== next per-op rc $? $SECONDS s"; grep -E "^\| [a-z]" $L/next_perop.log | head -40
t0=$SECONDS
timeout 150 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:moe_decode_block \
  --launch-skip 60 --launch-count 3 -o /tmp/blk $N/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --batch 1 \
  --context 2048 --steps 2 --warmup 0 --presets fp8 --backend cuda --route $R,decode.graphs=off > $L/ncu_run.log 2>&1
echo "== ncu rc $? $((SECONDS - t0)) s"; tail -2 $L/ncu_run.log
ncu -i /tmp/blk.ncu-rep --page details --csv > $L/ncu_details.csv 2>&1
ncu -i /tmp/blk.ncu-rep --page source --csv --print-source sass > $L/ncu_sass.csv 2>&1
grep -iE "stall|warp cycles per issued" $L/ncu_details.csv | cut -c1-220 | head -30
left=$((${CALL_S:-560} - SECONDS)); LIM=$((left > 30 ? left : 30))
echo "== tests, $LIM s each"
t() { # name, command...: in the background, all at once (correctness only)
  local name=$1; shift
  (timeout $LIM "$@" > $L/$name.log 2>&1; echo $? > $L/$name.rc) &
}
t ops_fused $N/test_cuda_ops_fused
FM_TEST_FILTER=test_same_bits_routes t same_bits $N/test_cuda_pdl
t generate $N/test_cuda_generate
t qnext $N/test_cuda_qnext
t graph $N/test_cuda_graph
wait
for n in ops_fused same_bits generate qnext graph; do
  echo "== $n rc $(cat $L/$n.rc): $(grep -cE 'bit for bit' $L/$n.log) bit-for-bit lines"
  grep -E "FAIL|PASSED|rror" $L/$n.log | head -4
done
(cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs)
echo "== all $SECONDS s"
