#!/usr/bin/env bash
# The prefill figures of issue 3: qwen3-30b-a3b (synthetic), presets ref and int4, L = 8, 12, 48 layers,
# T = 512, 2048, 8192 tokens, on the GPU. Each line: one `fp8moe bench prefill` run; JSON per run in $OUT.
# Usage (device tool): source .carry/env.sh; make -j all && bench/prefill_matrix.sh [REPEAT] [PRESETS]
# (PRESETS: space-separated, default "ref int4 fp8")
set -uo pipefail
out=${OUT:-/tmp}
repeat=${1:-5}
presets=${2:-ref int4 fp8}
printf "| preset | layers | tokens | median ms | min | max | tokens/s | floor ms | experts ms | attention ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
for preset in $presets; do
  for layers in 8 12 48; do
    for tokens in 512 2048 8192; do
      j="$out/prefill_${preset}_L${layers}_T${tokens}.json"
      if ./build/fp8moe bench prefill --synthetic qwen3-30b-a3b --backend cuda --preset "$preset" --layers "$layers" \
           --tokens "$tokens" --repeat "$repeat" --warmup 1 --json "$j" >"$out/prefill_${preset}_L${layers}_T${tokens}.txt" 2>&1; then
        python3 - "$j" "$preset" "$layers" "$tokens" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = {s["stage"]: s["median_ms"] for s in r["stages"]}
print("| %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f |" % (sys.argv[2], sys.argv[3], sys.argv[4], r["median_ms"],
      r["min_ms"], r["max_ms"], r["tokens_per_s"], r["floor_ms"], st["experts"], st["attention"]))
PY
      else
        echo "| $preset | $layers | $tokens | failed: $(tail -1 "$out/prefill_${preset}_L${layers}_T${tokens}.txt") |"
      fi
    done
  done
done
tar czf "$out/prefill_runs.tgz" -C "$out" $(cd "$out" && ls prefill_*.json prefill_*.txt 2>/dev/null) && rm -f "$out"/prefill_*.json "$out"/prefill_*.txt
