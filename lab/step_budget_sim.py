#!/usr/bin/env python3
"""A step-level simulation of the scheduler's mixed steps under step-budget rules, to choose a rule before spending
GPU time on it (bench/NOTES.md, thirty-fourth session). Not the engine: a model of it, fitted to one H100 run.

Cost model (H100, Qwen3-30B-A3B fp8 + w8a8, docs/RESULTS.md 2.24, `lab/device_runs/s37_d.sh` and `s37_e.sh`):
  decode-only step   decode_ms(B) = 5.9 + 0.105 B      (8 rows 6.5 ms, ~55 rows 11.7 ms: CUDA graphs)
  mixed step         decode_ms(B) + C0 + C1 P          (C0 ~3.6 ms: no graph, the chunk's launches; C1 0.0148 ms a
                                                        prompt token: 64 tokens 11.2 ms and 449 tokens 17.0 ms at 8
                                                        rows, 520 tokens 22.9 ms at ~55 rows)
Workloads (closed loops, as bench/serve_bench.py drives them):
  arrivals  8 streams (128-token prompt, 1,024 new tokens, then again) and one probe (1,800-token prompt, 1 token,
            then again 50 ms after its token, as bench/serve_bench.py's probe sleeps)
  load      64 clients (1,800-token prompt, 256 new tokens, then again)
Rules: fixed (the budget, 512 here), latency R (the share (R - 1) decode_ms(B) / token cost, at least 64, the token
cost estimated as the engine does: the mean extra time per prompt token of recent mixed steps), and the same with
the prompts' turn (the whole budget while more prompts wait than streams decode) and with a demand rule (the share at
least the waiting prompt tokens over the steps the oldest waiting prompt has left before it waits longer than
`--wait-steps`; the engine's prompt wait since, `--max-prompt-wait-steps`, with the latency budget's default R = 1.5,
W = 40). Prints, per workload and rule: output tok/s, inter-token p50 / p99 and their ratio, time to first token p50 /
p99 (the probe's alone for arrivals). Against the H100 rows of the rule (docs/RESULTS.md 2.26): rates and TTFTs
close, the p99s low by ~2 ms (the model has no step jitter: it gave the arrivals spread 1.00x where 1.97x was measured).

  python3 lab/step_budget_sim.py [--seconds 20] [--wait-steps 40]
"""
import argparse
import statistics

BUDGET, FLOOR, CHUNK = 512, 64, 512


def decode_ms(b):
    return 5.9 + 0.105 * b


C0, C1 = 3.6, 0.0148


class Req:
    def __init__(self, t, prompt, new, kind):
        self.t0, self.prompt, self.new, self.kind = t, prompt, new, kind
        self.pos, self.gen, self.last, self.first = 0, 0, None, None
        self.waited = 0  # steps spent waiting for its prompt


def simulate(workload, rule, ratio, seconds, wait_steps):
    t, reqs, done, itl, ttft = 0.0, [], [], [], []
    token_ms, dec_seen = -1.0, {}
    if workload == "arrivals":
        reqs += [Req(0.0, 128, 1024, "stream") for _ in range(8)] + [Req(2000.0, 1800, 1, "probe")]
    else:
        reqs += [Req(0.0, 1800, 256, "load") for _ in range(64)]
    out_tokens = 0
    while t < seconds * 1000.0:
        running = [r for r in reqs if r.pos == r.prompt]
        waiting = [r for r in reqs if r.pos < r.prompt and r.t0 <= t]
        n_dec = len(running)
        room = BUDGET - n_dec
        share = room
        if rule != "fixed" and n_dec > 0 and token_ms > 0.0:
            share = max(FLOOR, min(room, int((ratio - 1.0) * decode_ms(n_dec) / token_ms)))
            if rule in ("turn", "demand") and len(waiting) > n_dec:
                share = room
            if rule == "demand" and waiting:
                oldest = max(waiting, key=lambda r: r.waited)
                left = max(1, wait_steps - oldest.waited)
                need = sum(r.prompt - r.pos for r in waiting)
                share = max(share, min(room, -(-need // left)))
        # the prompts' rows, in arrival order, a chunk each at most
        p = 0
        for r in sorted(waiting, key=lambda r: r.t0):
            if p >= share:
                break
            take = min(CHUNK, r.prompt - r.pos, share - p)
            r.pos += take
            p += take
        ms = decode_ms(n_dec) + (C0 + C1 * p if p else 0.0)
        t += ms
        if p and n_dec:  # the engine's estimate: the mean extra per token of recent mixed steps
            sample = (ms - decode_ms(n_dec)) / p
            token_ms = sample if token_ms < 0 else token_ms + 0.25 * (sample - token_ms)
        for r in waiting:
            r.waited += 1
        for r in running:
            r.gen += 1
            out_tokens += 1
            if r.last is not None and r.kind != "probe":
                itl.append(t - r.last)
            r.last = t
        for r in list(reqs):  # prompts just completed emit their first token in this step
            if r.pos == r.prompt and r.first is None and r.t0 <= t:
                r.first = t
                ttft.append((r.kind, t - r.t0))
                r.last, r.gen = t, 1
                out_tokens += 1
            if r.first is not None and r.gen >= r.new:
                reqs.remove(r)
                done.append(r)
                reqs.append(Req(t + (50.0 if r.kind == "probe" else 0.0), r.prompt, r.new, r.kind))
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] if xs else float("nan")
    probe = [v for k, v in ttft if k == "probe"] or [v for _, v in ttft]
    return out_tokens / (t / 1000.0), q(itl, 0.5), q(itl, 0.99), q(probe, 0.5), q(probe, 0.99)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--wait-steps", type=int, default=40)
    a = ap.parse_args()
    rules = [("fixed", 0.0), ("latency", 2.0), ("latency", 1.5), ("turn", 1.5), ("turn", 2.0), ("demand", 1.5),
             ("demand", 2.0)]
    print("| workload | rule | R | output tok/s | ITL p50 / p99 ms | p99 / p50 | TTFT p50 / p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for w in ("arrivals", "load"):
        for rule, r in rules:
            tps, p50, p99, t50, t99 = simulate(w, rule, r, a.seconds, a.wait_steps)
            print(f"| {w} | {rule} | {r or '-'} | {tps:.0f} | {p50:.2f} / {p99:.2f} | {p99 / p50:.2f}x | "
                  f"{t50:.0f} / {t99:.0f} |")


if __name__ == "__main__":
    main()
