#!/bin/bash
# the thirty-seventh session's fifth call (carry build/lab/w4a8_ws): two stages of wgmmas in flight (q256c2l1d2)
# beside q256c2l1 (T = 512 now timed too); pg128 with every consumer thread arriving on "empty"; racecheck of both
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
L=$OUT/logs; mkdir -p $L
for v in q256c2l1 q256c2l1d2 pg128; do
  timeout 150 ./build/lab/w4a8_ws --variants $v > $L/ws_$v.log 2>&1; echo "== $v rc $?"
  grep -E "^\| $v |checks|FAIL|error|trap|registers" $L/ws_$v.log | head -14
done
for v in q256c2l1d2 pg128; do
  timeout 100 compute-sanitizer --tool racecheck ./build/lab/w4a8_ws --small --variants $v > $L/race_$v.log 2>&1
  echo "== racecheck $v rc $?"; grep -E "RACECHECK SUMMARY|Error: Race" $L/race_$v.log | head -4
done
