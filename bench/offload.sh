#!/usr/bin/env bash
# The figures of experts in host memory (docs/RESULTS.md 2.11): Qwen3-30B-A3B shape, fp8 + --dense w8a8, on the GPU,
# at --vram-limit 8G, 12G and 16G. Decode, one sequence: the step's sampled token as input (a synthetic model's tokens
# repeat) and a random token per step (independent routing: the cache's hard case), uniform and zipf:1.2 routing, LRU
# and LFU, at 8G also with the expert prefetch of each token's top 4; prefill T = 2048 with each policy; the all-on-GPU baseline of both in the same run. Each benchmark measures
# the host link itself and prints the copies' floor. One line per run; the full outputs in $OUT/offload_runs.tgz.
# Usage (device tool): source .carry/env.sh; make -j all && bench/offload.sh [STEPS]
set -uo pipefail
out=${OUT:-/tmp}
steps=${1:-32}
B=./build/fp8moe
D="bench decode --synthetic qwen3-30b-a3b --presets fp8+w8a8 --batch 1 --context 512 --steps $steps --warmup 4"
P="bench prefill --synthetic qwen3-30b-a3b --preset fp8 --dense w8a8 --tokens 2048 --repeat 2 --warmup 1"
row() { # name, output file: the tokens/s (or latency) line, the cache's line, the link line
  local f=$2
  printf "| %s | %s | %s | %s |\n" "$1" \
    "$(grep -E '^\| fp8\+w8a8 \| 1 \| [0-9.]+ \|' "$f" | head -1 | awk -F'|' '{print $7 " tokens/s, " $4 " ms"}')$(grep -oE '[0-9]+ tokens/s;' "$f" | head -1)" \
    "$(grep -E '^\| fp8\+w8a8 \| 1 \| [0-9]+ \| [0-9.]+%' "$f" | awk -F'|' '{print $5 " hits, " $6 " MB/step (+" $7 " prefetched), floor " $8 " ms"}')$(grep -oE 'hit rate [0-9.]+%, [0-9]+ misses' "$f" | head -1)" \
    "$(grep -oE '[0-9.]+ GB/s by the expert cache' "$f" | head -1)"
}
echo "| run | speed | cache | host link |"
echo "|---|---|---|---|"
f="$out/offload_decode_device.txt"; timeout 120 $B $D --experts-in device >"$f" 2>&1; row "decode, all on the GPU" "$f"
f="$out/offload_prefill_device.txt"; timeout 120 $B $P >"$f" 2>&1; row "prefill, all on the GPU" "$f"
for lim in 8G 12G 16G; do
  for input in sampled random; do
    for pol in lru lfu; do
      f="$out/offload_decode_${lim}_${input}_uniform_${pol}.txt"
      timeout 120 $B $D --experts-in host --vram-limit $lim --decode-input $input --expert-policy $pol >"$f" 2>&1
      row "decode $lim, $input input, uniform, $pol" "$f"
    done
    f="$out/offload_decode_${lim}_${input}_zipf_lfu.txt"
    timeout 120 $B $D --experts-in host --vram-limit $lim --decode-input $input --expert-policy lfu \
      --synthetic-routing zipf:1.2 >"$f" 2>&1
    row "decode $lim, $input input, zipf:1.2, lfu" "$f"
    if [ "$lim" = 8G ]; then # the expert prefetch: each token's top 4 predicted experts (route expert.prefetch)
      f="$out/offload_decode_${lim}_${input}_uniform_lfu_prefetch4.txt"
      timeout 120 $B $D --experts-in host --vram-limit $lim --decode-input $input --expert-policy lfu \
        --route expert.prefetch=4 >"$f" 2>&1
      row "decode $lim, $input input, uniform, lfu, expert.prefetch=4" "$f"
    fi
  done
  for pol in lru lfu; do
    f="$out/offload_prefill_${lim}_${pol}.txt"
    timeout 120 $B $P --experts-in host --vram-limit $lim --expert-policy $pol >"$f" 2>&1
    row "prefill $lim, $pol" "$f"
  done
done
tar czf "$out/offload_runs.tgz" -C "$out" $(cd "$out" && ls offload_*.txt) && rm -f "$out"/offload_*.txt
