#!/bin/bash
# session 29, call 6: where dense.quant=fused loses at B = 8 (ncu, new binary, off vs fused), then racecheck of the tiled paged op test alone
# As run it passed dense.quant=off, which the route refuses (values auto|kernel|fused): the first ncu exited 2 and only the
# fused dump exists. The next run must pass dense.quant=kernel.
set -u
ls build/fp8moe-bench build/tests/gpu/test_cuda_ops >/dev/null || exit 1
t0=$SECONDS
for v in off fused; do
  timeout 80 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none --clock-control none --csv \
    build/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 8 --batch 8 --context 2048 --presets fp8 --steps 2 --warmup 1 \
    --route dense.quant=$v > /tmp/q_$v.csv 2>/dev/null; echo "ncu $v rc $? $((SECONDS-t0)) s"; done
python3 lab/device_runs/ncu_mean.py /tmp/q_off.csv /tmp/q_fused.csv | tee $OUT/ncu_dquant_b8.md | head -16
OMP_NUM_THREADS=14 FM_TEST_FILTER=test_paged_chunks timeout $((430-SECONDS)) compute-sanitizer --tool racecheck --error-exitcode 3 build/tests/gpu/test_cuda_ops > $OUT/rc_paged.log 2>&1
echo "racecheck paged_chunks rc $? $((SECONDS-t0)) s"; tail -5 $OUT/rc_paged.log
