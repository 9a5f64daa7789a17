#!/usr/bin/env bash
# fp8moe serve against real clients (issue 18, deliverable 6), on the CPU backend with models/tiny-code-moe:
#   - the official `openai` npm package (client.mjs): chat and completions, streaming and not, logprobs, stop
#     strings, 16 concurrent clients, a client that aborts mid-stream, malformed requests, 401/404/413/429;
#   - curl: the server-sent events framing (data: lines, blank-line separated, data: [DONE] last);
#   - the chat page in headless Chromium (page.mjs, puppeteer-core on the system chromium), screenshot in build/serve;
#   - the server ends every part with no KV block in use (/metrics), and exits 0 on SIGTERM: with the ASan build
#     (make test-serve) a leak or memory error fails the run.
# usage: tests/serve/run.sh BIN   (run from the repository root; npm installs the packages on first use)
set -euo pipefail
BIN=${1:-build/fp8moe}
OUT=build/serve
MODEL=models/tiny-code-moe
KEY=test-key-$$
mkdir -p "$OUT"
rm -f "$OUT"/*.port

command -v node >/dev/null || { echo "serve tests: node is missing (make deps installs nodejs and npm)"; exit 1; }
if [ ! -d tests/serve/node_modules/openai ] || [ ! -d tests/serve/node_modules/puppeteer-core ]; then
  (cd tests/serve && npm install --no-audit --no-fund --loglevel=error)
fi
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "serve tests: chromium is missing (make deps installs it)"; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # NAME ARGS...: starts a server on a free port, waits for its port file
  local name=$1; shift
  "$BIN" serve --model "$MODEL" --port 0 --port-file "$OUT/$name.port" "$@" >"$OUT/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    [ -s "$OUT/$name.port" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "serve tests: the $name server died:"; cat "$OUT/$name.log"; exit 1; }
    sleep 0.1
  done
  echo "serve tests: the $name server did not start"; cat "$OUT/$name.log"; exit 1
}

start main --max-seqs 4 --api-key "$KEY" --chat-template tests/chat_templates/chatml/chat_template.jinja
start busy --max-seqs 1 --max-queue 0
start structured --max-seqs 4 --chat-template tests/chat_templates/qwen3-30b-a3b/chat_template.jinja
URL=http://127.0.0.1:$(cat "$OUT/main.port")
BUSY=http://127.0.0.1:$(cat "$OUT/busy.port")
echo "== serve: openai npm client against $URL"
node tests/serve/client.mjs "$URL" "$KEY" "$BUSY"

echo "== serve: structured outputs, forced tool calls and logit_bias (openai npm client)"
node tests/serve/structured.mjs "http://127.0.0.1:$(cat "$OUT/structured.port")"

echo "== serve: SSE framing with curl"
curl -sN -D "$OUT/sse.headers" -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"prompt":"def main():","max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  "$URL/v1/completions" >"$OUT/sse.txt"
grep -qi '^content-type: text/event-stream' "$OUT/sse.headers" || { echo "not text/event-stream"; cat "$OUT/sse.headers"; exit 1; }
# every event is one "data: " line followed by a blank line; the last is data: [DONE]
awk 'NR % 2 == 1 && !/^data: / { print "line " NR " is not a data: line: " $0; bad = 1 }
     NR % 2 == 0 && $0 != ""   { print "line " NR " should separate events: " $0; bad = 1 }
     END { if (bad) exit 1 }' "$OUT/sse.txt"
[ "$(tail -n 2 "$OUT/sse.txt" | head -n 1)" = "data: [DONE]" ] || { echo "the stream does not end with data: [DONE]"; exit 1; }
n=$(grep -c '^data: {' "$OUT/sse.txt")
grep -q '"finish_reason":"length"' "$OUT/sse.txt" && grep -q '"usage":{"prompt_tokens"' "$OUT/sse.txt" \
  || { echo "no finish_reason or usage chunk"; exit 1; }
echo "  ok  $n JSON events, blank-line framed, finish_reason and usage, data: [DONE] last"

echo "== serve: the chat page in headless Chromium"
node tests/serve/page.mjs "$URL" "$KEY" "$OUT/chat-page.png" "$CHROMIUM"

echo "== serve: clean shutdown"
used=$(curl -s "$URL/metrics" | awk '/^fp8moe_kv_blocks_used /{print $2}')
[ "$used" = 0 ] || { echo "KV blocks in use at the end: $used"; exit 1; }
# a stream still running when SIGTERM comes: it is cancelled and ends with data: [DONE]
curl -sN -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d '{"prompt":[1,2,3],"max_tokens":2000,"ignore_eos":true,"stream":true}' "$URL/v1/completions" >"$OUT/inflight.txt" &
inflight=$!
for _ in $(seq 1 100); do [ -s "$OUT/inflight.txt" ] && break; sleep 0.1; done
for i in "${!pids[@]}"; do
  p=${pids[$i]}
  kill -TERM "$p"
  rc=0; wait "$p" || rc=$?
  if [ $rc != 0 ] || grep -q 'Sanitizer' "$OUT"/*.log; then
    echo "a server exited with $rc:"; cat "$OUT"/*.log; exit 1
  fi
done
pids=()
wait "$inflight" || true
[ "$(tail -n 2 "$OUT/inflight.txt" | head -n 1)" = "data: [DONE]" ] || { echo "the in-flight stream was not ended"; exit 1; }
grep -q '"finish_reason":"stop"' "$OUT/inflight.txt"
grep -q 'SIGTERM: shutting down' "$OUT/main.log"
echo "  ok  both servers exited 0 on SIGTERM (no sanitizer report), no KV block in use; a stream in flight was ended"
echo "SERVE TESTS PASSED"
