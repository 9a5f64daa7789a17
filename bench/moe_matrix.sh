#!/usr/bin/env bash
# The MoE-layer figures of issue 5 (deliverable 8: anchors beside ours, in the same run): one layer's expert FFN
# of Qwen3-30B-A3B at T = 16, 512, 2048, 8192 and of Mixtral-8x7B at T = 512, 4096, every route side by side
# (int4-per-token, bf16-cublas, fp8-cublaslt-loop, fp8-grouped). One `fp8moe bench moe` run per shape; its table is
# printed; its JSON (moe_SHAPE.json), table (.txt) and stderr (.err) stay in $OUT.
# Usage (device tool): source .carry/env.sh; make -j all && bench/moe_matrix.sh [REPEAT] [ROUTES]
set -uo pipefail
out=${OUT:-/tmp}
repeat=${1:-20}
routes=${2:-int4-per-token,bf16-cublas,fp8-cublaslt-loop,fp8-grouped}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
rc=0
for run in "qwen3 16,512,2048,8192" "mixtral 512,4096"; do
  set -- $run
  shape=$1 tokens=$2
  echo
  ./build/fp8moe bench moe --shape "$shape" --tokens "$tokens" --routes "$routes" --repeat "$repeat" --warmup 3 \
      --json "$out/moe_${shape}.json" 2>"$out/moe_${shape}.err" | tee "$out/moe_${shape}.txt"
  r=${PIPESTATUS[0]}
  if [ "$r" != 0 ]; then
    echo "bench moe --shape $shape: exit $r: $(tail -1 "$out/moe_${shape}.err")"
    rc=1
  fi
done
exit $rc
