#!/bin/bash
# the persistent attention block under compute-sanitizer: memcheck, racecheck, synccheck (its named barriers)
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s37a.tar.xz build/tests/gpu/test_cuda_attn_block || exit 1
for tool in memcheck synccheck racecheck; do
  timeout 170 compute-sanitizer --tool $tool --error-exitcode 3 build/tests/gpu/test_cuda_attn_block > /tmp/$tool.log 2>&1
  echo "$tool rc $? $(grep -cE 'bit for bit' /tmp/$tool.log) cases; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' /tmp/$tool.log | head -2 | tr '\n' ' ')"
done
