#!/bin/bash
# thirtieth session, call 3 (pack .carry/gpu-s33.tar.xz: 0cc5d62's fp8moe-bench in build/, 41d6c88's in build/base):
# decode base / new two rounds (the staging without divisions and the one-variant router: fp8 B = 1 -1.5 to -4.5 %),
# Qwen3-Next; moe.act_scale=token: bench moe (one layer's experts) and the 48-layer prefill with and without it, decode
# B = 64 with it; ncu of the W4A8 GEMVs of both binaries; predictions in bench/NOTES.md (thirtieth session)
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-s33.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1,64 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do
  drow base_r$r build/base/fp8moe-bench "${c[@]}"; drow new_r$r build/fp8moe-bench "${c[@]}"
  drow tok_r$r build/fp8moe-bench "${c[@]}" --route moe.act_scale=token
  drow qbase_r$r build/base/fp8moe-bench "${q[@]}"; drow qnew_r$r build/fp8moe-bench "${q[@]}"
done
m=(moe --shape qwen3 --routes fp8-grouped,fp8-grouped-token,bf16-cublas --tokens 16,512,2048,8192 --repeat 20 --backend cuda)
for r in 1 2; do
  timeout 90 build/fp8moe-bench "${m[@]}" > $L/moe_r$r.log 2>&1; echo "moe r$r rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/moe_r$r.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
done
timeout 90 build/fp8moe-bench moe --shape mixtral --routes fp8-grouped,fp8-grouped-token --tokens 512,4096 --repeat 10 \
  --backend cuda > $L/moe_mixtral.log 2>&1; echo "moe mixtral rc $? $((SECONDS-t0)) s"
grep -E "^\| fp8" $L/moe_mixtral.log | awk -F'|' '{print $2, $3, $4}' | tr '\n' ';'; echo
p=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda)
for r in 1 2; do for rt in "" "--route moe.act_scale=token"; do
  timeout 90 build/fp8moe-bench "${p[@]}" $rt > $L/pre.log 2>&1
  echo "prefill r$r [$rt] rc $? $((SECONDS-t0)) s: $(grep -E '^latency|^\| experts ' $L/pre.log | head -2 | tr '\n' ' ')"
  cat $L/pre.log >> $OUT/prefill.txt; done; done
for b in base new; do
  bin=build/fp8moe-bench; [ $b = base ] && bin=build/base/fp8moe-bench
  timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    -k regex:w4a8_gemv_kernel --launch-skip 8 --launch-count 8 $bin decode --synthetic qwen3-30b-a3b --batch 1 \
    --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off > $OUT/ncu_$b.csv 2>/dev/null
  echo "ncu $b rc $? $((SECONDS-t0)) s"
  grep gpu__time_duration $OUT/ncu_$b.csv | awk -F'","' '{split($5,a,"(");print a[1], $NF}' | tr '\n' ';'; echo
  timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    -k regex:router_fused --launch-skip 8 --launch-count 4 $bin decode --synthetic qwen3-30b-a3b --batch 1 \
    --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off > $OUT/ncu_router_$b.csv 2>/dev/null
  echo "ncu router $b rc $?: $(grep gpu__time_duration $OUT/ncu_router_$b.csv | awk -F'","' '{print $NF}' | tr '\n' ' ')"
done
tar -czf $OUT/logsb.tgz -C /tmp logsb
