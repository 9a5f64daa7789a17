#!/bin/bash
# the persistent decode attention block (route attn.persistent): its op test (bit for bit against the chain), the
# refactored split / RoPE kernels' own tests, generation and graphs with the route on, then decode off / on, alternating
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37a.tar.xz || exit 1
T=./build/tests/gpu; L=/tmp/logs; mkdir -p $L
timeout 120 $T/test_cuda_attn_block > $L/ab.log 2>&1; echo "attn_block rc $?"; grep -E "bit for bit|FAILED|rror|bort" $L/ab.log | head -12
cat > /tmp/jobs <<'J'
paged|200|6|env FM_TEST_FILTER=test_paged* $T/test_cuda_ops
rope|150|6|env FM_TEST_FILTER=test_rope_attention $T/test_cuda_ops
persist|150|4|env FM_TEST_FILTER=test_moe_persistent $T/test_cuda_ops_fused
generate|150|2|$T/test_cuda_generate --route attn.persistent=on
graph|150|2|$T/test_cuda_graph --route attn.persistent=on
J
job() { IFS='|' read -r n lim th cmd <<< "$1"; local s=$SECONDS
  OMP_NUM_THREADS=$th eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
export -f job; export T L
timeout 220 xargs -d '\n' -P 5 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs > $L/summary.txt 2>&1
sort $L/summary.txt | tr '\n' ';'; echo
grep -hE "^\[  FAILED|ERROR:|Aborted|not implemented" $L/*.log | head -10
for r in 1 2; do for v in off on; do
  timeout 40 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8,fp8+w8a8 \
    --route attn.persistent=$v > /tmp/d.log 2>&1; echo "decode $v rc $?"; grep -E "^\| fp8" /tmp/d.log | head -2
done; done
