#!/bin/bash
# session 26, next session, call 4: per-kernel times of decode steps under ncu (8 layers), then the serving rows
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s27.tar.xz || exit 1
t0=$SECONDS
# per-kernel times of one decode step (B = 1 at context 2048, B = 64 at 512), 8 layers, each graph node alone under ncu (new binary)
if command -v ncu >/dev/null; then
  for b in 1 64; do
  timeout 100 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
    build/fp8moe bench decode --synthetic qwen3-30b-a3b --layers 8 --batch $b --context $((b==1 ? 2048 : 512)) --presets fp8 --steps 2 --warmup 1 \
    > /tmp/ncu_b$b.csv 2>/tmp/ncu_b$b.err; echo "ncu B=$b rc $? $((SECONDS-t0)) s"
  python3 lab/device_runs/ncu_sum.py /tmp/ncu_b$b.csv $((b==1 ? 116 : 184)) > $OUT/ncu_b$b.md 2>&1; head -30 $OUT/ncu_b$b.md
  done
  timeout 60 build/fp8moe bench decode --synthetic qwen3-30b-a3b --layers 8 --batch 1,64 --context 2048 --presets fp8 > $OUT/layers8.txt 2>&1
  grep -A6 "^| preset" $OUT/layers8.txt | head -12
fi
SERVE_S=20 PART=serve BASE=build/base NEW=build timeout 300 tools/gpu-measure.sh > /tmp/m_serve.txt 2>&1
echo "serve rc $? $((SECONDS-t0)) s"; sed -n "/^### serve/,\$p" $OUT/measure-serve.md
