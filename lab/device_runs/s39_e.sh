#!/bin/bash
# the thirty-sixth session's last call (as run, inline, on s39_d.sh's warm machine): test_cuda_mixed_steps with the
# mixed graphs over the split kernel only and without the persistent MoE block, test_cuda_prefix_cache likewise
source .carry/env.sh; tar -xJf .carry/gpu-s39t.tar.xz
for r in paged.tiled=off moe.persistent=off; do
  timeout 60 build/tests/gpu/test_cuda_mixed_steps --route $r > $OUT/m_$r.log 2>&1; echo "== mixed_steps --route $r rc $?"
  grep -hE "^\[  FAILED|^\[  PASSED|replayed" $OUT/m_$r.log | cut -c1-60,150-230 | head -9
done
timeout 60 build/tests/gpu/test_cuda_prefix_cache --route paged.tiled=off > $OUT/p.log 2>&1; echo "== prefix_cache paged.tiled=off rc $?"
