#!/bin/bash
# session 29, call 4 (the bench pack, ~260 s): the step budget's A/B under the tiled default (fixed, latency, fixed, latency:
# 8 streams while 1,800-token prompts arrive, and 64 clients of 1,800-token prompts), issue 41's ITL target
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s29.tar.xz || exit 1
SERVE_S=20 PART=serve-budget NEW=build timeout 560 tools/gpu-measure.sh > /tmp/m_budget.txt 2>&1
echo "serve-budget rc $?"; sed -n "/^### serve/,\$p" $OUT/measure-serve-budget.md 2>/dev/null | grep -E "^\||^####|^steps" | cut -c1-220
ls $OUT
