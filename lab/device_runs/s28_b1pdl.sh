#!/bin/bash
# B = 1 decode: base 8474e61 against HEAD, with and without PDL, and the base's per-kernel table under ncu
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s27.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS; L=/tmp/l5; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda)
row() { local l=$1 b=$2; shift 2; timeout 40 $b bench decode "$@" > $L/$l.log 2>&1
  echo "$l $(grep -E '^\| fp8' $L/$l.log | head -1 | awk -F'|' '{print $4}')" | tee -a $OUT/rows.txt; }
for r in 1 2; do
  row base_r$r build/base/fp8moe "${c[@]}"; row new_r$r build/fp8moe "${c[@]}"
  row base_off_r$r build/base/fp8moe "${c[@]}" --route pdl=off; row new_off_r$r build/fp8moe "${c[@]}" --route pdl=off
  row new_nograph_r$r build/fp8moe "${c[@]}" --route decode.graphs=off; row base_nograph_r$r build/base/fp8moe "${c[@]}" --route decode.graphs=off
done
echo "rows $((SECONDS-t0)) s"
timeout 100 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
  build/base/fp8moe bench decode --synthetic qwen3-30b-a3b --layers 8 --batch 1 --context 2048 --presets fp8 --steps 2 --warmup 1 \
  > /tmp/ncu_base_b1.csv 2>/tmp/ncu_base.err; echo "ncu base rc $? $((SECONDS-t0)) s"
python3 lab/device_runs/ncu_sum.py /tmp/ncu_base_b1.csv 116 > $OUT/ncu_base_b1.md 2>&1; head -40 $OUT/ncu_base_b1.md
xz -c /tmp/ncu_base_b1.csv > $OUT/ncu_base_b1.csv.xz
timeout 40 build/base/fp8moe bench decode --synthetic qwen3-30b-a3b --layers 8 --batch 1 --context 2048 --presets fp8 > $OUT/base_layers8.txt 2>&1
grep -A4 "^| preset" $OUT/base_layers8.txt | head -10
