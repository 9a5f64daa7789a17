// The serving benchmark: N concurrent clients against a running `fp8moe serve` (or any OpenAI-compatible server),
// each sending streamed /v1/completions requests with token-id prompts, one after the other, for --duration seconds or
// --requests requests per client count. Reports aggregate output tokens/s, time to first token and inter-token
// latency (p50, p99), requests completed, the error rate and the share of prompt tokens the server's prefix cache
// served, as a table and as JSON.
//
// Node 18+ only (fetch, streams): no npm packages. bench/serve_bench.sh starts the server and runs this.
//
//   node bench/serve_bench.mjs --url http://127.0.0.1:8080 --clients 1,8,64 --prompt-tokens 1800 --max-tokens 256 \
//        --duration 60 --json serve.json
//
// Workloads with shared prefixes (--workload, for the prefix cache: compare a server started with --no-prefix-cache)
// are in the help below. Every row reports the share of prompt tokens the server took from its cache
// (usage.prompt_tokens_details.cached_tokens). bench/serve_bench.py is the same client in Python.
import { execSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';

const HELP = `usage: node bench/serve_bench.mjs --url URL [options]

  --url URL            the server (default http://127.0.0.1:8080)
  --clients LIST       concurrent clients, one run per count (default 1,8,64)
  --prompt-tokens N    tokens per prompt (default 512): token ids, so the length is exact and any vocabulary works.
                       Every prompt meant to be new is new: seeded by --seed, the row, the client and the request, so
                       no request finds another's prompt in the server's prefix cache
  --prompts K          or: a fixed pool of K prompts, cycled (client c's request r sends prompt (c + r) % K), which
                       the cache serves after their first use (default 0: no pool)
  --seed S             the prompts' seed, 0..4294967295 (default: random, printed in the header): the same seed and
                       options give the same ids (against the same server, a repeated run then finds them cached)
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
  --workload W         random (default): new prompts as above;
                       arrivals: the clients are streams decoding while long prompts keep arriving (the probe, of
                       --probe-prompt-tokens ids, default 1800): the streams' inter-token gaps that overlap a
                       prompt's prefill are reported apart, p50, p99 and p99/p50 (docs/mixed-steps.md);
                       shared-prefix: every prompt is one system prompt of --prefix-tokens ids (one per row), then
                       --prompt-tokens new ids of its own (N clients, one system prompt);
                       multi-turn: each client holds conversations of --turns turns: turn 1 is a new prompt of
                       --prompt-tokens ids, turn t the previous turn's prompt, then --max-tokens ids standing for its
                       answer (fixed ids, not the generated ones: token-id prompts get text back), then --turn-tokens
                       new ids; time to first token is reported for first turns and later ones apart
  --prefix-tokens N    shared-prefix: the system prompt's ids (default 2048)
  --turns T            multi-turn: turns per conversation (default 4)
  --turn-tokens N      multi-turn: new user ids per turn after the first (default 128)

Errors are counted, never hidden: each row shows the share of requests that failed (error %), the first error's text
is printed, a client waits after an error (50 ms, doubling to 1 s while they continue) instead of retrying at once,
and the run exits 1 when a row's error rate is above 1% (or a row completed nothing), with a FAILED line per row.

After the table, a line per row gives the server's steps during it, from its /metrics before and after (fp8moe only):
decode-only and mixed steps (decode and prompt rows together) with their mean wall time, the mean prompt share of a
mixed step, and the step budget (--step-budget fixed|latency, docs/mixed-steps.md).`;

function parseArgs(argv) {
    const a = { url: 'http://127.0.0.1:8080', clients: [1, 8, 64], promptTokens: 512, prompts: 0, maxTokens: 128, seed: null,
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
        case '--prompts': a.prompts = int(k, take(), 0); break;
        case '--seed': a.seed = int(k, take(), 0); if (a.seed > 0xffffffff) usage('--seed expects an integer in [0, 4294967295]'); break;
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
    if (a.seed === null) a.seed = randomBytes(4).readUInt32LE(0);
    return a;
}

function usage(msg) {
    console.error(`serve_bench: ${msg}\n\n${HELP}`);
    process.exit(2);
}

const MAX_ERROR_RATE = 0.01; // above it, a row's figures describe failures, not serving: the run fails
// what a generator seed is for (mixed into it, so that no two kinds of prompt share ids)
const PROMPT = 1, PROBE = 2, SYSTEM = 3, TURN = 4, WARMUP = 5, POOL = 6, PROBE_POOL = 7;

// One 32-bit seed from several numbers (murmur3's finalizer after each): the same in serve_bench.py.
function mix32(...xs) {
    let h = 0x811c9dc5;
    for (const x of xs) {
        h = (h ^ x) >>> 0;
        h = (h ^ (h >>> 16)) >>> 0;
        h = Math.imul(h, 0x85ebca6b) >>> 0;
        h = (h ^ (h >>> 13)) >>> 0;
        h = Math.imul(h, 0xc2b2ae35) >>> 0;
        h = (h ^ (h >>> 16)) >>> 0;
    }
    return h;
}

// n prompt ids in [16, vocab) from a linear congruential generator: the same ids as serve_bench.py.
function makeIds(n, vocab, seed) {
    let s = seed >>> 0;
    const next = () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s; };
    return Array.from({ length: n }, () => 16 + (next() % (vocab - 16)));
}

// Every prompt of a run: seeded by (--seed, what it is for, row, client, request), or drawn from the pool.
function makePrompts(a) {
    const pool = Array.from({ length: a.prompts }, (_, i) => makeIds(a.promptTokens, a.vocab, mix32(a.seed, POOL, i)));
    const probePool = Array.from({ length: a.probeTokens ? a.prompts : 0 },
                                 (_, i) => makeIds(a.probeTokens, a.vocab, mix32(a.seed, PROBE_POOL, i)));
    // a prompt meant to be new: client c's r-th, or the pool's prompt poolIndex with --prompts
    const fresh = (row, c, r, poolIndex) => (pool.length ? pool[poolIndex % pool.length]
        : makeIds(a.promptTokens, a.vocab, mix32(a.seed, PROMPT, row, c, r)));
    return {
        // shared-prefix: the row's system prompt (a row of its own: the previous row's is not in the cache for it)
        system: (row) => makeIds(a.prefixTokens, a.vocab, mix32(a.seed, SYSTEM, row)),
        // client c's request r in the row: its prompt and turn index (from 0)
        request(row, c, r, clients, system) {
            if (a.workload !== 'multi-turn') return { prompt: system.concat(fresh(row, c, r, c + r)), turn: 0 };
            const conv = Math.floor(r / a.turns), turn = r % a.turns;
            let p = fresh(row, c, conv, c + conv * clients);
            for (let t = 1; t <= turn; t++) // the earlier turns' answers and questions, the same ids each time
                p = p.concat(makeIds(a.maxTokens + a.turnTokens, a.vocab, mix32(a.seed, TURN, row, c, conv, t)));
            return { prompt: p, turn };
        },
        probe: (row, r) => (probePool.length ? probePool[r % probePool.length]
            : makeIds(a.probeTokens, a.vocab, mix32(a.seed, PROBE, row, r))),
        warmup: (row, w) => makeIds(a.promptTokens, a.vocab, mix32(a.seed, WARMUP, row, w)),
    };
}

const headers = (a) => ({ 'Content-Type': 'application/json', ...(a.apiKey ? { Authorization: `Bearer ${a.apiKey}` } : {}) });

// One streamed request: the arrival time of each token's chunk, relative to the send; cached: null when not reported.
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
    const details = usage && usage.prompt_tokens_details;
    const cached = details && typeof details.cached_tokens === 'number' ? details.cached_tokens : null;
    return { times, n, cached, total: performance.now() - t0 };
}

// the server's /metrics as a Map name -> value (labelled series left out); empty when it cannot be read
async function serverMetrics(a) {
    const out = new Map();
    try {
        const r = await fetch(`${a.url}/metrics`, { headers: headers(a) });
        if (!r.ok) return out;
        for (const line of (await r.text()).split('\n')) {
            const parts = line.trim().split(/\s+/);
            if (parts.length === 2 && !line.startsWith('#') && !parts[0].includes('{') && Number.isFinite(Number(parts[1])))
                out.set(parts[0], Number(parts[1]));
        }
    } catch { /* no metrics: the row says so */ }
    return out;
}

// the server's steps during a row, from its /metrics before and after (null where it does not report them)
function stepFigures(before, after) {
    if (!before.has('fp8moe_mixed_step_seconds_count') || !after.has('fp8moe_mixed_step_seconds_count')) return null;
    const d = (k) => (after.get(k) || 0) - (before.get(k) || 0);
    const meanMs = (kind) => (d(`fp8moe_${kind}_step_seconds_count`) > 0
        ? (1e3 * d(`fp8moe_${kind}_step_seconds_sum`)) / d(`fp8moe_${kind}_step_seconds_count`) : NaN);
    const mixed = d('fp8moe_mixed_steps_total');
    return {
        step_budget: after.get('fp8moe_step_budget_latency') === 1 ? 'latency' : 'fixed',
        decode_steps: d('fp8moe_decode_step_seconds_count'), decode_step_ms_mean: meanMs('decode'),
        mixed_steps: mixed, mixed_step_ms_mean: meanMs('mixed'),
        mixed_step_prefill_tokens_mean: mixed ? d('fp8moe_mixed_step_prefill_tokens_total') / mixed : NaN,
        prefill_steps: d('fp8moe_prefill_step_seconds_count'), prefill_step_ms_mean: meanMs('prefill'),
    };
}

function pct(xs, p) {
    if (!xs.length) return NaN;
    const s = Float64Array.from(xs).sort();
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// the wait after an error: 50 ms, doubling while errors continue, at most 1 s
const backoffMs = (errorsInARow) => Math.min(1000, 50 * 2 ** Math.min(errorsInARow - 1, 5));
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

async function runLevel(a, model, prompts, row, clients) {
    // warm-up prompts of their own (new ones: a warm-up must not fill the cache for the row);
    // shared-prefix: none, the first request pays for the system prompt
    for (let w = 0; w < (a.workload === 'shared-prefix' ? 0 : a.warmup); w++) {
        try {
            await oneRequest(a, model, prompts.warmup(row, w));
        } catch (e) { // the server does not serve: no row to measure
            console.error(`serve_bench: the warm-up request at ${clients} clients failed: ${e.message || e}${e.cause ? ` (${e.cause.message || e.cause})` : ''}`);
            process.exit(1);
        }
    }
    const system = a.workload === 'shared-prefix' ? prompts.system(row) : [];
    const ttft = [], itl = [], tpot = [], ttftFirst = [], ttftLater = [];
    let tokens = 0, completed = 0, errors = 0, started = 0, firstError = '';
    let promptTokens = 0, cachedTokens = 0, cachedUnknown = 0;
    const apart = { probe: [0, 0], firstTurn: [0, 0] }; // [prompt tokens, cached tokens] of the probe, of first turns
    const metricsBefore = await serverMetrics(a);
    const t0 = performance.now();
    const deadline = t0 + a.duration * 1e3;
    const more = () => (a.requests ? started < a.requests : performance.now() < deadline);
    let tEnd = t0;
    const countPrompt = (prompt, cached, what) => {
        promptTokens += prompt.length;
        if (cached === null) { cachedUnknown++; return; }
        cachedTokens += cached;
        if (what) apart[what][0] += prompt.length, apart[what][1] += cached;
    };
    const fraction = ([prompt, cached]) => (prompt && !cachedUnknown ? cached / prompt : NaN);
    // counted, the first one printed, and a pause before the next request (never past the row's end)
    const failed = async (e, who, errorsInARow) => {
        errors++;
        if (!firstError) {
            firstError = `${who}${e.message || e}${e.cause ? ` (${e.cause.message || e.cause})` : ''}`; // fetch's reason is its cause
            console.error(`  first error at ${clients} clients: ${firstError}`);
        }
        const wait = backoffMs(errorsInARow);
        await sleep(a.requests ? wait : Math.max(0, Math.min(wait, deadline - performance.now())));
    };
    async function client(c) {
        for (let r = 0, errorsInARow = 0; more(); r++) {
            started++;
            try {
                const { prompt, turn } = prompts.request(row, c, r, clients, system);
                const sent = performance.now();
                const x = await oneRequest(a, model, prompt);
                errorsInARow = 0;
                for (let i = 1; i < x.times.length; i++) /* a gap between tokens that overlaps an arrival's prefill */
                    if (inFlight.some(([from, to]) => sent + x.times[i] > from && sent + x.times[i - 1] < to))
                        itlArrivals.push(x.times[i] - x.times[i - 1]);
                completed++, tokens += x.n;
                countPrompt(prompt, x.cached, turn === 0 ? 'firstTurn' : '');
                if (x.times.length) ttft.push(x.times[0]), (turn === 0 ? ttftFirst : ttftLater).push(x.times[0]);
                for (let i = 1; i < x.times.length; i++) itl.push(x.times[i] - x.times[i - 1]);
                if (x.times.length > 1) tpot.push((x.times.at(-1) - x.times[0]) / (x.times.length - 1));
            } catch (e) {
                await failed(e, '', ++errorsInARow);
            }
            tEnd = performance.now();
        }
    }
    // the probe: one long prompt at a time, 1 new token, while the clients decode: its time to first token under load
    const probeTtft = [], itlArrivals = [], inFlight = []; // [send, first token] of each probe request
    let stopProbe = false;
    async function probe() {
        await sleep(Math.min(2000, (a.duration * 1e3) / 4)); // the clients' decoding starts
        for (let r = 0, errorsInARow = 0; !stopProbe && performance.now() < deadline; r++) {
            try {
                const prompt = prompts.probe(row, r);
                const sent = performance.now();
                const x = await oneRequest(a, model, prompt, 1);
                errorsInARow = 0;
                countPrompt(prompt, x.cached, 'probe');
                if (x.times.length) probeTtft.push(x.times[0]), inFlight.push([sent, sent + x.times[0]]);
            } catch (e) {
                await failed(e, 'probe: ', ++errorsInARow);
            }
            await sleep(50);
        }
    }
    const probing = a.probeTokens ? probe() : Promise.resolve();
    await Promise.all(Array.from({ length: clients }, (_, c) => client(c)));
    stopProbe = true;
    await probing;
    const wall = (tEnd - t0) / 1e3;
    const steps = stepFigures(metricsBefore, await serverMetrics(a));
    const attempts = completed + probeTtft.length + errors;
    return {
        clients, requests: completed, errors, error_rate: attempts ? errors / attempts : NaN,
        first_error: firstError || undefined, wall_s: wall,
        output_tokens: tokens, output_tokens_per_s: tokens / wall, requests_per_s: completed / wall,
        ttft_ms_p50: pct(ttft, 50), ttft_ms_p99: pct(ttft, 99),
        itl_ms_p50: pct(itl, 50), itl_ms_p99: pct(itl, 99),
        tpot_ms_mean: tpot.length ? tpot.reduce((x, y) => x + y, 0) / tpot.length : NaN,
        itl_arrivals_ms_p50: pct(itlArrivals, 50), itl_arrivals_ms_p99: pct(itlArrivals, 99),
        itl_arrivals_samples: itlArrivals.length, probe_requests: probeTtft.length, probe_ttft_ms_p50: pct(probeTtft, 50), probe_ttft_ms_p99: pct(probeTtft, 99),
        cached_prompt_fraction: fraction([promptTokens, cachedTokens]), probe_cached_prompt_fraction: fraction(apart.probe),
        first_turn_cached_prompt_fraction: fraction(apart.firstTurn),
        ttft_ms_p50_first_turn: pct(ttftFirst, 50), ttft_ms_p50_later_turns: pct(ttftLater, 50),
        steps,
    };
}

// why a row's figures are not a measurement, or null
function rowFailure(r) {
    if (r.requests === 0) return 'no request completed';
    if (r.error_rate > MAX_ERROR_RATE)
        return `${(100 * r.error_rate).toFixed(1)}% of requests failed (${r.errors} of ${r.requests + r.probe_requests + r.errors})`;
    return null;
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
    const prompts = makePrompts(a);
    let commit = '';
    try { commit = execSync('git rev-parse --short HEAD', { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim(); } catch { /* not a checkout */ }
    const shape = a.workload === 'shared-prefix' ? ` after a shared prefix of ${a.prefixTokens}`
        : a.workload === 'multi-turn' ? `, ${a.turns} turns of ${a.maxTokens + a.turnTokens} more` : '';
    console.log(`model ${model} at ${a.url}   workload ${a.workload}   prompts: ${a.prompts ? `a pool of ${a.prompts}` : 'each new'} of ${a.promptTokens} token ids${shape} (seed ${a.seed})   new tokens: ${a.maxTokens} per request (ignore_eos)   ` +
                (a.requests ? `${a.requests} requests per row` : `${a.duration} s per row`) + (commit ? `   commit ${commit}` : ''));
    console.log('');
    const multiTurn = a.workload === 'multi-turn';
    const probeHead = a.probeTokens ? [' probe TTFT p50 ms | probe TTFT p99 ms | ITL p50 arriving ms | ITL p99 arriving ms | p99/p50 |',
                                       '------------------:|------------------:|--------------------:|--------------------:|--------:|'] : ['', ''];
    const turnHead = multiTurn ? [' cached % turn 1 | TTFT p50 turn 1 ms | TTFT p50 later ms |',
                                  '----------------:|-------------------:|------------------:|'] : ['', ''];
    console.log('| clients | requests | errors | error % | cached % | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT mean ms |' + probeHead[0] + turnHead[0]);
    console.log('|--------:|---------:|-------:|--------:|---------:|-------------:|------:|------------:|------------:|-----------:|-----------:|-------------:|' + probeHead[1] + turnHead[1]);
    const rows = [];
    const f = (x, width, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-').padStart(width);
    for (const [row, c] of a.clients.entries()) {
        const r = await runLevel(a, model, prompts, row, c);
        rows.push(r);
        const cols = [f(c, 7, 0), f(r.requests, 8, 0), f(r.errors, 6, 0), f(100 * r.error_rate, 7, 2),
                      f(100 * r.cached_prompt_fraction, 8), f(r.output_tokens_per_s, 12), f(r.requests_per_s, 5, 2),
                      f(r.ttft_ms_p50, 11), f(r.ttft_ms_p99, 11), f(r.itl_ms_p50, 10, 2), f(r.itl_ms_p99, 10, 2),
                      f(r.tpot_ms_mean, 12, 2)];
        if (a.probeTokens)
            cols.push(f(r.probe_ttft_ms_p50, 17), f(r.probe_ttft_ms_p99, 17), f(r.itl_arrivals_ms_p50, 19, 2),
                      f(r.itl_arrivals_ms_p99, 19, 2),
                      f(r.itl_arrivals_samples && r.itl_arrivals_ms_p50 > 0 ? r.itl_arrivals_ms_p99 / r.itl_arrivals_ms_p50 : NaN, 7, 2));
        if (multiTurn)
            cols.push(f(100 * r.first_turn_cached_prompt_fraction, 15), f(r.ttft_ms_p50_first_turn, 18), f(r.ttft_ms_p50_later_turns, 17));
        console.log(`| ${cols.join(' | ')} |`);
    }
    // the server's steps in each row (its /metrics): the step budget's choices, after the table (a blank line ends it)
    console.log('');
    for (const [i, c] of a.clients.entries()) {
        const t = rows[i].steps;
        if (!t) console.log(`steps at ${c} clients: the server's /metrics has no step figures (a build before the step budget)`);
        else
            console.log(`steps at ${c} clients (--step-budget ${t.step_budget}): decode-only ${t.decode_steps}, mean ${f(t.decode_step_ms_mean, 0, 2)} ms; ` +
                        `mixed ${t.mixed_steps}, mean ${f(t.mixed_step_ms_mean, 0, 2)} ms, ${f(t.mixed_step_prefill_tokens_mean, 0)} prompt tokens each; ` +
                        `prompt-only ${t.prefill_steps}, mean ${f(t.prefill_step_ms_mean, 0, 2)} ms`);
    }
    const failures = a.clients.map((c, i) => [c, rowFailure(rows[i]), rows[i].first_error]).filter(([, why]) => why);
    if (failures.length) console.log(''); // on stdout: what keeps those figures from being results
    for (const [c, why, first] of failures)
        console.log(`FAILED at ${c} clients: ${why}${first ? `; first error: ${first}` : ''}`);
    if (a.json) {
        const out = { bench: 'serve', date: new Date().toISOString(), commit, label: a.label, workload: a.workload,
                      prefix_tokens: a.workload === 'shared-prefix' ? a.prefixTokens : null,
                      turns: multiTurn ? a.turns : null, turn_tokens: multiTurn ? a.turnTokens : null, url: a.url, model,
                      max_model_len: ctx, prompt_tokens: a.promptTokens, prompts: a.prompts || null, seed: a.seed,
                      max_tokens: a.maxTokens, probe_prompt_tokens: a.probeTokens || null,
                      duration_s: a.requests ? null : a.duration, requests_per_row: a.requests || null,
                      max_error_rate: MAX_ERROR_RATE, rows: rows.map((r) => ({ ...r, failed: rowFailure(r) })) };
        writeFileSync(a.json, JSON.stringify(out, (k, v) => (typeof v === 'number' && !Number.isFinite(v) ? null : v), 2) + '\n');
        console.log(`\nwrote ${a.json}`);
    }
    process.exit(failures.length ? 1 : 0);
}

main();
