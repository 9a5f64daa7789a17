#!/bin/bash
# session 30, call 3 (pack .carry/gpu-bench-s30.tar.xz: HEAD's fp8moe and fp8moe-bench in build/, b5c95b4's (RESULTS
# 2.18's "new") in build/base): decode with gemv.prefetch off / on / dense / experts, two rounds, base once; Qwen3-Next
# off / on; --per-op at B = 1 off / on; the predictions in bench/NOTES.md (twenty-eighth session); ~300 s
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s30.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow base build/base/fp8moe-bench "${c[@]}"
for r in 1 2; do
  drow off_r$r build/fp8moe-bench "${c[@]}" --route gemv.prefetch=off
  drow on_r$r build/fp8moe-bench "${c[@]}" --route gemv.prefetch=on
  drow dense_r$r build/fp8moe-bench "${c[@]}" --route gemv.prefetch=dense
  drow experts_r$r build/fp8moe-bench "${c[@]}" --route gemv.prefetch=experts
  drow qoff_r$r build/fp8moe-bench "${q[@]}" --route gemv.prefetch=off
  drow qon_r$r build/fp8moe-bench "${q[@]}" --route gemv.prefetch=on
done
# B = 8 with the experts on the grouped GEMVs (64 pairs; never measured against the grouped GEMM), the router fused too
b8=(--synthetic qwen3-30b-a3b --batch 8 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
for r in 1 2; do
  drow b8gemm_r$r build/fp8moe-bench "${b8[@]}"
  drow b8gemv_r$r build/fp8moe-bench "${b8[@]}" --route moe.gemv=64
  drow b8gemvrf_r$r build/fp8moe-bench "${b8[@]}" --route moe.gemv=64 --route router.fused=on
done
# per op without a graph, B = 1 (the GEMVs' own time with the prefetch, launches apart)
for v in off on; do timeout 60 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 \
  --backend cuda --per-op --route gemv.prefetch=$v > $OUT/perop_$v.log 2>&1; echo "perop $v rc $? $((SECONDS-t0)) s"; done
