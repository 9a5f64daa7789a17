#!/bin/bash
# forty-fifth session: route dense.quant=producer (the o projection's e4m3 rows written by paged attention's merge
# kernel; at one token the next layer's q|k|v rows by the persistent MoE block's tail: two quantizer launches fewer a
# layer at B = 1, one at B = 8 and 64) and the o projection's add + RMSNorm in its GEMV (decode.fused=on, unmeasured
# since row_tail.cuh), one binary (.carry/gpu-s50a.tar.xz), the routes switched. (1) test_cuda_attn_o (and under
# memcheck), test_moe_persistent (out_q against the cpu's quantizer, one launch), test_cuda_generate and
# test_cuda_graph with the route; (2) fp8 decode B = 1, 8, 64 by route set,
# alternating, two rounds; (3) s49_a.sh's per-kernel stall table of one step (NVTX range) at B = 1 and 8, and
# bench/kernel_table.py at B = 8, on the time left.
# Carry .carry/env.sh, .carry/debs, .carry/gpu-s50a.tar.xz.
set -u
LIMIT=${LIMIT:-420}
source .carry/env.sh
export FP8MOE_SHARED_MODELS=$PWD/models
mkdir -p s50 && tar -xJf .carry/gpu-s50a.tar.xz -C s50 || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
N=s50/build/new
R=w4a8.gemv_max_m=16,w4a8.splits=fill
timeout 120 $N/test_cuda_attn_o > $L/test_attn_o.log 2>&1
echo "== test_cuda_attn_o rc $? $SECONDS s"; grep -E "bit for bit|FAIL|rror|Assert" $L/test_attn_o.log | cut -c1-150 | head -14
FM_TEST_FILTER='test_moe_persistent' timeout 120 $N/test_cuda_ops_fused > $L/test_persistent.log 2>&1
echo "== test_moe_persistent rc $? $SECONDS s"; grep -E "bit for bit|FAIL|rror|out_q" $L/test_persistent.log | cut -c1-150 | head -12
for t in generate graph; do
  timeout 150 $N/test_cuda_$t --route dense.quant=producer > $L/test_$t.log 2>&1
  echo "== test_cuda_$t (dense.quant=producer) rc $? $SECONDS s: $(grep -cE '^\[ +OK +\]' $L/test_$t.log) ok, $(grep -cE '^\[ +FAILED +\]' $L/test_$t.log) failed"
done
D=(decode --synthetic qwen3-30b-a3b --context 2048 --presets fp8 --backend cuda --steps 32 --batch 1,8,64)
for rd in 1 2; do for v in base q f qf; do
  left 40 || break
  r=$R; [ $v = q ] && r=$R,dense.quant=producer; [ $v = f ] && r=$R,decode.fused=on
  [ $v = qf ] && r=$R,dense.quant=producer,decode.fused=on
  f=$L/dec_${v}_$rd.log; timeout 90 $N/fp8moe-bench "${D[@]}" --route $r > $f 2>&1
  echo "== decode $v round $rd rc $? $SECONDS s"; grep -E "^\| fp8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|" $f | cut -c1-80
done; done
if left 100; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 $N/test_cuda_attn_o > $L/memcheck_attn_o.log 2>&1
  echo "== memcheck attn_o rc $? $SECONDS s"; tail -1 $L/memcheck_attn_o.log
fi
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio
for r in no_instruction long_scoreboard barrier wait short_scoreboard membar; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for bb in 1 8; do
  left 80 || break
  f=$L/ncu_stalls_$bb.csv
  timeout 75 ncu --nvtx --nvtx-include "decode step/" --metrics $M --cache-control none --clock-control none --print-units base --csv \
    $N/fp8moe-bench decode --synthetic qwen3-30b-a3b --layers 2 --batch $bb --context 256 --presets fp8 \
    --backend cuda --warmup 2 --steps 1 --route decode.graphs=off,$R > $f 2>&1
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
        d = k.setdefault(r[h['ID']], {'name': r[h['Kernel Name']].split('(')[0][:40]})
        d[r[h['Metric Name']].split('__')[-1].replace('average_warps_issue_stalled_', '')] = r[h['Metric Value']]
    print(fn)
    for d in k.values():
        f = lambda key: d.get(key, '-')[:6]
        print('  %-40s %8s ns %9s inst no_inst %6s long_sb %6s barrier %6s wait %6s short_sb %6s' % (d['name'],
              f('time_duration.sum'), f('inst_executed.sum'), f('no_instruction_per_issue_active.ratio'),
              f('long_scoreboard_per_issue_active.ratio'), f('barrier_per_issue_active.ratio'),
              f('wait_per_issue_active.ratio'), f('short_scoreboard_per_issue_active.ratio')))
PY
if left 80; then
  timeout 75 python3 bench/kernel_table.py run --bandwidth 3350 --csv $L/kt_8.csv -- $N/fp8moe-bench decode \
    --synthetic qwen3-30b-a3b --layers 2 --batch 8 --context 2048 --presets fp8 --backend cuda --warmup 2 --steps 1 \
    --route $R > $L/kernel_table_8.md 2>&1
  echo "== kernel_table B=8 rc $? $SECONDS s"; sed -n '/per kernel/,$p' $L/kernel_table_8.md | head -24
fi
cd $OUT && tar -cJf all.tar.xz logs && rm -rf logs
echo "== all $SECONDS s"
