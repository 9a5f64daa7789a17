#!/usr/bin/env python3
"""The serving benchmark's client in Python (standard library only), for machines without Node (the GPU machine):
the same requests, prompt set, figures and table as bench/serve_bench.mjs, which documents them.

    python3 bench/serve_bench.py --url http://127.0.0.1:8080 --clients 1,8 --prompt-tokens 1800 --max-tokens 128 \\
        --duration 30 --json serve.json

One thread per client; each request is a streamed /v1/completions with token-id prompts, temperature 0 and ignore_eos;
a token's time is the arrival of its chunk, relative to the send.

Workloads with shared prefixes (for the prefix cache; compare a server started with --no-prefix-cache):
  --workload shared-prefix   every prompt is one system prompt of --prefix-tokens ids, then --prompt-tokens ids of
                             its own (N clients, one system prompt)
  --workload multi-turn      each client holds conversations of --turns turns: turn 1 is a prompt of --prompt-tokens
                             ids, turn t the previous turn's prompt, then --max-tokens ids standing for its answer
                             (fixed ids, not the generated ones: token-id prompts get text back), then --turn-tokens
                             new ids. TTFT is reported for first turns and for later ones apart.
Both report the share of prompt tokens the server took from its cache (usage.prompt_tokens_details.cached_tokens).
  --workload arrivals        the clients are streams decoding while long prompts keep arriving (the probe, of
                             --probe-prompt-tokens ids, default 1800): the streams' inter-token gaps that overlap a
                             prompt's prefill are reported apart, p50, p99 and p99/p50."""
import argparse
import datetime
import http.client
import json
import math
import subprocess
import sys
import threading
import time
import urllib.parse


def make_prompts(k, n, vocab, seed=0x9E3779B9):
    """The fixed prompt set of serve_bench.mjs: the same seeded generator, the same ids."""
    s = seed
    out = []
    for _ in range(k):
        p = []
        for _ in range(n):
            s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
            p.append(16 + s % (vocab - 16))
        out.append(p)
    return out


def one_request(a, host, port, model, prompt, max_tokens=None):
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
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        return times, usage["completion_tokens"] if usage else len(times), cached
    finally:
        conn.close()


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def conversation_prompt(a, prompts, c, r, clients):
    """multi-turn: request r of client c, as (prompt, turn index from 0)"""
    conv, turn = divmod(r, a.turns)
    k = c + conv * clients
    p = list(prompts[k % len(prompts)])
    for t in range(1, turn + 1):
        p += make_prompts(1, a.max_tokens + a.turn_tokens, a.vocab, seed=(0x51ED27 + 7919 * k + 104729 * t) & 0xFFFFFFFF)[0]
    return p, turn


def run_level(a, host, port, model, prompts, probe_prompts, clients):
    for w in range(a.warmup if a.workload != "shared-prefix" else 0):  # shared-prefix: the first request pays it
        one_request(a, host, port, model, make_prompts(1, a.prompt_tokens, a.vocab, seed=0xC0FFEE + w)[0])
    lock = threading.Lock()
    st = {"ttft": [], "itl": [], "tpot": [], "tokens": 0, "completed": 0, "errors": 0, "started": 0,
          "first_error": "", "t_end": 0.0, "probe_ttft": [], "stop_probe": False, "ttft_first": [],
          "ttft_later": [], "prompt_tokens": 0, "cached_tokens": 0, "itl_arrivals": [], "in_flight": []}
    t0 = time.perf_counter()
    deadline = t0 + a.duration

    def more():
        return st["started"] < a.requests if a.requests else time.perf_counter() < deadline

    def client(c):
        r = 0
        while True:
            with lock:
                if not more():
                    return
                st["started"] += 1
            try:
                if a.workload == "multi-turn":
                    prompt, turn = conversation_prompt(a, prompts, c, r, clients)
                else:
                    prompt, turn = prompts[(c + r) % len(prompts)], 0
                sent = time.perf_counter() * 1e3
                times, n, cached = one_request(a, host, port, model, prompt)
                with lock:
                    for i in range(1, len(times)):  # a gap between tokens that overlaps an arrival's prefill
                        if any(sent + times[i] > f and sent + times[i - 1] < t for f, t in st["in_flight"]):
                            st["itl_arrivals"].append(times[i] - times[i - 1])
                    st["completed"] += 1
                    st["tokens"] += n
                    st["prompt_tokens"] += len(prompt)
                    st["cached_tokens"] += cached
                    if times:
                        st["ttft"].append(times[0])
                        st["ttft_first" if turn == 0 else "ttft_later"].append(times[0])
                    st["itl"].extend(times[i] - times[i - 1] for i in range(1, len(times)))
                    if len(times) > 1:
                        st["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
            except Exception as e:  # counted, the first one reported
                with lock:
                    st["errors"] += 1
                    st["first_error"] = st["first_error"] or str(e)
            with lock:
                st["t_end"] = time.perf_counter()
            r += 1

    def probe():
        """One long prompt at a time, 1 new token, while the clients decode: its time to first token under load."""
        time.sleep(min(2.0, a.duration / 4))  # let the clients' prompts in and their decoding start
        r = 0
        while not st["stop_probe"] and time.perf_counter() < deadline:
            try:
                sent = time.perf_counter() * 1e3
                times, _, _ = one_request(a, host, port, model, probe_prompts[r % len(probe_prompts)], 1)
                with lock:
                    if times:
                        st["probe_ttft"].append(times[0])
                        st["in_flight"].append((sent, sent + times[0]))
            except Exception as e:
                with lock:
                    st["errors"] += 1
                    st["first_error"] = st["first_error"] or "probe: " + str(e)
            r += 1
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    if probe_prompts:
        threads.append(threading.Thread(target=probe))
    for t in threads:
        t.start()
    for t in threads[:clients]:
        t.join()
    st["stop_probe"] = True
    for t in threads[clients:]:
        t.join()
    wall = max(st["t_end"] - t0, 1e-9)
    return {"clients": clients, "requests": st["completed"], "errors": st["errors"],
            "first_error": st["first_error"] or None, "wall_s": wall, "output_tokens": st["tokens"],
            "output_tokens_per_s": st["tokens"] / wall, "requests_per_s": st["completed"] / wall,
            "ttft_ms_p50": pct(st["ttft"], 50), "ttft_ms_p99": pct(st["ttft"], 99),
            "itl_ms_p50": pct(st["itl"], 50), "itl_ms_p99": pct(st["itl"], 99),
            "tpot_ms_mean": sum(st["tpot"]) / len(st["tpot"]) if st["tpot"] else float("nan"),
            "itl_arrivals_ms_p50": pct(st["itl_arrivals"], 50), "itl_arrivals_ms_p99": pct(st["itl_arrivals"], 99),
            "itl_arrivals_samples": len(st["itl_arrivals"]), "probe_requests": len(st["probe_ttft"]), "probe_ttft_ms_p50": pct(st["probe_ttft"], 50),
            "probe_ttft_ms_p99": pct(st["probe_ttft"], 99),
            "cached_prompt_fraction": st["cached_tokens"] / st["prompt_tokens"] if st["prompt_tokens"] else float("nan"),
            "ttft_ms_p50_first_turn": pct(st["ttft_first"], 50), "ttft_ms_p50_later_turns": pct(st["ttft_later"], 50)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--requests", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--api-key", default="")
    p.add_argument("--json", default="")
    p.add_argument("--label", default="")
    p.add_argument("--workload", choices=["random", "shared-prefix", "multi-turn", "arrivals"], default="random",
                   help="random prompts (default), one shared system prompt, multi-turn conversations, or streams "
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
    if a.prefix_tokens < 1 or a.turns < 1 or a.turn_tokens < 1:
        p.error("--prefix-tokens, --turns, --turn-tokens >= 1")
    if a.workload not in ("random", "arrivals") and a.probe_prompt_tokens:
        p.error("--probe-prompt-tokens goes with --workload random or arrivals only")
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
    prompts = make_prompts(a.prompts, a.prompt_tokens, a.vocab)
    if a.workload == "shared-prefix":
        system = make_prompts(1, a.prefix_tokens, a.vocab, seed=0x5157E4)[0]
        prompts = [system + q for q in prompts]
    probe_prompts = make_prompts(a.prompts, a.probe_prompt_tokens, a.vocab) if a.probe_prompt_tokens else []
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    print("model %s at %s   workload %s   prompts: %d of %d token ids%s   new tokens: %d per request (ignore_eos)   %s%s"
          % (model, a.url, a.workload, a.prompts, a.prompt_tokens,
             " after a shared prefix of %d" % a.prefix_tokens if a.workload == "shared-prefix" else
             ", %d turns of %d more" % (a.turns, a.max_tokens + a.turn_tokens) if a.workload == "multi-turn" else "",
             a.max_tokens,
             "%d requests per row" % a.requests if a.requests else "%g s per row" % a.duration,
             "   commit " + commit if commit else ""))
    print()
    shared = a.workload in ("shared-prefix", "multi-turn")
    probe_head = (" probe TTFT p50 ms | probe TTFT p99 ms | ITL p50 arriving ms | ITL p99 arriving ms | p99/p50 |",
                  "------------------:|------------------:|--------------------:|--------------------:|--------:|") \
        if probe_prompts else (" cached % | TTFT p50 turn 1 ms | TTFT p50 later ms |",
                               "---------:|-------------------:|------------------:|") if shared \
        else ("", "")
    print("| clients | requests | errors | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
          "| TPOT mean ms |" + probe_head[0])
    print("|--------:|---------:|-------:|-------------:|------:|------------:|------------:|-----------:|-----------:"
          "|-------------:|" + probe_head[1])
    rows = []
    for c in clients:
        r = run_level(a, host, port, model, prompts, probe_prompts, c)
        rows.append(r)
        probe_cols = " %17.1f | %17.1f | %19.2f | %19.2f | %7.2f |" % (
            r["probe_ttft_ms_p50"], r["probe_ttft_ms_p99"], r["itl_arrivals_ms_p50"], r["itl_arrivals_ms_p99"],
            r["itl_arrivals_ms_p99"] / r["itl_arrivals_ms_p50"] if r["itl_arrivals_samples"] and r["itl_arrivals_ms_p50"] > 0 else float("nan")) \
            if probe_prompts else \
            " %8.1f | %18.1f | %17.1f |" % (100 * r["cached_prompt_fraction"], r["ttft_ms_p50_first_turn"],
                                             r["ttft_ms_p50_later_turns"]) if shared else ""
        print("| %7d | %8d | %6d | %12.1f | %5.2f | %11.1f | %11.1f | %10.2f | %10.2f | %12.2f |%s"
              % (c, r["requests"], r["errors"], r["output_tokens_per_s"], r["requests_per_s"], r["ttft_ms_p50"],
                 r["ttft_ms_p99"], r["itl_ms_p50"], r["itl_ms_p99"], r["tpot_ms_mean"], probe_cols), flush=True)
        if r["first_error"]:
            print("  first error at %d clients: %s" % (c, r["first_error"]), file=sys.stderr)
    if a.json:
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v
        out = {"bench": "serve", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "commit": commit,
               "label": a.label, "workload": a.workload, "prefix_tokens": a.prefix_tokens if a.workload == "shared-prefix" else None,
               "turns": a.turns if a.workload == "multi-turn" else None,
               "turn_tokens": a.turn_tokens if a.workload == "multi-turn" else None, "url": a.url, "model": model, "max_model_len": ctx, "prompt_tokens": a.prompt_tokens,
               "prompts": a.prompts, "max_tokens": a.max_tokens, "probe_prompt_tokens": a.probe_prompt_tokens or None, "duration_s": None if a.requests else a.duration,
               "requests_per_row": a.requests or None, "rows": [{k: clean(v) for k, v in r.items()} for r in rows]}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print("\nwrote " + a.json)
    return 1 if any(r["requests"] == 0 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
