#!/bin/bash
# forty-seventh session: paged.early_kv's exact bound and the swapped kernel's early tiles (ce4131c), against
# cb8cdb0 (the s51_f pack: the old bound, the swapped kernel without early tiles; its early_l2 route off by
# default, so the same defaults). Carry .carry/env.sh, .carry/debs, .carry/gpu-s51f.tar.xz, .carry/gpu-s52a.tar.xz
# (`OUT=.carry/gpu-s52a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops tests/gpu/test_cuda_generate`).
# fp8 decode B = 1, 8, 64 (bf16 cache): base, new, new paged.swap=on, new paged.combine=fused; e4m3 cache B = 8, 64:
# new paged.swap=off / on; two rounds alternating. Then test_paged_e4m3, test_cuda_generate with paged.swap=on,
# test_paged_attention (every early_kv pair bit for bit), as time allows.
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
mkdir -p s51 s52 && tar -xJf .carry/gpu-s51f.tar.xz -C s51 && tar -xJf .carry/gpu-s52a.tar.xz -C s52 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=s51/build/new; N=s52/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
for rd in 1 2; do
  for v in base new swap fused; do
    bin=$N; r=$R
    case $v in base) bin=$B ;; swap) r=$R,paged.swap=on ;; fused) r=$R,paged.combine=fused ;; esac
    f=$L/dec_${v}_$rd.log; timeout 60 $bin/fp8moe-bench "${D[@]}" --batch 1,8,64 --route $r > $f 2>&1
    echo "== bf16 $v round $rd rc $? $SECONDS s: $(row $f)"
  done
  for v in off on; do
    f=$L/e4m3_${v}_$rd.log; timeout 60 $N/fp8moe-bench "${D[@]}" --batch 8,64 --kv-cache e4m3 --route $R,paged.swap=$v > $f 2>&1
    echo "== e4m3 swap=$v round $rd rc $? $SECONDS s: $(row $f)"
  done
done
t() { # NAME FILTER LIMIT
  left $3 || { echo "== $1 skipped (time)"; return; }
  FM_TEST_FILTER=$2 timeout $3 $N/test_cuda_ops > $L/$1.log 2>&1
  echo "== $1 rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/$1.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/$1.log) failed, $(grep -c 'early_kv=on.*bit for bit' $L/$1.log) early_kv pairs"
  grep -E "FAIL|rror" $L/$1.log | cut -c1-200 | head -4
}
t test_paged_e4m3 test_paged_e4m3 150
if left 150; then
  timeout 150 $N/test_cuda_generate --route paged.swap=on > $L/generate_swap.log 2>&1
  echo "== test_cuda_generate paged.swap=on rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/generate_swap.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/generate_swap.log) failed"
  grep -E "FAIL|rror" $L/generate_swap.log | cut -c1-200 | head -4
fi
t test_paged_attention test_paged_attention 200
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
