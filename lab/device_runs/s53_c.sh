#!/bin/bash
# Forty-eighth session, last call: the session's first binary (0fc8c2d's fp8moe-bench: the generation barrier, the
# merge's 32 predicated preloads, Qwen3-Next's shared expert separate) against its last (HEAD: the count barrier, n
# preloads, moe.shared routed with the persistent block), defaults, on whichever GPU comes: fp8 and fp8 + w8a8 decode
# at B = 1, 8, 64 (ABBA), Qwen3-Next B = 1 and 64 (ABBA), Qwen3-Next B = 1 per op (new); then every GPU test program
# with the new defaults, 10 at a time. Pack: `BASE=0fc8c2d BASE_PROGRAMS=fp8moe-bench OUT=.carry/gpu-s53c.tar.xz
# tools/gpu-pack-ab.sh fp8moe-bench fp8moe tests/gpu/test_*` (every test program, without .c) at the session's last
# code commit. Carry .carry/env.sh, .carry/debs, .carry/gpu-s53c.tar.xz.
set -u
source .carry/env.sh
mkdir -p s53c && tar -xJf .carry/gpu-s53c.tar.xz -C s53c || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
B=s53c/build; N=s53c/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
row() { grep -E '^\| fp8[ +a-z0-9]* \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' $1 | awk -F'|' '{printf "%s B=%s %s; ", $2, $3, $4}'; }
dec() { # old|new ROUND
  local bin=$B; [ $1 = new ] && bin=$N
  local f=$L/dec_$1_$2.log
  timeout 100 $bin/fp8moe-bench decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8,fp8+w8a8 --backend cuda \
    --steps 32 --batch 1,8,64 --route $R > $f 2>&1
  echo "== qwen3-30b $1 round $2 rc $? $SECONDS s: $(row $f)"
}
nxt() { # old|new ROUND
  local bin=$B; [ $1 = new ] && bin=$N
  local f=$L/next_$1_$2.log
  timeout 80 $bin/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
    --steps 32 --batch 1,64 --route $R > $f 2>&1
  echo "== qwen3-next $1 round $2 rc $? $SECONDS s: $(row $f)"
}
if [ "${DEC:-1}" = 1 ]; then # DEC=0: the test suite alone
dec old 1; dec new 1; dec new 2; dec old 2
nxt old 1; nxt new 1; nxt new 2; nxt old 2
timeout 60 $N/fp8moe-bench decode --synthetic qwen3-next-80b-a3b --context 2048 --presets fp8 --backend cuda \
  --steps 16 --batch 1 --route $R --per-op > $L/next_perop.log 2>&1
echo "== qwen3-next per op rc $? $SECONDS s"
fi
T=$N; export T L
s=$SECONDS; timeout 60 $T/test_cuda_memory > $L/memory.log 2>&1; echo "== memory rc $? $((SECONDS-s)) s"
: > /tmp/jobs
for p in $T/test_cuda_*; do
  n=$(basename $p); [ $n = test_cuda_memory ] && continue
  case $n in test_cuda_ops|test_cuda_ops_fused) th=6 ;; *) th=2 ;; esac
  echo "$n|330|$th|$p" >> /tmp/jobs
done
job() { IFS='|' read -r n lim th cmd <<< "$1"; local s=$SECONDS
  OMP_NUM_THREADS=$th timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
export -f job
timeout ${SUITE_S:-345} xargs -d '\n' -P 10 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
echo "== suite $SECONDS s: $(grep -c 'rc 0 ' $L/summary.txt) passed of $(wc -l < /tmp/jobs)"
grep -v 'rc 0 ' $L/summary.txt
grep -hE "^\[  FAILED|ERROR SUMMARY: [1-9]" $L/*.log | head -20
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
