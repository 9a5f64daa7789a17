#!/bin/bash
# the thirty-seventh session's third call (carry build/lab/w4a8_ws): the fold codes by 1-D bulk copies and
# the consumers offset by 1-2 stages beside bm256c2, then ncu (compute and shared-memory tables) of q256c2 T = 8192 gate|up
# launch, racecheck of the new variants
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for v in bm256c2 q256c2 q256 q256c2l1 q256c2l2 n256 n256l1 pg128; do
  timeout 150 ./build/lab/w4a8_ws --variants $v > $L/ws_$v.log 2>&1; echo "== $v rc $?"
  grep -E "^\| $v .*layer|checks|FAIL|error|trap|registers" $L/ws_$v.log | head -12
done
if command -v ncu >/dev/null; then
  for v in q256c2; do
    timeout 150 ncu -k regex:w4a8_ws_kernel --launch-skip 105 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section WarpStateStats ./build/lab/w4a8_ws --variants $v > $L/ncu_$v.log 2>&1; echo "== ncu $v rc $?"
    grep -E "Duration|Throughput|Pipe|Tensor|Shared|Bank|Stall|Issue" $L/ncu_$v.log | head -40
  done
fi
for v in q256c2l1 n256 pg128; do
  timeout 100 compute-sanitizer --tool racecheck ./build/lab/w4a8_ws --small --variants $v > $L/race_$v.log 2>&1
  echo "== racecheck $v rc $?"; grep -E "RACECHECK SUMMARY|hazard|ERROR" $L/race_$v.log | head -4
done
