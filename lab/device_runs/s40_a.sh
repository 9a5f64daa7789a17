#!/bin/bash
# the thirty-seventh session's first call (carry build/lab/w4a8_ws built by `make -C lab w4a8_ws`): the
# warp-specialised W4A8 lab kernel's variants (validation, timing, one at a time so a trap ends only its own run),
# then ncu of the T = 8192 gate|up launch (its validation launch: 3 small checks + 2 x 51 launches of T = 2048 first)
# and racecheck of the new variants on the small shapes
nvidia-smi --query-gpu=name --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for v in base conv2 bm256 bm256c2; do
  timeout 150 ./build/lab/w4a8_ws --variants $v > $L/ws_$v.log 2>&1; echo "== $v rc $?"
  grep -E "^\| $v|checks|FAIL|error|trap" $L/ws_$v.log | head -12
done
if command -v ncu >/dev/null; then
  for v in base bm256c2; do
    timeout 120 ncu -k regex:w4a8_ws_kernel --launch-skip 105 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis ./build/lab/w4a8_ws --variants $v > $L/ncu_$v.log 2>&1; echo "== ncu $v rc $?"
    grep -E "w4a8_ws_kernel|Duration|Throughput|Issued Warp|Eligible|Active Warps|No Eligible|Stall|Registers|Theoretical Occ" $L/ncu_$v.log | head -30
  done
fi
for v in conv2 bm256c2; do
  timeout 100 compute-sanitizer --tool racecheck ./build/lab/w4a8_ws --small --variants $v > $L/race_$v.log 2>&1
  echo "== racecheck $v rc $?"; grep -E "RACECHECK SUMMARY|hazard|ERROR" $L/race_$v.log | head -4
done
