#!/bin/bash
# thirty-eighth session: the fold route's warp-specialised prefill GEMMs (w4a8_fold_ws.cu) in the engine. Pack
# .carry/gpu-s41.tar.xz (tools/gpu-pack.sh of the session's tree). Order: the fold tests (the new kernel against the
# emulation first), bench moe (fp8-grouped / fp8-fold / fp8-fold-ws in one run), the 48-layer prefill with and
# without the route, the parity of both forms against the fp32 oracle, then memcheck of the fold tests, as time allows.
set -u
LIMIT=${LIMIT:-560}
source .carry/env.sh
tar -xJf .carry/gpu-s41.tar.xz || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
L=$OUT/logs; mkdir -p $L
left() { [ $((SECONDS + $1)) -le $LIMIT ]; }
timeout 240 build/tests/gpu/test_cuda_fold > $L/fold.log 2>&1; echo "== test_cuda_fold rc $? $SECONDS s"
grep -E "fold ws|moe fold|FAILED|PASSED|ERROR|error" $L/fold.log | cut -c1-200 | head -40
B=build/fp8moe-bench
left 120 && { timeout 150 $B moe --shape qwen3 --routes fp8-grouped,fp8-fold,fp8-fold-ws --tokens 512,2048,8192 \
  --backend cuda > $L/moe_q.log 2>&1; echo "== moe qwen3 rc $? $SECONDS s"; grep -E "^\|" $L/moe_q.log | cut -c1-200; }
left 100 && { timeout 120 $B moe --shape mixtral --routes fp8-grouped,fp8-fold,fp8-fold-ws --tokens 4096 \
  --backend cuda > $L/moe_m.log 2>&1; echo "== moe mixtral rc $? $SECONDS s"; grep -E "^\|" $L/moe_m.log | cut -c1-200; }
P=(prefill --synthetic qwen3-30b-a3b --layers 48 --tokens 2048 --preset fp8 --dense w8a8 --backend cuda --repeat 5)
for r in "" "--int4-scales p2 --route w4a8.kernel=fold --route w4a8.fold_ws=off" "--int4-scales p2 --route w4a8.kernel=fold"; do
  left 60 || break
  f=$L/pre_$SECONDS.log; timeout 90 $B "${P[@]}" $r > $f 2>&1; echo "== prefill [$r] rc $? $SECONDS s"
  grep -E "tok/s|^\| (total|moe|experts)" $f | tail -3 | cut -c1-200
done
for r in "w4a8.fold_ws=off" "w4a8.fold_ws=on"; do
  left 70 || break
  f=$L/par_$SECONDS.log
  timeout 100 build/fp8moe parity --synthetic qwen3-30b-a3b --layers 2 --presets fp8 --backend cuda --oracle cuda \
    --int4-scales p2 --route w4a8.kernel=fold --route $r --tokens 2048 > $f 2>&1
  echo "== parity [$r] rc $? $SECONDS s"; grep -E "^\||cosine" $f | tail -4 | cut -c1-220
done
left 60 && { timeout $((LIMIT - SECONDS - 10)) compute-sanitizer --tool memcheck build/tests/gpu/test_cuda_fold \
  > $L/memcheck.log 2>&1; echo "== memcheck rc $? $SECONDS s"; grep -E "ERROR SUMMARY|FAILED|PASSED" $L/memcheck.log | head; }
echo "== $SECONDS s"
