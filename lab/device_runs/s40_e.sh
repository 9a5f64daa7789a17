#!/bin/bash
# the thirty-seventh session's fourth call (carry build/lab/w4a8_ws): the consumers converting too (n256cc) beside
# n256 and the best 256 x 128 form (q256c2l1); pg128 after its race fix (per-warp arrivals); racecheck of both
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for v in q256c2l1 n256 n256cc q256cc pg128; do
  timeout 150 ./build/lab/w4a8_ws --variants $v > $L/ws_$v.log 2>&1; echo "== $v rc $?"
  grep -E "^\| $v |checks|FAIL|error|trap|registers" $L/ws_$v.log | head -14
done
for v in n256cc pg128; do
  timeout 100 compute-sanitizer --tool racecheck ./build/lab/w4a8_ws --small --variants $v > $L/race_$v.log 2>&1
  echo "== racecheck $v rc $?"; grep -E "RACECHECK SUMMARY|hazard|ERROR" $L/race_$v.log | head -4
done
