#!/bin/bash
# session 29 (s31), as run after s31_c1.sh on the same warm H100 (the gpu-s31c pack extracted there): ncu durations
# of the router kernel, router.cluster off and on, 6 layers each, no graph
source .carry/env.sh
for v in off on; do timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  -k regex:router --launch-skip 4 --launch-count 6 build/fp8moe-bench decode --synthetic qwen3-30b-a3b --batch 1 \
  --context 2048 --steps 1 --warmup 0 --presets fp8 --backend cuda --route decode.graphs=off \
  --route router.cluster=$v > /tmp/n_$v.csv 2>&1; echo "rc $?"
  grep gpu__time /tmp/n_$v.csv | awk -F'","' '{split($5,a,"(");print a[1], $NF}' | tr '\n' ';'; echo; done
