#!/bin/bash
# For the session after the forty-fourth: every kernel of one decode step with its duration, warp instructions and
# stall reasons per issued instruction (no instruction = the instruction cache, long scoreboard, barrier, wait, short
# scoreboard, membar), at B = 1, 8 and 64, 2 layers, graphs off: only the timed step's kernels, by the NVTX range
# bench decode opens around each timed step (`--nvtx --nvtx-include "decode step/"`; s48_h.sh profiled the
# prefill's ~400 launches too and outran its limits). Then the same at B = 8 for the H200's tables if lent.
# Pack: OUT=.carry/gpu-s49a.tar.xz tools/gpu-pack-ab.sh fp8moe-bench (a tree with the NVTX range: 44th session on).
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s49a.tar.xz.
set -u
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s49 && tar -xJf .carry/gpu-s49a.tar.xz -C s49 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio
for r in no_instruction long_scoreboard barrier wait short_scoreboard membar; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for bb in 1 8 64; do
  f=$L/ncu_stalls_$bb.csv
  timeout 120 ncu --nvtx --nvtx-include "decode step/" --metrics $M --cache-control none --clock-control none --print-units base --csv \
    s49/build/new/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch $bb --context 256 --presets fp8 \
    --backend cuda --warmup 2 --steps 1 --route decode.graphs=off > $f 2>&1
  echo "== ncu B=$bb rc $? $SECONDS s $(grep -c '^"' $f) rows"
done
python3 - $L <<'PY'
import csv, io, sys, glob, collections
for fn in sorted(glob.glob(sys.argv[1] + '/ncu_stalls_*.csv')):
    rows = list(csv.reader(io.StringIO(''.join(l for l in open(fn) if l.startswith('"')))))
    if not rows: continue
    h = {k: i for i, k in enumerate(rows[0])}
    k = collections.OrderedDict()
    for r in rows[1:]:
        d = k.setdefault(r[h['ID']], {'name': r[h['Kernel Name']].split('(')[0][:44]})
        d[r[h['Metric Name']].split('__')[-1].replace('average_warps_issue_stalled_', '')] = r[h['Metric Value']]
    print(fn)
    for d in k.values():
        print('  %-44s %9s ns %10s inst  no_inst %5s  long_sb %5s  barrier %5s  wait %5s' % (d['name'],
              d.get('time_duration.sum'), d.get('inst_executed.sum'), d.get('no_instruction_per_issue_active.ratio'),
              d.get('long_scoreboard_per_issue_active.ratio'), d.get('barrier_per_issue_active.ratio'),
              d.get('wait_per_issue_active.ratio')))
PY
# bench/kernel_table.py on the same range: each launch's DRAM bytes and floor (H100: 3350 GB/s; H200: 4250)
timeout 120 python3 bench/kernel_table.py run --bandwidth 3350 --csv $L/kt_8.csv -- s49/build/new/fp8moe-bench decode \
  --synthetic qwen3-30b-a3b --layers 2 --batch 8 --context 2048 --presets fp8 --backend cuda --warmup 2 --steps 1 \
  > $L/kernel_table_8.md 2>&1
echo "== kernel_table B=8 rc $? $SECONDS s"; sed -n '/per kernel/,$p' $L/kernel_table_8.md | head -30
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
