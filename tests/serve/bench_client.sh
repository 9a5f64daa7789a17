#!/usr/bin/env bash
# The serving benchmark's clients (bench/serve_bench.py and bench/serve_bench.mjs) against running servers: prompts
# meant to be new find nothing in the prefix cache (random, the arrivals probe, multi-turn first turns), the ones
# meant to share do (a --prompts pool, later turns, the shared system prompt), and a row with more than 1% of its
# requests failed is loud: a FAILED line with the first error, `failed` in the JSON, exit 1.
# usage: tests/serve/bench_client.sh URL KEY BUSY_URL   (from tests/serve/run.sh: URL needs the Bearer KEY, BUSY_URL
# has --max-seqs 1 --max-queue 0)
set -euo pipefail
URL=$1 KEY=$2 BUSY=$3
OUT=build/serve/bench
mkdir -p "$OUT"

# check FILE PYTHON-EXPR: the expression over the JSON's first row (r) and the whole file (j) holds
check() {
  python3 - "$1" "$2" <<'EOF' || { echo "serve_bench: $2 does not hold in $1:"; cat "$1"; exit 1; }
import json, sys
j = json.load(open(sys.argv[1]))
r = j["rows"][0]
sys.exit(0 if eval(sys.argv[2]) else 1)
EOF
}

seed=0
for client in "python3 bench/serve_bench.py" "node bench/serve_bench.mjs"; do
  name=${client%% *} seed=$((seed + 10)) # the other client's prompts are not this one's
  run() { # LABEL OPTIONS...: one client run against URL, its JSON in $OUT/NAME-LABEL.json
    local label=$1; shift
    $client --url "$URL" --api-key "$KEY" --prompt-tokens 48 --max-tokens 4 --json "$OUT/$name-$label.json" "$@" \
      >"$OUT/$name-$label.txt" 2>&1 || { echo "serve_bench ($name) $label failed:"; cat "$OUT/$name-$label.txt"; exit 1; }
  }
  run random --clients 2 --requests 4 --seed $((seed + 1))
  check "$OUT/$name-random.json" 'r["requests"] == 4 and r["errors"] == 0 and r["cached_prompt_fraction"] == 0'
  grep -q '^|       2 |        4 |      0 |    0.00 |      0.0 |' "$OUT/$name-random.txt" ||
    { echo "serve_bench ($name): no row with 0 errors and 0.0 cached"; cat "$OUT/$name-random.txt"; exit 1; }
  run pool --clients 1 --requests 2 --prompts 1 --seed $((seed + 2))
  check "$OUT/$name-pool.json" 'r["requests"] == 2 and r["cached_prompt_fraction"] > 0 and j["prompts"] == 1'
  run turns --clients 1 --requests 2 --workload multi-turn --turns 2 --turn-tokens 16 --seed $((seed + 3))
  check "$OUT/$name-turns.json" 'r["first_turn_cached_prompt_fraction"] == 0 and r["cached_prompt_fraction"] > 0'
  run shared --clients 1 --requests 2 --workload shared-prefix --prefix-tokens 64 --prompt-tokens 16 --seed $((seed + 4))
  check "$OUT/$name-shared.json" 'r["requests"] == 2 and r["cached_prompt_fraction"] > 0'
  # arrivals: the streams' prompts and the probe's, one after another while a stream decodes, are all new
  run arrivals --clients 1 --duration 1 --workload arrivals --max-tokens 16 --probe-prompt-tokens 48 --seed $((seed + 5))
  check "$OUT/$name-arrivals.json" 'r["errors"] == 0 and r["cached_prompt_fraction"] == 0'
  # the same seed twice against one server: the second run finds the first one's prompts (each client's first request
  # is the same as in the first run)
  run again --clients 2 --requests 2 --seed $((seed + 1))
  check "$OUT/$name-again.json" 'r["cached_prompt_fraction"] > 0'
  # errors: 4 clients against one slot and no queue get 429s; the row is marked, the run fails
  rc=0
  $client --url "$BUSY" --clients 4 --requests 8 --prompt-tokens 48 --max-tokens 32 --warmup 0 \
    --json "$OUT/$name-busy.json" >"$OUT/$name-busy.txt" 2>&1 || rc=$?
  [ $rc = 1 ] && grep -q '^FAILED at 4 clients: .*% of requests failed .*; first error: HTTP 429' "$OUT/$name-busy.txt" ||
    { echo "serve_bench ($name) against a full server: exit $rc, no FAILED line"; cat "$OUT/$name-busy.txt"; exit 1; }
  check "$OUT/$name-busy.json" 'r["errors"] > 0 and r["error_rate"] > 0.01 and "failed" in r["failed"]'
  echo "  ok  serve_bench ($name): new prompts 0% cached (random, arrivals, first turns), pool, later turns and the"
  echo "      system prompt cached; a full server's 429s: FAILED line, exit 1"
done
