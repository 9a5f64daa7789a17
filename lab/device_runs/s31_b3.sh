#!/bin/bash
# session 29 (s31 scripts), last call: gemv.groups auto (the most K slices in one wave) against =4 (b5c95b4's split,
# its kernels: s31_b2 measured base b5c95b4 level with it), decode two rounds, Qwen3-Next B = 1, ncu of the W4A8 GEMVs at auto; then the op, generation,
# model, Qwen3-Next and graph tests under the new default
set -u
tar -xJf .carry/gpu-s31b.tar.xz || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$SECONDS; L=/tmp/logsb; mkdir -p $L
c=(--synthetic qwen3-30b-a3b --batch 1,8,64 --context 2048 --presets fp8,fp8+w8a8 --backend cuda)
q=(--synthetic qwen3-next-80b-a3b --batch 1 --context 2048 --presets fp8 --backend cuda)
drow() { local l=$1 b=$2; shift 2
  timeout 45 $b decode "$@" > $L/dec_$l.log 2>&1; echo "$l rc $? $((SECONDS-t0)) s"
  grep -E "^\| fp8" $L/dec_$l.log | head -6 | sed "s/^/$l /" | tee -a $OUT/decode_rows.txt | awk '{print $1, $3, $5, $7}' | tr '\n' ';'; echo; }
for r in 1 2; do drow g4_r$r build/fp8moe-bench "${c[@]}" --route gemv.groups=4; drow auto_r$r build/fp8moe-bench "${c[@]}"; done
drow q4 build/fp8moe-bench "${q[@]}" --route gemv.groups=4; drow qauto build/fp8moe-bench "${q[@]}"
timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  -k regex:w4a8_gemv_kernel --launch-skip 8 --launch-count 8 build/fp8moe-bench decode --synthetic qwen3-30b-a3b \
  --batch 1 --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off > $OUT/ncu_auto.csv 2>/dev/null
grep gpu__time_duration $OUT/ncu_auto.csv | awk -F'","' '{split($5,a,"(");print a[1], $9, $NF}' | tr '\n' ';'; echo
T=./build/tests/gpu
run() { local n=$1 th=$2 f=$3; shift 3; local s=$SECONDS
  OMP_NUM_THREADS=$th FM_TEST_FILTER="$f" timeout $((590-SECONDS)) "$@" > $OUT/t_$n.log 2>&1; echo "$n rc $? $((SECONDS-s)) s"; }
run ops_moe 4 'test_moe*' $T/test_cuda_ops &
run ops_linear 3 'test_linear*' $T/test_cuda_ops &
run ops_fused 4 '*' $T/test_cuda_ops_fused &
run generate 1 '*' $T/test_cuda_generate &
run models 1 '*' $T/test_cuda_models &
run qnext 1 '*' $T/test_cuda_qnext &
run graph 1 '*' $T/test_cuda_graph &
wait
grep -hE "^\[  FAILED|^\[  PASSED|^\[  FAILED  \] [0-9]" $OUT/t_*.log | sort | uniq -c
