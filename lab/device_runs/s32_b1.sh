#!/bin/bash
# next session, call 3 (pack .carry/gpu-bench-s32.tar.xz: HEAD's fp8moe-bench in build/, the router.cluster commit's
# (gemv.groups=auto, the staging with divisions) in build/base): decode base / new two rounds; Qwen3-Next; ncu of the
# W4A8 GEMVs of both (2 layers); the router under ncu with source counters at the finest sampling (where its 11-12 us
# go); predictions in bench/NOTES.md (twenty-ninth session)
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s32.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do
  drow base_r$r build/base/fp8moe-bench "${c[@]}"; drow new_r$r build/fp8moe-bench "${c[@]}"
  drow qbase_r$r build/base/fp8moe-bench "${q[@]}"; drow qnew_r$r build/fp8moe-bench "${q[@]}"
done
for b in base new; do
  bin=build/fp8moe-bench; [ $b = base ] && bin=build/base/fp8moe-bench
  timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    -k regex:w4a8_gemv_kernel --launch-skip 8 --launch-count 8 $bin decode --synthetic qwen3-30b-a3b --batch 1 \
    --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off > $OUT/ncu_$b.csv 2>/dev/null
  echo "ncu $b rc $? $((SECONDS-t0)) s"
  grep gpu__time_duration $OUT/ncu_$b.csv | awk -F'","' '{split($5,a,"(");print a[1], $9, $NF}' | tr '\n' ';'; echo
done
timeout 120 ncu --clock-control none --cache-control none --section SourceCounters --section WarpStateStats \
  --warp-sampling-interval 0 --import-source yes -k regex:router_fused --launch-skip 8 --launch-count 1 -o /tmp/p_router build/fp8moe-bench \
  decode --synthetic qwen3-30b-a3b --batch 1 --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda \
  --route decode.graphs=off > $OUT/ncu_router.log 2>&1; echo "ncu router rc $? $((SECONDS-t0)) s"
ncu -i /tmp/p_router.ncu-rep --page source --csv --print-source sass > /tmp/router_src.csv 2>&1
ncu -i /tmp/p_router.ncu-rep --page details --csv --print-details all > $OUT/router_det.csv 2>&1
head -c 400 /tmp/router_src.csv; echo
python3 - /tmp/router_src.csv <<'P'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if r and r[0] == '#'), None) or next((r for r in rows if 'Source' in r), [])
col = next((i for i, h in enumerate(hdr) if h.startswith('Warp Stall Sampling (All')), None)
if col is None: print('no stall column:', hdr[:8]); sys.exit()
body = [r for r in rows if len(r) > col and r[col].replace('.', '').isdigit() and float(r[col]) > 0]
print('samples', sum(float(r[col]) for r in body), 'columns', hdr[:4])
for r in sorted(body, key=lambda r: -float(r[col]))[:25]: print(r[col], r[0], r[1][:110])
P
