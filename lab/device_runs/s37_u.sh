#!/bin/bash
# after the fix (the persistent block only where the chain would run the decode GEMVs on e4m3 rows): the three
# programs that failed in s36_t.sh, the block's op test, generation, and one decode pair at B = 1
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37u.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
cat > /tmp/jobs <<'J'
ep|150|2|$T/test_cuda_ep
prefix|150|2|$T/test_cuda_prefix_cache
offload|150|2|$T/test_cuda_offload
persist|150|8|FM_TEST_FILTER=test_moe_persistent $T/test_cuda_ops_fused
router|150|4|FM_TEST_FILTER=test_router_dispatch_fused $T/test_cuda_ops_fused
generate|150|2|$T/test_cuda_generate
J
job() { IFS='|' read -r n lim th cmd <<< "$1"; local s=$SECONDS
  OMP_NUM_THREADS=$th eval timeout $lim env $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
export -f job; export T L
timeout 170 xargs -d '\n' -P 6 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
sort -k3 $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR:|Aborted|not implemented" $L/*.log | head -10
for v in off on; do
  timeout 40 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 \
    --route moe.persistent=$v > /tmp/d.log 2>&1; echo "decode $v rc $?"; grep -E "^\| fp8" /tmp/d.log | head -1
done
# each op of one B = 1 step without a graph (time, bytes, floor), for the attention block's plan
timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --per-op \
  > /tmp/p.log 2>&1; echo "per-op rc $?"; sed -n "/| kind | op |/,/^$/p" /tmp/p.log | head -40
