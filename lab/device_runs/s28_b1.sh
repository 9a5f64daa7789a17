#!/bin/bash
# next session, call 3 (pack .carry/gpu-bench-s27.tar.xz: HEAD's fp8moe and fp8moe-bench in build/, 8474e61's in
# build/base): decode with a same-run baseline, two rounds alternating; Qwen3-Next; per op at B = 1 and 64
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s27.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b bench decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do
  drow base_r$r build/base/fp8moe "${c[@]}"
  drow new_r$r build/fp8moe "${c[@]}"
  drow fill_r$r build/fp8moe "${c[@]}" --route paged.splits=fill
  drow qbase_r$r build/base/fp8moe "${q[@]}"
  drow qnew_r$r build/fp8moe "${q[@]}"
done
timeout 60 build/fp8moe bench decode "${c[@]}" --presets fp8 --batch 1,64 --per-op > $OUT/per_op.txt 2>&1
at=(--preset fp8 --tokens 512 --at 3584 --repeat 3 --warmup 1 --backend cuda)
for m in qwen3-30b-a3b qwen3-next-80b-a3b; do for r in "" "--route paged.tiled=on"; do
  timeout 60 build/fp8moe bench prefill --synthetic $m "${at[@]}" $r > $L/at.log 2>&1
  echo "at $m [$r] rc $?: $(grep -E '^latency' $L/at.log)"; done; done
tar -czf $OUT/logsb.tgz -C /tmp logsb
