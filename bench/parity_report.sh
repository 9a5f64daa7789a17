#!/usr/bin/env bash
# The parity report of issue 6 (README "Parity and speed"), in one run on the GPU machine:
#   1. Qwen3-30B-A3B shape (synthetic weights, outlier channels in the embeddings): every preset the GPU runs
#      against the fp32 oracle on the GPU (ref32) and against the int4 baseline, at depths 1..48, K prompts
#   2. the bundled trained model (models/tiny-code-moe) at depths 1..4, with each preset's perplexity on the
#      GPU beside the cpu's emulation of its formats and transformers' fp32 figure (256 windows of 512)
#   3. the small test checkpoints (tests/models: Qwen3-MoE and Mixtral layouts) at their full depth
# Each run's table is printed; its JSON, CSV and stderr go to $OUT/parity_report.tar.gz (one file: the device
# tool brings back a few files only). The PNG plots need gnuplot, which the GPU machine lacks: make them where
# it is, from the JSON (fp8moe parity --from-json F.json --plot F.png).
# Usage (device tool): source .carry/env.sh; make -j all && bench/parity_report.sh [PROMPTS] [DEPTHS] [RUNS]
#   RUNS: comma-separated subset of qwen3-30b-a3b,tiny-code-moe,test-models (default all)
set -uo pipefail
prompts=${1:-2}
depths=${2:-1,2,4,8,16,32,48}
runs=${3:-qwen3-30b-a3b,tiny-code-moe,test-models}
out=$(mktemp -d)
trap 'tar czf "${OUT:-/tmp}/parity_report.tar.gz" -C "$out" . && rm -rf "$out"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
rc=0
run() { # name, then the parity arguments
  local name=$1
  shift
  echo
  echo "## $name"
  local t0=$(date +%s)
  ./build/fp8moe parity --backend cuda "$@" --json "$out/parity_$name.json" --csv "$out/parity_$name.csv" \
      2>"$out/parity_$name.err" | tee "$out/parity_$name.txt"
  local r=${PIPESTATUS[0]}
  echo "($(( $(date +%s) - t0 )) s)"
  if [ "$r" != 0 ]; then
    echo "parity $name: exit $r: $(tail -1 "$out/parity_$name.err")"
    rc=1
  fi
}
wanted() { [[ ",$runs," == *",$1,"* ]]; }
wanted qwen3-30b-a3b && run qwen3-30b-a3b --synthetic qwen3-30b-a3b --presets ref,int4,fp8 --layers "$depths" --tokens 256 --prompts "$prompts"
wanted tiny-code-moe && run tiny-code-moe --model models/tiny-code-moe --presets ref,int4,fp8 --layers 1,2,3,4 --tokens 512 --prompts 4 \
    --perplexity 256
for m in qwen3-moe-bf16 qwen3-moe-tied-f32 mixtral-f32-sharded; do
  wanted test-models && run "$m" --model "tests/models/$m" --presets ref,int4,fp8 --tokens 64
done
exit $rc
