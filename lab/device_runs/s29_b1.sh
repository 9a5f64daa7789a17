#!/bin/bash
# session 29, call 3 (pack .carry/gpu-bench-s29.tar.xz: HEAD's fp8moe and fp8moe-bench in build/, 49fe1e5's in
# build/base): decode base / new / new dense.quant=fused / new with moe.down_quant=fused too, two rounds (predictions
# in bench/NOTES.md, twenty-seventh session), Qwen3-Next, the down GEMV's time under ncu (B = 1, 8 layers, base and new alternating); ~330 s
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s29.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do
  drow base_r$r build/base/fp8moe-bench "${c[@]}"
  drow new_r$r build/fp8moe-bench "${c[@]}"
  drow dquant_r$r build/fp8moe-bench "${c[@]}" --route dense.quant=fused
  drow quants_r$r build/fp8moe-bench "${c[@]}" --route dense.quant=fused --route moe.down_quant=fused
  drow qbase_r$r build/base/fp8moe-bench "${q[@]}"
  drow qnew_r$r build/fp8moe-bench "${q[@]}"
done
for r in 1 2; do for v in base new; do b=build/fp8moe-bench; [ $v = base ] && b=build/base/fp8moe-bench
  timeout 90 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
    $b decode --synthetic qwen3-30b-a3b --layers 8 --batch 1 --context 2048 --presets fp8 --steps 2 --warmup 1 \
    > /tmp/n_${v}_$r.csv 2>/dev/null; echo "ncu $v $r rc $? $((SECONDS-t0)) s"; done; done
python3 lab/device_runs/ncu_diff.py 116 /tmp/n_base_1.csv,/tmp/n_base_2.csv /tmp/n_new_1.csv,/tmp/n_new_2.csv | tee $OUT/ncu_diff.md | head -8
