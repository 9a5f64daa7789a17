#!/usr/bin/env bash
# The Qwen3-Next-80B-A3B shape's figures (docs/RESULTS.md 2.12) in one call, on the GPU: prefill T = 2048 over 48
# layers, one GDN layer against one full-attention layer at T = 8192 (4 layers: 3 GDN + 1 attention), prefill
# T = 2048 with the experts as before the
# 32-row tiles and the codes ring (~40 rows per expert: auto takes both), decode at batch 1, 8 and 64, and
# transformers' torch chunked rule as the yardstick when torch is there. fp8 + --dense w8a8, synthetic weights. One
# line per run; the full outputs in $OUT/qnext_runs.tgz.
# Usage (device tool): source .carry/env.sh; make -j all && bench/qnext.sh
set -uo pipefail
out=${OUT:-/tmp}
B=./build/fp8moe
P="bench prefill --synthetic qwen3-next-80b-a3b --preset fp8 --dense w8a8 --repeat 3 --warmup 1"
stage() { grep -E "^\| $2 \|" "$1" | head -1 | awk -F'|' '{print $3}'; }
echo "| run | latency | tokens/s | gated deltanet ms | attention ms | experts ms |"
echo "|---|---:|---:|---:|---:|---:|"
f="$out/qnext_prefill_2048.txt"
timeout 120 $B $P --tokens 2048 >"$f" 2>&1
lat=$(grep -oE 'median [0-9.]+ ms' "$f" | head -1); tps=$(grep -oE '[0-9]+ tokens/s' "$f" | head -1)
echo "| prefill T = 2048, 48 layers | $lat | $tps | $(stage "$f" 'gated deltanet') | $(stage "$f" attention) | $(stage "$f" experts) |"
f="$out/qnext_prefill_8192_4layers.txt"
timeout 120 $B $P --tokens 8192 --layers 4 >"$f" 2>&1
lat=$(grep -oE 'median [0-9.]+ ms' "$f" | head -1); tps=$(grep -oE '[0-9]+ tokens/s' "$f" | head -1)
echo "| T = 8192, 4 layers (3 GDN + 1 attention) | $lat | $tps | $(stage "$f" 'gated deltanet') | $(stage "$f" attention) | $(stage "$f" experts) |"
f="$out/qnext_prefill_2048_tile64.txt"
timeout 120 $B $P --tokens 2048 --route w4a8.tile=64 --route w4a8.codes=regs >"$f" 2>&1
lat=$(grep -oE 'median [0-9.]+ ms' "$f" | head -1); tps=$(grep -oE '[0-9]+ tokens/s' "$f" | head -1)
echo "| prefill T = 2048, 48 layers, the experts as before (64-row tiles, codes in registers) | $lat | $tps | $(stage "$f" 'gated deltanet') | $(stage "$f" attention) | $(stage "$f" experts) |"
f="$out/qnext_decode.txt"
timeout 180 $B bench decode --synthetic qwen3-next-80b-a3b --presets fp8+w8a8 --batch 1,8,64 --context 512 --steps 32 \
  --warmup 4 >"$f" 2>&1
grep -E '^\| fp8\+w8a8 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|' "$f" |
  awk -F'|' '{printf "| decode, batch %s | %s ms | %s | | | |\n", $3, $4, $7}'
if python3 -c "import torch, transformers" 2>/dev/null; then
  python3 bench/gdn_torch_yardstick.py --tokens 2048,8192 >"$out/qnext_torch_yardstick.txt" 2>&1
  grep -E '^T = ' "$out/qnext_torch_yardstick.txt" | sed 's/^/| torch yardstick (transformers), one GDN rule: /; s/$/ | | | | | |/'
fi
tar czf "$out/qnext_runs.tgz" -C "$out" $(cd "$out" && ls qnext_*.txt) && rm -f "$out"/qnext_*.txt
