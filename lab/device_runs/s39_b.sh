#!/bin/bash
# variants 10 / 11 of the expert GEMM's ceiling (a producer warp feeding an 8-stage mbarrier ring), beside the base
# and variants 4 and 7 (2.27), one call
set -u
source .carry/env.sh
tar -xJf .carry/gpu-pipe4.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PIPE_VARIANTS="base 4 7 10 11" PIPE_TILE="auto 64" sh lab/w4a8_pipe_ceiling.sh run build/pipebase/fp8moe-bench \
    build/pipe/fp8moe-bench > $OUT/pipe.log 2>&1
grep -E "^==|^\| fp8|exit|skipped" $OUT/pipe.log | cut -c1-150
