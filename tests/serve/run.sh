#!/usr/bin/env bash
# fp8moe serve against real clients (issue 18, deliverable 6), on the CPU backend with models/tiny-code-moe:
#   - the official `openai` npm package (client.mjs): chat and completions, streaming and not, logprobs, stop
#     strings, 16 concurrent clients, a client that aborts mid-stream, malformed requests, 401/404/413/429;
#   - curl: the server-sent events framing (data: lines, blank-line separated, data: [DONE] last);
#   - agents (agent.mjs, aisdk.mjs) on tests/models/tiny-agent: tool calls and their round trip, streamed and not,
#     reasoning, the thinking switch, tool_choice, the openai client's runTools, and the Vercel AI SDK's
#     generateText with tools, streamText and generateObject; structured.mjs: json_schema/json_object at
#     temperature 1 always valid, forced tool calls, logit_bias (Qwen3's template on tiny-code-moe);
#   - the serving benchmark's clients (bench_client.sh): new prompts are not cached, errors fail the run;
#   - the chat page in headless Chromium (page.mjs, puppeteer-core on the system chromium), screenshot in build/serve;
#   - raw fetch and sockets (server_ops.mjs): fields refused by name, /tokenize, HEAD/405/CORS/Retry-After, seeds,
#     numeric edges, hostile bodies and connections;
#   - SIGTERM drains: a short stream finishes, new requests get 503, a long stream past --drain-timeout is cut
#     (an error event, finish_reason abort); the CLI refuses an empty --api-key and an unwritable --port-file and
#     fails when stdout cannot be written;
#   - the prefix cache of a hybrid model (synthetic toy-next, curl): the same prompt again and a shared system prompt
#     start from Gated DeltaNet state snapshots (usage cached_tokens, /metrics);
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
if [ ! -d tests/serve/node_modules/openai ] || [ ! -d tests/serve/node_modules/puppeteer-core ] ||
  [ ! -d tests/serve/node_modules/ai ]; then
  (cd tests/serve && npm install --no-audit --no-fund --loglevel=error)
fi
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || { echo "serve tests: chromium is missing (make deps installs it)"; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start() { # NAME ARGS...: starts a server on a free port (of $MODEL, or --synthetic $SYNTHETIC), waits for its port file
  local name=$1; shift
  local src=(--model "$MODEL"); [ -n "${SYNTHETIC:-}" ] && src=(--synthetic "$SYNTHETIC")
  "$BIN" serve "${src[@]}" --port 0 --port-file "$OUT/$name.port" "$@" >"$OUT/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 1800); do # the warm-up of a 2048-token chunk takes up to a minute under ASan on 2 busy cores
    [ -s "$OUT/$name.port" ] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "serve tests: the $name server died:"; cat "$OUT/$name.log"; exit 1; }
    sleep 0.1
  done
  echo "serve tests: the $name server did not start"; cat "$OUT/$name.log"; exit 1
}

start main --max-seqs 4 --api-key "$KEY" --chat-template tests/chat_templates/chatml/chat_template.jinja --drain-timeout 1
# main and ctx1024 warm up before listening (docs/loading.md); the others skip it, to keep the run short
start busy --max-seqs 1 --max-queue 0 --no-warmup
start ops --max-seqs 2 --no-warmup --chat-template tests/chat_templates/chatml/chat_template.jinja --cors-origin https://app.example \
  --strict-fields --idle-timeout 2 --max-conns-per-client 8 --drain-timeout 300
start structured --max-seqs 4 --chat-template tests/chat_templates/qwen3-30b-a3b/chat_template.jinja --no-warmup
MODEL=tests/models/tiny-agent start agent --max-seqs 2 --no-warmup
grep -q "fp8moe serve: warmed up in .* (a prefill of 2048 tokens, 3 decode batch sizes)" "$OUT/main.log" &&
  ! grep -q "warmed up" "$OUT/busy.log" || { echo "serve tests: the warm-up line"; cat "$OUT/main.log"; exit 1; }
URL=http://127.0.0.1:$(cat "$OUT/main.port")
BUSY=http://127.0.0.1:$(cat "$OUT/busy.port")
OPS=http://127.0.0.1:$(cat "$OUT/ops.port")
echo "== serve: openai npm client against $URL"
node tests/serve/client.mjs "$URL" "$KEY" "$BUSY"
grep -q "fp8moe serve: request id=.* POST /v1/chat/completions status=200 prompt_tokens=[0-9]* cached_tokens=[0-9]* completion_tokens=[0-9]* ttft_ms=" \
  "$OUT/main.log" || { echo "no per-request log line"; tail "$OUT/main.log"; exit 1; }
echo "  ok  one log line per request"

echo "== serve: operations and hostile input against $OPS"
node tests/serve/server_ops.mjs "$OPS" "$URL" "$KEY" "$BUSY"

AGENT=http://127.0.0.1:$(cat "$OUT/agent.port")
echo "== serve: agent clients (openai: tools, reasoning, runTools; Vercel AI SDK) against $AGENT (tests/models/tiny-agent)"
node tests/serve/agent.mjs "$AGENT"
node tests/serve/aisdk.mjs "$AGENT"

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

echo "== serve: the serving benchmark's clients (bench/serve_bench.py and .mjs)"
tests/serve/bench_client.sh "$URL" "$KEY" "$BUSY"

echo "== serve: SIGTERM drains"
# a stream that ends within --drain-timeout finishes normally; meanwhile new requests and /health get 503
ops_pid=${pids[2]}
curl -sN -H "Content-Type: application/json" \
  -d '{"prompt":[1,2,3],"max_tokens":40,"ignore_eos":true,"stream":true}' "$OPS/v1/completions" >"$OUT/drained.txt" &
short=$!
for _ in $(seq 1 100); do grep -q '"text"' "$OUT/drained.txt" 2>/dev/null && break; sleep 0.05; done
kill -TERM "$ops_pid"
for _ in $(seq 1 100); do grep -q 'draining' "$OUT/ops.log" && break; sleep 0.05; done
code=$(curl -s -o "$OUT/drain503.json" -w '%{http_code}' -H "Content-Type: application/json" -d '{"prompt":[1],"max_tokens":1}' "$OPS/v1/completions")
[ "$code" = 503 ] || { echo "a request while draining got $code, not 503"; cat "$OUT/drain503.json"; exit 1; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "$OPS/health")" = 503 ] || { echo "/health is not 503 while draining"; exit 1; }
wait "$short"
grep -q '"finish_reason":"length"' "$OUT/drained.txt" || { echo "the short stream did not finish:"; tail -3 "$OUT/drained.txt"; exit 1; }
rc=0; wait "$ops_pid" || rc=$?
[ $rc = 0 ] || { echo "the ops server exited with $rc"; cat "$OUT/ops.log"; exit 1; }
unset 'pids[2]'
echo "  ok  a stream within --drain-timeout finished (length); new requests and /health got 503 meanwhile; exit 0"

echo "== serve: the CLI refuses what would be silently wrong"
rc=0; "$BIN" serve --model "$MODEL" --api-key "" --port 0 >"$OUT/emptykey.log" 2>&1 || rc=$?
[ $rc = 2 ] && grep -q 'api-key is empty' "$OUT/emptykey.log" || { echo "--api-key '' was not refused ($rc)"; cat "$OUT/emptykey.log"; exit 1; }
rc=0; timeout 60 "$BIN" serve --model "$MODEL" --port 0 --no-warmup --port-file /nonexistent-dir/port >"$OUT/portfile.log" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q 'port-file' "$OUT/portfile.log" || { echo "an unwritable --port-file was not an error ($rc)"; cat "$OUT/portfile.log"; exit 1; }
for cmd in "tokenize --model $MODEL --text hello" "generate --model $MODEL --prompt def --max-tokens 2"; do
  rc=0; $BIN $cmd >/dev/full 2>"$OUT/full.log" || rc=$?
  [ $rc = 1 ] && grep -q 'cannot write' "$OUT/full.log" || { echo "$cmd >/dev/full exited $rc"; cat "$OUT/full.log"; exit 1; }
done
g=$("$BIN" generate --model "$MODEL" --prompt "def main():" --max-tokens 8 2>/dev/null)
t=$("$BIN" generate --model "$MODEL" --prompt "def main():" --max-tokens 8 --temperature 1e-40 2>/dev/null)
p=$("$BIN" generate --model "$MODEL" --prompt "def main():" --max-tokens 8 --temperature 1 --top-p 1e-50 2>/dev/null)
[ "$g" = "$t" ] && [ "$g" = "$p" ] || { echo "generate: temperature 1e-40 / top-p 1e-50 are not greedy"; exit 1; }
echo "  ok  empty --api-key: exit 2; unwritable --port-file: exit 1; >/dev/full: exit 1; tiny T and top-p: greedy"
# a model whose context (max_position_embeddings 1024) is shorter than the default prefill chunk starts as it is
C1K=$OUT/ctx1024
rm -rf "$C1K"; mkdir -p "$C1K"
for f in "$MODEL"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$PWD/$f" "$C1K/"; done
sed 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 1024/' "$MODEL/config.json" >"$C1K/config.json"
grep -q '"max_position_embeddings": *1024' "$C1K/config.json"
MODEL_SAVED=$MODEL; MODEL=$C1K
start ctx1024
MODEL=$MODEL_SAVED
# the reply read whole first: under pipefail, grep -q closing the pipe at its match can fail curl with SIGPIPE
models=$(curl -s "http://127.0.0.1:$(cat "$OUT/ctx1024.port")/v1/models")
grep -q '"max_model_len":1024' <<<"$models" || { echo "the 1024-token model"; exit 1; }
kill -TERM "${pids[-1]}"; wait "${pids[-1]}"; unset 'pids[-1]'
echo "  ok  a model with max_position_embeddings 1024 serves with no option (max_model_len 1024)"

echo "== serve: the prefix cache of a hybrid model (synthetic toy-next: Gated DeltaNet state snapshots)"
SYNTHETIC=toy-next start next --max-seqs 2 --no-warmup
NEXT=http://127.0.0.1:$(cat "$OUT/next.port")
grep -q 'prefix cache of this hybrid model: 4 snapshots' "$OUT/next.log" || { echo "no snapshot line"; cat "$OUT/next.log"; exit 1; }
ids() { python3 -c "import sys; a = [int(x) for x in sys.argv[1:]]; print(list(range(a[0], a[1])) + list(range(a[2], a[3])))" "$@"; }
complete() { # PROMPT_JSON: prints the cached tokens, then the ids and log-probabilities of a greedy completion
  curl -s -H "Content-Type: application/json" -d "{\"prompt\":$1,\"max_tokens\":8,\"temperature\":0,\"logprobs\":1}" \
    "$NEXT/v1/completions" | python3 -c "import json,sys; d=json.load(sys.stdin); c=d['choices'][0]['logprobs']
print(d['usage']['prompt_tokens_details']['cached_tokens'], json.dumps(c['tokens']), json.dumps(c['token_logprobs']))"
}
a1=$(complete "$(ids 3 73 0 0)"); a2=$(complete "$(ids 3 73 0 0)")
# a 48-token system prompt, then questions of 20 to 23 tokens (a prompt's own last boundary is past the system prompt)
s1=$(complete "$(ids 10 58 200 220)"); s2=$(complete "$(ids 10 58 150 171)"); s3=$(complete "$(ids 10 58 100 123)")
[ "${a1%% *}" = 0 ] && [ "${a2%% *}" = 64 ] && [ "${a1#* }" = "${a2#* }" ] ||
  { echo "the same prompt twice: '$a1' then '$a2' (want 0 then 64 cached tokens, the same ids and log-probabilities)"; exit 1; }
[ "${s1%% *}" = 0 ] && [ "${s2%% *}" = 0 ] && [ "${s3%% *}" = 48 ] ||
  { echo "a shared 48-token system prompt: $s1 / $s2 / $s3 (want 0, 0, then 48 cached tokens)"; exit 1; }
metrics=$(curl -s "$NEXT/metrics") # whole, as above
grep -q '^fp8moe_state_snapshot_restores_total 2$' <<<"$metrics" || { echo "snapshot restores"; grep state_ <<<"$metrics"; exit 1; }
echo "  ok  the same prompt again maps the 64 tokens before its last boundary (same ids and log-probabilities); the third"
echo "      prompt sharing a system prompt maps it (the second took the snapshot); 2 snapshot restores in /metrics"

echo "== serve: clean shutdown"
used=$(curl -s -H "Authorization: Bearer $KEY" "$URL/metrics" | awk '/^fp8moe_kv_blocks_used /{print $2}')
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
grep -q '"finish_reason":"abort"' "$OUT/inflight.txt" || { echo "the cut stream's finish_reason is not abort"; exit 1; }
grep -q '"code":"server_shutting_down"' "$OUT/inflight.txt" || { echo "the cut stream has no error event"; exit 1; }
grep -q 'SIGTERM: draining' "$OUT/main.log" && grep -q '1 requests cut' "$OUT/main.log"
echo "  ok  the servers exited 0 on SIGTERM (no sanitizer report), no KV block in use; a stream past"
echo "      --drain-timeout was cut: an error event, finish_reason abort, data: [DONE]"
echo "SERVE TESTS PASSED"
