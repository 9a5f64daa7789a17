#!/bin/bash
# paged.tiled on by default from sm_90 (pack .carry/gpu-tests-s28.tar.xz): the GPU tests whose steps hold prompt
# chunks, 10 at a time, then the server's arrivals and multi-turn rows with the default (tiled) and paged.tiled=off
set -u
[ -x build/tests/gpu/test_cuda_ops ] || tar -xJf .carry/gpu-tests-s28.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
T=./build/tests/gpu; L=/tmp/l7; mkdir -p $L; t0=$SECONDS
# B = 1: the lab variant without griddepcontrol (pdl_wait compiled to nothing) against new, both with pdl=off
mkdir -p build/variant; xz -dc .carry/s28/variant-fp8moe-bench.xz > build/variant/fp8moe-bench; chmod +x build/variant/fp8moe-bench
c=(--synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda)
row() { local l=$1 b=$2; shift 2; timeout 40 $b decode "$@" > $L/$l.log 2>&1
  echo "$l $(grep -E '^\| fp8' $L/$l.log | head -1 | awk -F'|' '{print $4}')" | tee -a $OUT/rows.txt; }
for r in 1 2; do
  row new_off_r$r build/fp8moe-bench "${c[@]}" --route pdl=off; row var_off_r$r build/variant/fp8moe-bench "${c[@]}" --route pdl=off
  row new_r$r build/fp8moe-bench "${c[@]}"
done
echo "rows $((SECONDS-t0)) s"
export OMP_NUM_THREADS=2 T L OUT
cat > /tmp/jobs7 <<'J'
prefix|100|$T/test_cuda_prefix_cache
prefix_off|100|$T/test_cuda_prefix_cache --route paged.tiled=off
qnext|100|$T/test_cuda_qnext
mixed|100|$T/test_cuda_mixed_steps
generate|100|$T/test_cuda_generate
models|100|$T/test_cuda_models
graph|100|$T/test_cuda_graph
warmup|100|$T/test_cuda_warmup
prequant|100|$T/test_cuda_prequant
shared|100|$T/test_cuda_shared_routing
offload|100|$T/test_cuda_offload
sampler|100|$T/test_cuda_sampler
nccl|100|$T/test_cuda_nccl
rc_fold_nopdl|100|compute-sanitizer --tool racecheck --error-exitcode 3 $T/test_cuda_fold --route pdl=off
J
job() { IFS='|' read -r n lim cmd <<< "$1"; local s=$SECONDS
  eval timeout $lim $cmd > $L/$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s" | tee -a $OUT/tests.txt; }
export -f job
timeout 110 xargs -d '\n' -P 12 -I{} bash -c 'job "$@"' _ {} < /tmp/jobs7 > $L/summary.txt 2>&1
sort -k3 $L/summary.txt | tr '\n' ';'; echo; echo "tests $((SECONDS-t0)) s"
grep -hE "^\[  FAILED|request .* token|tiny-code-moe +fp4|ERROR SUMMARY" $L/*.log | head -12
tar -czf $OUT/l7.tgz -C /tmp l7
o=(--synthetic qwen3-30b-a3b --backend cuda --preset fp8 --dense w8a8 --max-seqs 64 --ctx 8192 --max-conns-per-client 256)
arr=(--vocab 4096 --clients 8 --workload arrivals --prompt-tokens 128 --max-tokens 1024 --probe-prompt-tokens 1800 --duration 12)
mt=(--vocab 4096 --clients 8 --workload multi-turn --turns 2 --prompt-tokens 3584 --max-tokens 256 --turn-tokens 128 --duration 12)
for r in "" "--route paged.tiled=off"; do
  lab=tiled; [ -n "$r" ] && lab=split
  SERVE_BENCH_PY=1 FP8MOE_BIN=build/fp8moe timeout 100 bench/serve_bench.sh "${o[@]}" $r -- "${arr[@]}" -- "${mt[@]}" > $OUT/serve_$lab.log 2>&1
  echo "serve $lab rc $? $((SECONDS-t0)) s"; grep -E '^\|' $OUT/serve_$lab.log | grep -vE '^\|--|clients' | cut -c1-220
done
