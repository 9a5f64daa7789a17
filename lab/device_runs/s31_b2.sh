#!/bin/bash
# session 29 (s31 scripts): route gemv.groups (K groups a warp of the W4A8 decode GEMVs aims at; auto = 4) at 4, 2, 1,
# 8 against b5c95b4 (build/base from gpu-bench-s30: the same kernels, auto = 4): decode two rounds, Qwen3-Next B = 1,
# then ncu durations of the W4A8 GEMVs (2 layers) at each value
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s30.tar.xz build/base || exit 1
tar -xJf .carry/gpu-bench-s31.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
drow base build/base/fp8moe-bench "${c[@]}"
for r in 1 2; do for g in 4 2 1 8; do drow g${g}_r$r build/fp8moe-bench "${c[@]}" --route gemv.groups=$g; done; done
drow qbase build/base/fp8moe-bench "${q[@]}"
for g in 4 2 1 8; do drow q$g build/fp8moe-bench "${q[@]}" --route gemv.groups=$g; done
for g in 4 2 1 8; do
  timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size --csv \
    -k regex:w4a8_gemv_kernel --launch-skip 8 --launch-count 8 build/fp8moe-bench decode --synthetic qwen3-30b-a3b \
    --batch 1 --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off \
    --route gemv.groups=$g > $OUT/ncu_g$g.csv 2>/dev/null; echo "ncu g$g rc $? $((SECONDS-t0)) s"
  grep gpu__time_duration $OUT/ncu_g$g.csv | awk -F'","' '{split($5,a,"(");print a[1], $9, $NF}'
done
