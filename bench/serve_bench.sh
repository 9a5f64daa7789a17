#!/usr/bin/env bash
# The serving benchmark end to end: starts `fp8moe serve` with the given options, waits for /health, runs
# bench/serve_bench.mjs against it, stops the server (SIGTERM) and returns the clients' exit code (1 when a row had
# more than 1% of its requests failed: its table says FAILED under it; every client run still runs).
#
#   bench/serve_bench.sh [serve options] -- [serve_bench.mjs options] [-- [serve_bench.mjs options] ...]
#
# Each `--` group is one client run against the same server, one after the other (one load for several tables).
# The server listens on a free port of 127.0.0.1 (--port 0; do not pass --port or --port-file). Give it --max-seqs at
# least the largest client count, and a --ctx that holds --prompt-tokens + --max-tokens. Examples:
#   bench/serve_bench.sh --model models/tiny-code-moe --max-seqs 4 --ctx 512 -- \
#       --clients 1,4 --prompt-tokens 64 --max-tokens 32 --duration 10
#   bench/serve_bench.sh --synthetic qwen3-30b-a3b --backend cuda --preset fp8 --dense w8a8 --max-seqs 64 --ctx 4096 \
#       -- --clients 1,8,64 --prompt-tokens 1800 --max-tokens 256 --duration 60 --json serve-h200.json
#   bench/serve_bench.sh --model DIR --max-seqs 64 --ctx 4096 -- --clients 64 \
#       --workload shared-prefix --prefix-tokens 2048 --prompt-tokens 256 --max-tokens 256 --duration 60
#   (and the same server with --no-prefix-cache for the comparison; --workload multi-turn --turns 4 likewise)
# FP8MOE_BIN picks the binary (default build/fp8moe); SERVE_BENCH_WAIT_S how long to wait for the load (default 900).
set -euo pipefail
BIN=${FP8MOE_BIN:-build/fp8moe}
WAIT_S=${SERVE_BENCH_WAIT_S:-900}
HERE=$(dirname "$0")

serve_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do serve_args+=("$1"); shift; done
[ $# -gt 0 ] && shift # the --
if [ ${#serve_args[@]} -eq 0 ]; then
    echo "usage: $0 [serve options] -- [serve_bench.mjs options] (see the comment at the top)" >&2
    exit 2
fi
# the client: Node's serve_bench.mjs, or its Python twin serve_bench.py where there is no Node (the GPU machine)
# (SERVE_BENCH_PY=1 forces the Python one)
if command -v node >/dev/null && [ -z "${SERVE_BENCH_PY:-}" ]; then client=(node "$HERE/serve_bench.mjs")
elif command -v python3 >/dev/null; then client=(python3 "$HERE/serve_bench.py")
else echo "serve_bench.sh: node or python3 is needed" >&2; exit 1; fi
command -v curl >/dev/null || { echo "serve_bench.sh: curl is needed" >&2; exit 1; }
[ -x "$BIN" ] || { echo "serve_bench.sh: $BIN is not built (make all)" >&2; exit 1; }

tmp=$(mktemp -d)
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "== $BIN serve ${serve_args[*]} --port 0" >&2
"$BIN" serve "${serve_args[@]}" --port 0 --port-file "$tmp/port" >"$tmp/serve.log" 2>&1 &
pid=$!
start=$SECONDS
until [ -s "$tmp/port" ] && curl -sf "http://127.0.0.1:$(cat "$tmp/port")/health" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "serve_bench.sh: the server exited during its start:" >&2
        cat "$tmp/serve.log" >&2
        pid=""
        exit 1
    fi
    if [ $((SECONDS - start)) -ge "$WAIT_S" ]; then
        echo "serve_bench.sh: no /health after $WAIT_S s; the server's log:" >&2
        cat "$tmp/serve.log" >&2
        exit 1
    fi
    sleep 0.2
done
port=$(cat "$tmp/port")
echo "== listening on 127.0.0.1:$port after $((SECONDS - start)) s" >&2
rc=0
# the client runs: the option groups between the `--`s
group=()
run_group() { "${client[@]}" --url "http://127.0.0.1:$port" "${group[@]}" || rc=$?; group=(); }
for arg in "$@"; do
    if [ "$arg" = "--" ]; then run_group; else group+=("$arg"); fi
done
run_group
kill -TERM "$pid"
if ! wait "$pid"; then
    echo "serve_bench.sh: the server did not exit cleanly; its log:" >&2
    cat "$tmp/serve.log" >&2
    [ $rc -ne 0 ] || rc=1
fi
pid=""
exit $rc
