#!/bin/bash
# session 29, call 5 (the bench pack, ~340 s): the serving rows of issues 40 and 41 (prefix cache on and off, mixed
# steps, the baseline binary), with paged.tiled and the down GEMV's instantiation in the new binary
set -u
[ -x build/base/fp8moe-bench ] || tar -xJf .carry/gpu-bench-s29.tar.xz || exit 1
SERVE_S=20 PART=serve BASE=build/base NEW=build timeout 560 tools/gpu-measure.sh > /tmp/m_serve.txt 2>&1
echo "serve rc $?"; sed -n "/^### serve/,\$p" $OUT/measure-serve.md | grep -E "^\||^####|^steps" | cut -c1-200
