#!/bin/bash
# per-kernel B = 1 table of base and HEAD in one call, alternating (same clocks)
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s27.tar.xz || exit 1
t0=$SECONDS
for r in 1 2; do for v in base new; do b=build/fp8moe; [ $v = base ] && b=build/base/fp8moe
timeout 90 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
  $b bench decode --synthetic qwen3-30b-a3b --layers 8 --batch 1 --context 2048 --presets fp8 --steps 2 --warmup 1 \
  > /tmp/n_${v}_$r.csv 2>/dev/null; echo "ncu $v $r rc $? $((SECONDS-t0)) s"
xz -c /tmp/n_${v}_$r.csv > $OUT/n_${v}_$r.csv.xz
python3 lab/device_runs/ncu_sum.py /tmp/n_${v}_$r.csv 116 | tail -1
done; done
