#!/bin/bash
# forty-seventh session: paged attention's merge with its lengths before the PDL wait and the first 32 splits'
# partials loaded with the maxima, RoPE's angles before the wait (7392b14), against ce4131c (the s52_a pack) with
# paged.swap=on (7392b14's default). Carry .carry/env.sh, .carry/debs, .carry/gpu-s52a.tar.xz, .carry/gpu-s52b.tar.xz
# (`OUT=.carry/gpu-s52b.tar.xz tools/gpu-pack-ab.sh fp8moe-bench tests/gpu/test_cuda_ops tests/gpu/test_cuda_generate`).
# fp8 decode B = 1, 8, 64 (bf16 cache), three rounds in the order base new, new base, base new. Then
# test_paged_attention, test_cuda_generate, test_rope_attention and memcheck of test_paged_e4m3, as time allows.
set -u
LIMIT=${LIMIT:-230}
source .carry/env.sh
mkdir -p s52 s53 && tar -xJf .carry/gpu-s52a.tar.xz -C s52 && tar -xJf .carry/gpu-s52b.tar.xz -C s53 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
B=s52/build/new; N=s53/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
row() { grep -E '^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "B=%s %s ", $3, $4}'; }
run() { # NAME ROUND
  local bin=$N r=$R; [ $1 = base ] && bin=$B r=$R,paged.swap=on
  local f=$L/dec_$1_$2.log; timeout 60 $bin/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== $1 round $2 rc $? $SECONDS s: $(row $f)"
}
run base 1; run new 1; run new 2; run base 2; run base 3; run new 3
t() { # NAME FILTER LIMIT [PREFIX...]
  local name=$1 filter=$2 lim=$3; shift 3
  left $lim || { echo "== $name skipped (time)"; return; }
  FM_TEST_FILTER=$filter timeout $lim "$@" $N/test_cuda_ops > $L/$name.log 2>&1
  echo "== $name rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/$name.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/$name.log) failed, $(grep -c 'bit for bit' $L/$name.log) bit-for-bit lines, $(grep -c 'ERROR SUMMARY: 0 errors' $L/$name.log) clean summaries"
  grep -E "FAIL|rror" $L/$name.log | grep -v "ERROR SUMMARY: 0 errors" | cut -c1-200 | head -4
}
t test_paged_attention test_paged_attention 120
if left 60; then
  timeout 60 $N/test_cuda_generate > $L/generate.log 2>&1
  echo "== test_cuda_generate rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/generate.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/generate.log) failed"
  grep -E "FAIL|rror" $L/generate.log | cut -c1-200 | head -4
fi
t test_rope_attention test_rope_attention 30
left 80 && t memcheck_paged_e4m3 test_paged_e4m3 $((LIMIT - SECONDS - 10)) compute-sanitizer --tool memcheck
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
