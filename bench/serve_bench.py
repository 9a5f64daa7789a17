#!/usr/bin/env python3
"""The serving benchmark's client in Python (standard library only), for machines without Node (the GPU machine):
the same requests, prompts, figures and table as bench/serve_bench.mjs, which documents them.

    python3 bench/serve_bench.py --url http://127.0.0.1:8080 --clients 1,8 --prompt-tokens 1800 --max-tokens 128 \\
        --duration 30 --json serve.json

One thread per client; each request is a streamed /v1/completions with token-id prompts, temperature 0 and ignore_eos;
a token's time is the arrival of its chunk, relative to the send.

Every prompt that is meant to be new is new: its ids are drawn from a generator seeded by the run's --seed (random
unless given), the row, the client and the request, so no request finds another's prompt in the server's prefix
cache. --prompts K opts into a fixed pool of K prompts instead, cycled (client c's request r sends prompt (c + r) % K),
which the cache serves after their first use. Every row shows the share of prompt tokens the server took from its
cache (usage.prompt_tokens_details.cached_tokens), so a reader sees whether the cache played a part.

Workloads with shared prefixes (for the prefix cache; compare a server started with --no-prefix-cache):
  --workload shared-prefix   every prompt is one system prompt of --prefix-tokens ids (one per row), then
                             --prompt-tokens new ids of its own (N clients, one system prompt)
  --workload multi-turn      each client holds conversations of --turns turns: turn 1 is a new prompt of
                             --prompt-tokens ids, turn t the previous turn's prompt, then --max-tokens ids standing for
                             its answer (fixed ids, not the generated ones: token-id prompts get text back), then
                             --turn-tokens new ids. TTFT is reported for first turns and for later ones apart.
  --workload arrivals        the clients are streams decoding while long new prompts keep arriving (the probe, of
                             --probe-prompt-tokens ids, default 1800): the streams' inter-token gaps that overlap a
                             prompt's prefill are reported apart, p50, p99 and p99/p50.

After the table, a line per row gives the server's steps during it, from its /metrics before and after (fp8moe
only): decode-only and mixed steps (decode and prompt rows together) with their mean wall time, the mean prompt share
of a mixed step, and the step budget (--step-budget fixed|latency, docs/mixed-steps.md).

Errors are counted, never hidden: each row shows the share of requests that failed, the first error's text is printed,
a client waits after an error (50 ms, doubling to 1 s while they continue) instead of retrying at once, and the run
exits 1 when a row's error rate is above 1% (or a row completed nothing): its figures are not a measurement."""
import argparse
import datetime
import http.client
import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.parse

M32 = 0xFFFFFFFF
MAX_ERROR_RATE = 0.01  # above it, a row's figures describe failures, not serving: the run fails
# what a generator seed is for (mixed into it, so that no two kinds of prompt share ids)
PROMPT, PROBE, SYSTEM, TURN, WARMUP, POOL, PROBE_POOL = range(1, 8)


def mix32(*xs):
    """One 32-bit seed from several numbers (murmur3's finalizer after each): the same in serve_bench.mjs."""
    h = 0x811C9DC5
    for x in xs:
        h ^= x & M32
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & M32
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & M32
        h ^= h >> 16
    return h


def make_ids(n, vocab, seed):
    """n prompt ids in [16, vocab) from a linear congruential generator: the same ids as serve_bench.mjs."""
    s = seed & M32
    out = []
    for _ in range(n):
        s = (s * 1664525 + 1013904223) & M32
        out.append(16 + s % (vocab - 16))
    return out


class Prompts:
    """Every prompt of a run: seeded by (--seed, what it is for, row, client, request), or drawn from the pool."""

    def __init__(self, a):
        self.a = a
        self.pool = [make_ids(a.prompt_tokens, a.vocab, mix32(a.seed, POOL, i)) for i in range(a.prompts)]
        self.probe_pool = [make_ids(a.probe_prompt_tokens, a.vocab, mix32(a.seed, PROBE_POOL, i))
                           for i in range(a.prompts if a.probe_prompt_tokens else 0)]

    def system(self, row):
        """shared-prefix: the row's system prompt (a row of its own: the previous row's is not in the cache for it)"""
        return make_ids(self.a.prefix_tokens, self.a.vocab, mix32(self.a.seed, SYSTEM, row))

    def fresh(self, row, c, r, pool_index):
        """a prompt meant to be new: client c's r-th, or the pool's prompt pool_index with --prompts"""
        if self.pool:
            return self.pool[pool_index % len(self.pool)]
        return make_ids(self.a.prompt_tokens, self.a.vocab, mix32(self.a.seed, PROMPT, row, c, r))

    def request(self, row, c, r, clients, system):
        """client c's request r in the row: (prompt ids, turn index from 0)"""
        a = self.a
        if a.workload != "multi-turn":
            return system + self.fresh(row, c, r, c + r), 0
        conv, turn = divmod(r, a.turns)
        p = list(self.fresh(row, c, conv, c + conv * clients))
        for t in range(1, turn + 1):  # the earlier turns' answers and questions, the same ids each time
            p += make_ids(a.max_tokens + a.turn_tokens, a.vocab, mix32(a.seed, TURN, row, c, conv, t))
        return p, turn

    def probe(self, row, r):
        if self.probe_pool:
            return self.probe_pool[r % len(self.probe_pool)]
        return make_ids(self.a.probe_prompt_tokens, self.a.vocab, mix32(self.a.seed, PROBE, row, r))

    def warmup(self, row, w):
        return make_ids(self.a.prompt_tokens, self.a.vocab, mix32(self.a.seed, WARMUP, row, w))


def one_request(a, host, port, model, prompt, max_tokens=None):
    """times of the tokens (ms after the send), completion tokens, cached prompt tokens (None: not reported)"""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens or a.max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        res = conn.getresponse()
        if res.status != 200:
            raise RuntimeError("HTTP %d: %s" % (res.status, res.read()[:300].decode("utf-8", "replace")))
        times, usage, done, buf = [], None, False, b""
        while True:
            part = res.read1(65536)
            if not part:
                break
            buf += part
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.decode("utf-8").split("\n"):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    o = json.loads(data)
                    if o.get("error"):
                        raise RuntimeError("stream error: " + o["error"].get("message", ""))
                    if o.get("usage"):
                        usage = o["usage"]
                    c = (o.get("choices") or [None])[0]
                    if c is not None and c.get("finish_reason") is None:
                        times.append((time.perf_counter() - t0) * 1e3)  # one chunk per token
        if not done:
            raise RuntimeError("the stream ended without [DONE]")
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        return times, usage["completion_tokens"] if usage else len(times), cached
    finally:
        conn.close()


def server_metrics(a, host, port):
    """the server's /metrics as {name: value} (labelled series left out); {} when it cannot be read"""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + a.api_key} if a.api_key else {})
        res = conn.getresponse()
        text = res.read().decode("utf-8", "replace") if res.status == 200 else ""
        conn.close()
    except Exception:
        return {}
    out = {}
    for line in text.split("\n"):
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def step_figures(before, after):
    """the server's steps during a row, from its /metrics before and after (None where it does not report them)"""
    if "fp8moe_mixed_step_seconds_count" not in after or "fp8moe_mixed_step_seconds_count" not in before:
        return None
    d = lambda k: after.get(k, 0.0) - before.get(k, 0.0)
    mean_ms = lambda kind: 1e3 * d("fp8moe_%s_step_seconds_sum" % kind) / d("fp8moe_%s_step_seconds_count" % kind) \
        if d("fp8moe_%s_step_seconds_count" % kind) > 0 else float("nan")
    mixed = d("fp8moe_mixed_steps_total")
    return {"step_budget": "latency" if after.get("fp8moe_step_budget_latency") == 1 else "fixed",
            "decode_steps": int(d("fp8moe_decode_step_seconds_count")), "decode_step_ms_mean": mean_ms("decode"),
            "mixed_steps": int(mixed), "mixed_step_ms_mean": mean_ms("mixed"),
            "mixed_step_prefill_tokens_mean": d("fp8moe_mixed_step_prefill_tokens_total") / mixed if mixed else
            float("nan"), "prefill_steps": int(d("fp8moe_prefill_step_seconds_count")),
            "prefill_step_ms_mean": mean_ms("prefill")}


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def backoff_s(consecutive_errors):
    """the wait after an error: 50 ms, doubling while errors continue, at most 1 s"""
    return min(1.0, 0.05 * 2 ** min(consecutive_errors - 1, 5))


def run_level(a, host, port, model, prompts, row, clients):
    if a.workload != "shared-prefix":  # shared-prefix: the first request pays for the system prompt
        for w in range(a.warmup):
            try:
                one_request(a, host, port, model, prompts.warmup(row, w))
            except Exception as e:  # the server does not serve: no row to measure
                raise SystemExit("serve_bench: the warm-up request at %d clients failed: %s" % (clients, e))
    system = prompts.system(row) if a.workload == "shared-prefix" else []
    lock = threading.Lock()
    st = {"ttft": [], "itl": [], "tpot": [], "tokens": 0, "completed": 0, "errors": 0, "started": 0,
          "first_error": "", "t_end": 0.0, "probe_ttft": [], "stop_probe": False, "ttft_first": [],
          "ttft_later": [], "prompt_tokens": 0, "cached_tokens": 0, "cached_unknown": 0, "probe_prompt_tokens": 0,
          "probe_cached_tokens": 0, "first_turn_prompt_tokens": 0, "first_turn_cached_tokens": 0, "itl_arrivals": [],
          "in_flight": []}
    metrics_before = server_metrics(a, host, port)
    t0 = time.perf_counter()
    deadline = t0 + a.duration

    def more():
        return st["started"] < a.requests if a.requests else time.perf_counter() < deadline

    def count_prompt(prompt, cached, what):
        st["prompt_tokens"] += len(prompt)
        if cached is None:
            st["cached_unknown"] += 1
            return
        st["cached_tokens"] += cached
        if what:  # "probe" or "first_turn": apart too
            st[what + "_prompt_tokens"] += len(prompt)
            st[what + "_cached_tokens"] += cached

    def failed(e, who, consecutive):
        with lock:
            st["errors"] += 1
            if not st["first_error"]:
                st["first_error"] = who + (str(e) or type(e).__name__)
                print("  first error at %d clients: %s" % (clients, st["first_error"]), file=sys.stderr, flush=True)
        if a.requests:
            time.sleep(backoff_s(consecutive))
        else:
            time.sleep(max(0.0, min(backoff_s(consecutive), deadline - time.perf_counter())))

    def client(c):
        r, errors_in_a_row = 0, 0
        while True:
            with lock:
                if not more():
                    return
                st["started"] += 1
            try:
                prompt, turn = prompts.request(row, c, r, clients, system)
                sent = time.perf_counter() * 1e3
                times, n, cached = one_request(a, host, port, model, prompt)
                errors_in_a_row = 0
                with lock:
                    for i in range(1, len(times)):  # a gap between tokens that overlaps an arrival's prefill
                        if any(sent + times[i] > f and sent + times[i - 1] < t for f, t in st["in_flight"]):
                            st["itl_arrivals"].append(times[i] - times[i - 1])
                    st["completed"] += 1
                    st["tokens"] += n
                    count_prompt(prompt, cached, "first_turn" if turn == 0 else "")
                    if times:
                        st["ttft"].append(times[0])
                        st["ttft_first" if turn == 0 else "ttft_later"].append(times[0])
                    st["itl"].extend(times[i] - times[i - 1] for i in range(1, len(times)))
                    if len(times) > 1:
                        st["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
            except Exception as e:  # counted, the first one printed, and a pause before the next request
                errors_in_a_row += 1
                failed(e, "", errors_in_a_row)
            with lock:
                st["t_end"] = time.perf_counter()
            r += 1

    def probe():
        """One long prompt at a time, 1 new token, while the clients decode: its time to first token under load."""
        time.sleep(min(2.0, a.duration / 4))  # let the clients' prompts in and their decoding start
        r, errors_in_a_row = 0, 0
        while not st["stop_probe"] and time.perf_counter() < deadline:
            try:
                prompt = prompts.probe(row, r)
                sent = time.perf_counter() * 1e3
                times, _, cached = one_request(a, host, port, model, prompt, 1)
                errors_in_a_row = 0
                with lock:
                    count_prompt(prompt, cached, "probe")
                    if times:
                        st["probe_ttft"].append(times[0])
                        st["in_flight"].append((sent, sent + times[0]))
            except Exception as e:
                errors_in_a_row += 1
                failed(e, "probe: ", errors_in_a_row)
            r += 1
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    if a.probe_prompt_tokens:
        threads.append(threading.Thread(target=probe))
    for t in threads:
        t.start()
    for t in threads[:clients]:
        t.join()
    st["stop_probe"] = True
    for t in threads[clients:]:
        t.join()
    wall = max(st["t_end"] - t0, 1e-9)
    steps = step_figures(metrics_before, server_metrics(a, host, port))
    attempts = st["completed"] + len(st["probe_ttft"]) + st["errors"]
    nan = float("nan")
    return {"clients": clients, "requests": st["completed"], "errors": st["errors"],
            "error_rate": st["errors"] / attempts if attempts else nan,
            "first_error": st["first_error"] or None, "wall_s": wall, "output_tokens": st["tokens"],
            "output_tokens_per_s": st["tokens"] / wall, "requests_per_s": st["completed"] / wall,
            "ttft_ms_p50": pct(st["ttft"], 50), "ttft_ms_p99": pct(st["ttft"], 99),
            "itl_ms_p50": pct(st["itl"], 50), "itl_ms_p99": pct(st["itl"], 99),
            "tpot_ms_mean": sum(st["tpot"]) / len(st["tpot"]) if st["tpot"] else nan,
            "itl_arrivals_ms_p50": pct(st["itl_arrivals"], 50), "itl_arrivals_ms_p99": pct(st["itl_arrivals"], 99),
            "itl_arrivals_samples": len(st["itl_arrivals"]), "probe_requests": len(st["probe_ttft"]),
            "probe_ttft_ms_p50": pct(st["probe_ttft"], 50), "probe_ttft_ms_p99": pct(st["probe_ttft"], 99),
            "cached_prompt_fraction": st["cached_tokens"] / st["prompt_tokens"]
            if st["prompt_tokens"] and not st["cached_unknown"] else nan,
            "probe_cached_prompt_fraction": st["probe_cached_tokens"] / st["probe_prompt_tokens"]
            if st["probe_prompt_tokens"] and not st["cached_unknown"] else nan,
            "first_turn_cached_prompt_fraction": st["first_turn_cached_tokens"] / st["first_turn_prompt_tokens"]
            if st["first_turn_prompt_tokens"] and not st["cached_unknown"] else nan,
            "ttft_ms_p50_first_turn": pct(st["ttft_first"], 50), "ttft_ms_p50_later_turns": pct(st["ttft_later"], 50),
            "steps": steps}


def row_failure(r):
    """why a row's figures are not a measurement, or None"""
    if r["requests"] == 0:
        return "no request completed"
    if r["error_rate"] > MAX_ERROR_RATE:
        return "%.1f%% of requests failed (%d of %d)" % (100 * r["error_rate"], r["errors"],
                                                         r["requests"] + r["probe_requests"] + r["errors"])
    return None


def fmt(x, width, digits=1):
    return ("%.*f" % (digits, x) if isinstance(x, (int, float)) and math.isfinite(x) else "-").rjust(width)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--prompts", type=int, default=0,
                   help="a fixed pool of K prompts, cycled (the cache serves them after their first use); "
                        "default 0: every prompt meant to be new is new")
    p.add_argument("--seed", type=int, default=None,
                   help="the prompts' seed (default: random, printed): the same seed and options, the same ids")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--requests", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--api-key", default="")
    p.add_argument("--json", default="")
    p.add_argument("--label", default="")
    p.add_argument("--workload", choices=["random", "shared-prefix", "multi-turn", "arrivals"], default="random",
                   help="new random prompts (default), one shared system prompt, multi-turn conversations, or streams "
                        "while long prompts arrive (top)")
    p.add_argument("--prefix-tokens", type=int, default=2048, help="shared-prefix: the system prompt's ids")
    p.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    p.add_argument("--turn-tokens", type=int, default=128, help="multi-turn: new user ids per turn after the first")
    p.add_argument("--probe-prompt-tokens", type=int, default=0,
                   help="also run a probe client: prompts of N tokens, 1 new token each, one after another while "
                        "the clients decode; its TTFT is reported apart (e.g. a 1.8k prompt while 8 streams decode)")
    a = p.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    if min(clients) < 1 or a.prompt_tokens < 1 or a.max_tokens < 1 or a.vocab < 17 or a.duration <= 0:
        p.error("--clients, --prompt-tokens, --max-tokens >= 1, --vocab >= 17, --duration > 0")
    if a.prompts < 0 or a.requests < 0 or a.warmup < 0 or a.probe_prompt_tokens < 0:
        p.error("--prompts, --requests, --warmup, --probe-prompt-tokens >= 0")
    if a.prefix_tokens < 1 or a.turns < 1 or a.turn_tokens < 1:
        p.error("--prefix-tokens, --turns, --turn-tokens >= 1")
    if a.workload not in ("random", "arrivals") and a.probe_prompt_tokens:
        p.error("--probe-prompt-tokens goes with --workload random or arrivals only")
    if a.seed is not None and not 0 <= a.seed <= M32:
        p.error("--seed expects an integer in [0, 4294967295]")
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little")
    if a.workload == "arrivals" and not a.probe_prompt_tokens:
        a.probe_prompt_tokens = 1800
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    try:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + a.api_key} if a.api_key else {})
        res = conn.getresponse()
        if res.status != 200:
            raise RuntimeError("HTTP %d" % res.status)
        models = json.loads(res.read())
    except Exception as e:
        print("serve_bench: %s/v1/models: %s (is the server running?)" % (a.url, e), file=sys.stderr)
        return 1
    model, ctx = models["data"][0]["id"], models["data"][0].get("max_model_len")
    longest = a.prompt_tokens + (a.prefix_tokens if a.workload == "shared-prefix" else 0) + \
        ((a.turns - 1) * (a.max_tokens + a.turn_tokens) if a.workload == "multi-turn" else 0)
    if ctx and longest + a.max_tokens > ctx:
        p.error("the longest prompt (%d ids) + --max-tokens %d exceed the server's context of %d (serve --ctx)"
                % (longest, a.max_tokens, ctx))
    prompts = Prompts(a)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    print("model %s at %s   workload %s   prompts: %s of %d token ids%s (seed %d)   new tokens: %d per request "
          "(ignore_eos)   %s%s"
          % (model, a.url, a.workload, "a pool of %d" % a.prompts if a.prompts else "each new", a.prompt_tokens,
             " after a shared prefix of %d" % a.prefix_tokens if a.workload == "shared-prefix" else
             ", %d turns of %d more" % (a.turns, a.max_tokens + a.turn_tokens) if a.workload == "multi-turn" else "",
             a.seed, a.max_tokens,
             "%d requests per row" % a.requests if a.requests else "%g s per row" % a.duration,
             "   commit " + commit if commit else ""))
    print()
    probe_head = (" probe TTFT p50 ms | probe TTFT p99 ms | ITL p50 arriving ms | ITL p99 arriving ms | p99/p50 |",
                  "------------------:|------------------:|--------------------:|--------------------:|--------:|") \
        if a.probe_prompt_tokens else ("", "")
    turn_head = (" cached % turn 1 | TTFT p50 turn 1 ms | TTFT p50 later ms |",
                 "----------------:|-------------------:|------------------:|") \
        if a.workload == "multi-turn" else ("", "")
    print("| clients | requests | errors | error % | cached % | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms "
          "| ITL p50 ms | ITL p99 ms | TPOT mean ms |" + probe_head[0] + turn_head[0])
    print("|--------:|---------:|-------:|--------:|---------:|-------------:|------:|------------:|------------:"
          "|-----------:|-----------:|-------------:|" + probe_head[1] + turn_head[1])
    rows = []
    for row, c in enumerate(clients):
        r = run_level(a, host, port, model, prompts, row, c)
        rows.append(r)
        cols = [fmt(c, 7, 0), fmt(r["requests"], 8, 0), fmt(r["errors"], 6, 0), fmt(100 * r["error_rate"], 7, 2),
                fmt(100 * r["cached_prompt_fraction"], 8), fmt(r["output_tokens_per_s"], 12),
                fmt(r["requests_per_s"], 5, 2), fmt(r["ttft_ms_p50"], 11), fmt(r["ttft_ms_p99"], 11),
                fmt(r["itl_ms_p50"], 10, 2), fmt(r["itl_ms_p99"], 10, 2), fmt(r["tpot_ms_mean"], 12, 2)]
        if a.probe_prompt_tokens:
            cols += [fmt(r["probe_ttft_ms_p50"], 17), fmt(r["probe_ttft_ms_p99"], 17),
                     fmt(r["itl_arrivals_ms_p50"], 19, 2), fmt(r["itl_arrivals_ms_p99"], 19, 2),
                     fmt(r["itl_arrivals_ms_p99"] / r["itl_arrivals_ms_p50"]
                         if r["itl_arrivals_samples"] and r["itl_arrivals_ms_p50"] > 0 else float("nan"), 7, 2)]
        if a.workload == "multi-turn":
            cols += [fmt(100 * r["first_turn_cached_prompt_fraction"], 15), fmt(r["ttft_ms_p50_first_turn"], 18),
                     fmt(r["ttft_ms_p50_later_turns"], 17)]
        print("| " + " | ".join(cols) + " |", flush=True)
    # the server's steps in each row (its /metrics): the step budget's choices, after the table (a blank line ends it)
    print()
    for c, r in zip(clients, rows):
        t = r["steps"]
        if t is None:
            print("steps at %d clients: the server's /metrics has no step figures (a build before the step budget)" % c)
        else:
            print("steps at %d clients (--step-budget %s): decode-only %d, mean %.2f ms; mixed %d, mean %.2f ms, "
                  "%.1f prompt tokens each; prompt-only %d, mean %.2f ms"
                  % (c, t["step_budget"], t["decode_steps"], t["decode_step_ms_mean"], t["mixed_steps"],
                     t["mixed_step_ms_mean"], t["mixed_step_prefill_tokens_mean"], t["prefill_steps"],
                     t["prefill_step_ms_mean"]), flush=True)
    failures = [(c, row_failure(r), r["first_error"]) for c, r in zip(clients, rows) if row_failure(r)]
    if failures:  # after the table and the steps, on stdout: what keeps those figures from being results
        print()
    for c, why, first in failures:
        print("FAILED at %d clients: %s%s" % (c, why, "; first error: " + first if first else ""), flush=True)
    if a.json:
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v
        out = {"bench": "serve", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "commit": commit,
               "label": a.label, "workload": a.workload, "prefix_tokens": a.prefix_tokens if a.workload == "shared-prefix" else None,
               "turns": a.turns if a.workload == "multi-turn" else None,
               "turn_tokens": a.turn_tokens if a.workload == "multi-turn" else None, "url": a.url, "model": model, "max_model_len": ctx, "prompt_tokens": a.prompt_tokens,
               "prompts": a.prompts or None, "seed": a.seed, "max_tokens": a.max_tokens, "probe_prompt_tokens": a.probe_prompt_tokens or None, "duration_s": None if a.requests else a.duration,
               "requests_per_row": a.requests or None, "max_error_rate": MAX_ERROR_RATE,
               "rows": [dict({k: clean(v) for k, v in r.items() if k != "steps"}, failed=row_failure(r),
                             steps={k: clean(v) for k, v in r["steps"].items()} if r["steps"] else None)
                        for r in rows]}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print("\nwrote " + a.json)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
