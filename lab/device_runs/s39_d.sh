#!/bin/bash
# the GPU tests whose programs drive the scheduler (mixed steps), on the tree of s39_a.sh's binaries plus the review's
# fixes: the new default (route mixed.graphs on) through prefix caching, masks, shared routing, warm-up, experts in
# host memory and the rank groups (which decline the route), and the graph test
set -u
source .carry/env.sh
tar -xJf .carry/gpu-s39t.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
for t in test_cuda_prefix_cache test_cuda_mask_overlap test_cuda_shared_routing test_cuda_warmup test_cuda_graph \
         test_cuda_offload test_cuda_ep test_cuda_tp; do
  [ $SECONDS -lt 230 ] || { echo "== $t not run (time)"; continue; }
  timeout 90 build/tests/gpu/$t > $OUT/$t.log 2>&1; echo "== $t rc $? at $SECONDS s"
  grep -hE "^\[  FAILED|^\[  PASSED|ERROR:|Aborted|without CUDA graphs" $OUT/$t.log | cut -c1-200 | head -4
done
