// The serving benchmark: N concurrent clients against a running `fp8moe serve` (or any OpenAI-compatible server),
// each sending streamed /v1/completions requests from a fixed set of token-id prompts, one after the other, for
// --duration seconds or --requests requests per client count. Reports aggregate output tokens/s, time to first
// token and inter-token latency (p50, p99), requests completed and errors, as a table and as JSON.
//
// Node 18+ only (fetch, streams): no npm packages. bench/serve_bench.sh starts the server and runs this.
//
//   node bench/serve_bench.mjs --url http://127.0.0.1:8080 --clients 1,8,64 --prompt-tokens 1800 --max-tokens 256 \
//        --duration 60 --json serve.json
//
// Workloads with shared prefixes (--workload, for the prefix cache: compare a server started with --no-prefix-cache)
// are in the help below; both report the share of prompt tokens the server took from its cache
// (usage.prompt_tokens_details.cached_tokens). bench/serve_bench.py is the same client in Python.
import { execSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';

const HELP = `usage: node bench/serve_bench.mjs --url URL [options]

  --url URL            the server (default http://127.0.0.1:8080)
  --clients LIST       concurrent clients, one run per count (default 1,8,64)
  --prompt-tokens N    tokens per prompt (default 512): token ids, so the length is exact and any vocabulary works
  --prompts K          distinct prompts in the fixed set (default 16); client c's request r sends prompt (c + r) % K
  --max-tokens M       new tokens per request (default 128); ignore_eos is sent, so each request makes M
  --duration S         seconds each client count runs (default 30): no request starts after it, the ones under way
                       finish and count
  --requests R         or: requests per client count in all (overrides --duration)
  --warmup W           requests sent before each client count, not counted (default 1)
  --vocab V            prompt ids are drawn from [16, V) (default 4096: the smallest vocabulary fp8moe ships)
  --api-key KEY        Authorization: Bearer KEY
  --json FILE          the figures as JSON
  --label TEXT         a note kept in the JSON (e.g. the GPU and the serve command)
  --probe-prompt-tokens N
                       also run a probe client in each row: prompts of N tokens, 1 new token each, one after another
                       while the clients decode; its time to first token is reported apart (e.g. a 1.8k-token prompt
                       while 8 streams decode: --clients 8 --prompt-tokens 128 --max-tokens 1024
                       --probe-prompt-tokens 1800)
  --workload W         random (default): the prompt set above;
                       arrivals: the clients are streams decoding while long prompts keep arriving (the probe, of
                       --probe-prompt-tokens ids, default 1800): the streams' inter-token gaps that overlap a
                       prompt's prefill are reported apart, p50, p99 and p99/p50 (docs/mixed-steps.md);
                       shared-prefix: every prompt is one system prompt of --prefix-tokens ids, then --prompt-tokens
                       ids of its own (N clients, one system prompt);
                       multi-turn: each client holds conversations of --turns turns: turn 1 is a prompt of
                       --prompt-tokens ids, turn t the previous turn's prompt, then --max-tokens ids standing for its
                       answer (fixed ids, not the generated ones: token-id prompts get text back), then --turn-tokens
                       new ids; time to first token is reported for first turns and later ones apart
  --prefix-tokens N    shared-prefix: the system prompt's ids (default 2048)
  --turns T            multi-turn: turns per conversation (default 4)
  --turn-tokens N      multi-turn: new user ids per turn after the first (default 128)`;

function parseArgs(argv) {
    const a = { url: 'http://127.0.0.1:8080', clients: [1, 8, 64], promptTokens: 512, prompts: 16, maxTokens: 128,
                duration: 30, requests: 0, warmup: 1, vocab: 4096, apiKey: '', json: '', label: '', probeTokens: 0,
                workload: 'random', prefixTokens: 2048, turns: 4, turnTokens: 128 };
    const int = (k, v, lo) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < lo) usage(`${k} expects an integer >= ${lo}, got '${v}'`);
        return n;
    };
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i], v = argv[i + 1];
        const take = () => { if (v === undefined) usage(`${k} needs a value`); i++; return v; };
        switch (k) {
        case '-h': case '--help': console.log(HELP); process.exit(0);
        case '--url': a.url = take().replace(/\/+$/, ''); break;
        case '--clients': a.clients = take().split(',').map((x) => int('--clients', x, 1)); break;
        case '--prompt-tokens': a.promptTokens = int(k, take(), 1); break;
        case '--prompts': a.prompts = int(k, take(), 1); break;
        case '--max-tokens': a.maxTokens = int(k, take(), 1); break;
        case '--duration': a.duration = Number(take()); if (!(a.duration > 0)) usage('--duration expects seconds > 0'); break;
        case '--requests': a.requests = int(k, take(), 1); break;
        case '--warmup': a.warmup = int(k, take(), 0); break;
        case '--vocab': a.vocab = int(k, take(), 17); break;
        case '--api-key': a.apiKey = take(); break;
        case '--json': a.json = take(); break;
        case '--label': a.label = take(); break;
        case '--probe-prompt-tokens': a.probeTokens = int(k, take(), 1); break;
        case '--workload':
            a.workload = take();
            if (!['random', 'shared-prefix', 'multi-turn', 'arrivals'].includes(a.workload))
                usage(`--workload expects random, shared-prefix, multi-turn or arrivals, got '${a.workload}'`);
            break;
        case '--prefix-tokens': a.prefixTokens = int(k, take(), 1); break;
        case '--turns': a.turns = int(k, take(), 1); break;
        case '--turn-tokens': a.turnTokens = int(k, take(), 1); break;
        default: usage(`unknown option '${k}'`);
        }
    }
    if (!['random', 'arrivals'].includes(a.workload) && a.probeTokens)
        usage('--probe-prompt-tokens goes with --workload random or arrivals only');
    if (a.workload === 'arrivals' && !a.probeTokens) a.probeTokens = 1800;
    return a;
}

function usage(msg) {
    console.error(`serve_bench: ${msg}\n\n${HELP}`);
    process.exit(2);
}

// The fixed prompt set: K prompts of N ids each from a seeded generator (the same on every run).
function makePrompts(k, n, vocab, seed = 0x9e3779b9) {
    let s = seed;
    const next = () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s; };
    return Array.from({ length: k }, () => Array.from({ length: n }, () => 16 + (next() % (vocab - 16))));
}

const headers = (a) => ({ 'Content-Type': 'application/json', ...(a.apiKey ? { Authorization: `Bearer ${a.apiKey}` } : {}) });

// One streamed request: the arrival time of each token's chunk, relative to the send.
async function oneRequest(a, model, prompt, maxTokens = a.maxTokens) {
    const t0 = performance.now();
    const body = { model, prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true,
                   stream_options: { include_usage: true } };
    const res = await fetch(`${a.url}/v1/completions`, { method: 'POST', headers: headers(a), body: JSON.stringify(body) });
    if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`);
    const times = [];
    let usage = null, done = false, buf = '';
    const dec = new TextDecoder();
    for await (const part of res.body) {
        buf += dec.decode(part, { stream: true });
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
            const event = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            for (const line of event.split('\n')) {
                if (!line.startsWith('data:')) continue;
                const data = line.slice(5).trim();
                if (data === '[DONE]') { done = true; continue; }
                const o = JSON.parse(data);
                if (o.error) throw new Error(`stream error: ${o.error.message}`);
                if (o.usage) usage = o.usage;
                const c = o.choices && o.choices[0];
                if (c && c.finish_reason === null) times.push(performance.now() - t0); // one chunk per token
            }
        }
    }
    if (!done) throw new Error('the stream ended without [DONE]');
    const n = usage ? usage.completion_tokens : times.length;
    const cached = (usage && usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    return { times, n, cached, total: performance.now() - t0 };
}

function pct(xs, p) {
    if (!xs.length) return NaN;
    const s = Float64Array.from(xs).sort();
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// multi-turn: request r of client c, as its prompt and turn index (from 0)
function conversationPrompt(a, prompts, c, r, clients) {
    const conv = Math.floor(r / a.turns), turn = r % a.turns, k = c + conv * clients;
    let p = prompts[k % prompts.length].slice();
    for (let t = 1; t <= turn; t++)
        p = p.concat(makePrompts(1, a.maxTokens + a.turnTokens, a.vocab, (0x51ed27 + 7919 * k + 104729 * t) >>> 0)[0]);
    return { prompt: p, turn };
}

async function runLevel(a, model, prompts, probePrompts, clients) {
    // warm-up prompts of their own (a prompt of the set would be cached); shared-prefix: the first request pays it
    for (let w = 0; w < (a.workload === 'shared-prefix' ? 0 : a.warmup); w++)
        await oneRequest(a, model, makePrompts(1, a.promptTokens, a.vocab, 0xc0ffee + w)[0]);
    const ttft = [], itl = [], tpot = [], ttftFirst = [], ttftLater = [];
    let tokens = 0, completed = 0, errors = 0, started = 0, firstError = '', promptTokens = 0, cachedTokens = 0;
    const t0 = performance.now();
    const deadline = t0 + a.duration * 1e3;
    const more = () => (a.requests ? started < a.requests : performance.now() < deadline);
    let tEnd = t0;
    async function client(c) {
        for (let r = 0; more(); r++) {
            started++;
            try {
                const { prompt, turn } = a.workload === 'multi-turn' ? conversationPrompt(a, prompts, c, r, clients)
                    : { prompt: prompts[(c + r) % prompts.length], turn: 0 };
                const sent = performance.now();
                const x = await oneRequest(a, model, prompt);
                for (let i = 1; i < x.times.length; i++) /* a gap between tokens that overlaps an arrival's prefill */
                    if (inFlight.some(([from, to]) => sent + x.times[i] > from && sent + x.times[i - 1] < to))
                        itlArrivals.push(x.times[i] - x.times[i - 1]);
                completed++, tokens += x.n, promptTokens += prompt.length, cachedTokens += x.cached;
                if (x.times.length) ttft.push(x.times[0]), (turn === 0 ? ttftFirst : ttftLater).push(x.times[0]);
                for (let i = 1; i < x.times.length; i++) itl.push(x.times[i] - x.times[i - 1]);
                if (x.times.length > 1) tpot.push((x.times.at(-1) - x.times[0]) / (x.times.length - 1));
            } catch (e) {
                errors++;
                if (!firstError) firstError = String(e.message || e);
            }
            tEnd = performance.now();
        }
    }
    // the probe: one long prompt at a time, 1 new token, while the clients decode: its time to first token under load
    const probeTtft = [], itlArrivals = [], inFlight = []; // [send, first token] of each probe request
    let stopProbe = false;
    async function probe() {
        await new Promise((r) => setTimeout(r, Math.min(2000, (a.duration * 1e3) / 4))); // the clients' decoding starts
        for (let r = 0; !stopProbe && performance.now() < deadline; r++) {
            try {
                const sent = performance.now();
                const x = await oneRequest(a, model, probePrompts[r % probePrompts.length], 1);
                if (x.times.length) probeTtft.push(x.times[0]), inFlight.push([sent, sent + x.times[0]]);
            } catch (e) {
                errors++;
                if (!firstError) firstError = `probe: ${e.message || e}`;
            }
            await new Promise((res) => setTimeout(res, 50));
        }
    }
    const probing = probePrompts.length ? probe() : Promise.resolve();
    await Promise.all(Array.from({ length: clients }, (_, c) => client(c)));
    stopProbe = true;
    await probing;
    const wall = (tEnd - t0) / 1e3;
    return {
        clients, requests: completed, errors, first_error: firstError || undefined, wall_s: wall,
        output_tokens: tokens, output_tokens_per_s: tokens / wall, requests_per_s: completed / wall,
        ttft_ms_p50: pct(ttft, 50), ttft_ms_p99: pct(ttft, 99),
        itl_ms_p50: pct(itl, 50), itl_ms_p99: pct(itl, 99),
        tpot_ms_mean: tpot.length ? tpot.reduce((x, y) => x + y, 0) / tpot.length : NaN,
        itl_arrivals_ms_p50: pct(itlArrivals, 50), itl_arrivals_ms_p99: pct(itlArrivals, 99),
        itl_arrivals_samples: itlArrivals.length, probe_requests: probeTtft.length, probe_ttft_ms_p50: pct(probeTtft, 50), probe_ttft_ms_p99: pct(probeTtft, 99),
        cached_prompt_fraction: promptTokens ? cachedTokens / promptTokens : NaN,
        ttft_ms_p50_first_turn: pct(ttftFirst, 50), ttft_ms_p50_later_turns: pct(ttftLater, 50),
    };
}

async function main() {
    const a = parseArgs(process.argv.slice(2));
    let models;
    try {
        const r = await fetch(`${a.url}/v1/models`, { headers: headers(a) });
        if (!r.ok) throw new Error(`HTTP ${r.status}`);
        models = await r.json();
    } catch (e) {
        console.error(`serve_bench: ${a.url}/v1/models: ${e.message} (is the server running?)`);
        process.exit(1);
    }
    const model = models.data[0].id, ctx = models.data[0].max_model_len;
    const longest = a.promptTokens + (a.workload === 'shared-prefix' ? a.prefixTokens : 0) +
        (a.workload === 'multi-turn' ? (a.turns - 1) * (a.maxTokens + a.turnTokens) : 0);
    if (ctx && longest + a.maxTokens > ctx)
        usage(`the longest prompt (${longest} ids) + --max-tokens ${a.maxTokens} exceed the server's context of ${ctx} (serve --ctx)`);
    let prompts = makePrompts(a.prompts, a.promptTokens, a.vocab);
    if (a.workload === 'shared-prefix') {
        const system = makePrompts(1, a.prefixTokens, a.vocab, 0x5157e4)[0];
        prompts = prompts.map((q) => system.concat(q));
    }
    const probePrompts = a.probeTokens ? makePrompts(a.prompts, a.probeTokens, a.vocab) : [];
    let commit = '';
    try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch { /* not a checkout */ }
    const shape = a.workload === 'shared-prefix' ? ` after a shared prefix of ${a.prefixTokens}`
        : a.workload === 'multi-turn' ? `, ${a.turns} turns of ${a.maxTokens + a.turnTokens} more` : '';
    console.log(`model ${model} at ${a.url}   workload ${a.workload}   prompts: ${a.prompts} of ${a.promptTokens} token ids${shape}   new tokens: ${a.maxTokens} per request (ignore_eos)   ` +
                (a.requests ? `${a.requests} requests per row` : `${a.duration} s per row`) + (commit ? `   commit ${commit}` : ''));
    console.log('');
    const shared = a.workload === 'shared-prefix' || a.workload === 'multi-turn';
    const probeHead = probePrompts.length ? [' probe TTFT p50 ms | probe TTFT p99 ms | ITL p50 arriving ms | ITL p99 arriving ms | p99/p50 |',
                                             '------------------:|------------------:|--------------------:|--------------------:|--------:|']
        : shared ? [' cached % | TTFT p50 turn 1 ms | TTFT p50 later ms |', '---------:|-------------------:|------------------:|'] : ['', ''];
    console.log('| clients | requests | errors | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT mean ms |' + probeHead[0]);
    console.log('|--------:|---------:|-------:|-------------:|------:|------------:|------------:|-----------:|-----------:|-------------:|' + probeHead[1]);
    const rows = [];
    const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
    for (const c of a.clients) {
        const r = await runLevel(a, model, prompts, probePrompts, c);
        rows.push(r);
        console.log(`| ${String(c).padStart(7)} | ${String(r.requests).padStart(8)} | ${String(r.errors).padStart(6)} | ` +
                    `${f(r.output_tokens_per_s).padStart(12)} | ${f(r.requests_per_s, 2).padStart(5)} | ${f(r.ttft_ms_p50).padStart(11)} | ` +
                    `${f(r.ttft_ms_p99).padStart(11)} | ${f(r.itl_ms_p50, 2).padStart(10)} | ${f(r.itl_ms_p99, 2).padStart(10)} | ` +
                    `${f(r.tpot_ms_mean, 2).padStart(12)} |` +
                    (probePrompts.length ? ` ${f(r.probe_ttft_ms_p50).padStart(17)} | ${f(r.probe_ttft_ms_p99).padStart(17)} | ` +
                        `${f(r.itl_arrivals_ms_p50, 2).padStart(19)} | ${f(r.itl_arrivals_ms_p99, 2).padStart(19)} | ` +
                        `${f(r.itl_arrivals_ms_p99 / r.itl_arrivals_ms_p50, 2).padStart(7)} |` : '') +
                    (shared ? ` ${f(100 * r.cached_prompt_fraction).padStart(8)} | ${f(r.ttft_ms_p50_first_turn).padStart(18)} | ` +
                              `${f(r.ttft_ms_p50_later_turns).padStart(17)} |` : ''));
        if (r.first_error) console.error(`  first error at ${c} clients: ${r.first_error}`);
    }
    if (a.json) {
        const out = { bench: 'serve', date: new Date().toISOString(), commit, label: a.label, workload: a.workload,
                      prefix_tokens: a.workload === 'shared-prefix' ? a.prefixTokens : null,
                      turns: a.workload === 'multi-turn' ? a.turns : null,
                      turn_tokens: a.workload === 'multi-turn' ? a.turnTokens : null, url: a.url, model,
                      max_model_len: ctx, prompt_tokens: a.promptTokens, prompts: a.prompts, max_tokens: a.maxTokens,
                      probe_prompt_tokens: a.probeTokens || null,
                      duration_s: a.requests ? null : a.duration, requests_per_row: a.requests || null, rows };
        writeFileSync(a.json, JSON.stringify(out, (k, v) => (typeof v === 'number' && !Number.isFinite(v) ? null : v), 2) + '\n');
        console.log(`\nwrote ${a.json}`);
    }
    process.exit(rows.some((r) => r.requests === 0) ? 1 : 0);
}

main();
