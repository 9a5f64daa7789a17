// fp8moe serve against the official `openai` npm client (and raw fetch for what a client library hides).
// usage: node client.mjs BASE_URL API_KEY BUSY_URL
//   BASE_URL  the server under test (models/tiny-code-moe, --api-key API_KEY, --chat-template tests/chat_templates/chatml/chat_template.jinja)
//   BUSY_URL  a second server started with --max-seqs 1 --max-queue 0 (no key), for the 429 check
// Every check prints one line; the first failure ends the run with exit code 1.
import assert from "node:assert/strict";
import net from "node:net";
import OpenAI from "openai";

const [base, key, busyBase] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
let checks = 0;
function ok(what) { checks++; console.log("  ok  " + what); }

async function raw(path, { method = "POST", body, auth = key, headers = {} } = {}) {
  const h = { ...headers };
  if (auth) h["Authorization"] = "Bearer " + auth;
  if (body !== undefined && !h["Content-Type"]) h["Content-Type"] = "application/json";
  const r = await fetch(base + path, { method, headers: h, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, type: r.headers.get("content-type") };
}

async function metrics(url = base) {
  const headers = url === base ? { Authorization: "Bearer " + key } : {}; // /metrics is behind the key
  const text = await (await fetch(url + "/metrics", { headers })).text();
  const get = (name) => {
    const m = text.match(new RegExp("^" + name + " (\\S+)$", "m"));
    assert.ok(m, "metric " + name + " missing");
    return Number(m[1]);
  };
  return { text, get };
}

/* waits until no request runs and no KV block is in use (cancellation happens at the scheduler's next step) */
async function expectIdle(what, url = base) {
  for (let i = 0; i < 200; i++) {
    const m = await metrics(url);
    if (m.get("fp8moe_kv_blocks_used") === 0 && m.get("fp8moe_requests_running") === 0 && m.get("fp8moe_queue_depth") === 0) {
      ok(what + ": no KV blocks in use, nothing running");
      return m;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(what + ": KV blocks still in use: " + (await metrics(url)).text.match(/^fp8moe_kv_blocks_used .*$/m));
}

function expectError(r, status, param, what) {
  assert.equal(r.status, status, what + ": status " + r.status + " " + r.text);
  assert.ok(r.json && r.json.error, what + ": no error object: " + r.text);
  const e = r.json.error;
  for (const k of ["message", "type", "param", "code"]) assert.ok(k in e, what + ": error." + k + " missing");
  assert.equal(typeof e.message, "string");
  assert.ok(e.message.length > 10, what + ": message too short");
  if (param !== undefined) assert.equal(e.param, param, what + ": param");
  ok(what + " -> " + status + " (" + e.message.slice(0, 70) + ")");
}

const ids = (seed, n) => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104729) % 500 + 1);

// ---- models, health
const models = await client.models.list();
const model = models.data[0].id;
assert.equal(model, "tiny-code-moe");
ok("models.list: " + model);
assert.equal((await raw("/health", { method: "GET", auth: null })).status, 200);
ok("GET /health");

// ---- completions with token-id prompts: non-stream, stream, determinism, usage, logprobs
const greedy = { model, temperature: 0, ignore_eos: true };
const c1 = await client.completions.create({ ...greedy, prompt: ids(1, 12), max_tokens: 10, logprobs: 3 });
assert.equal(c1.object, "text_completion");
assert.equal(c1.choices.length, 1);
assert.equal(c1.choices[0].finish_reason, "length");
assert.deepEqual(c1.usage, { ...c1.usage, prompt_tokens: 12, completion_tokens: 10, total_tokens: 22 });
const lp = c1.choices[0].logprobs;
assert.equal(lp.tokens.length, 10);
assert.equal(lp.token_logprobs.length, 10);
assert.equal(lp.top_logprobs.length, 10);
for (let i = 0; i < 10; i++) {
  const top = Object.entries(lp.top_logprobs[i]);
  assert.ok(top.length >= 1 && top.length <= 3);
  assert.ok(lp.token_logprobs[i] <= 0);
  // greedy: the chosen token is the most likely one
  assert.ok(Math.abs(Math.max(...top.map(([, v]) => v)) - lp.token_logprobs[i]) < 1e-5, "greedy token is the top one");
}
assert.equal(lp.text_offset.length, 10);
for (let i = 1; i < 10; i++) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
ok("completions (ids prompt): 10 tokens, usage, logprobs with top 3, text offsets");
const c2 = await client.completions.create({ ...greedy, prompt: ids(1, 12), max_tokens: 10, logprobs: 3 });
assert.deepEqual(c2.choices[0].logprobs.tokens, lp.tokens);
ok("completions: greedy is deterministic");

async function streamCompletion(params) {
  const s = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    if (ch.usage) { usage = ch.usage; assert.equal(ch.choices.length, 0); continue; }
    assert.equal(ch.object, "text_completion");
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, finish, usage, chunks };
}
const s1 = await streamCompletion({ ...greedy, prompt: ids(1, 12), max_tokens: 10 });
assert.equal(s1.text, c1.choices[0].text);
assert.equal(s1.finish, "length");
assert.equal(s1.usage.completion_tokens, 10);
assert.equal(s1.usage.prompt_tokens, 12);
ok("completions stream: " + s1.chunks + " chunks, same text as non-stream, usage in the last chunk");

// ---- text completions (the tokenizer)
const codePrompt = "def fibonacci(n):\n    ";
const t1 = await client.completions.create({ ...greedy, prompt: codePrompt, max_tokens: 40 });
const text = t1.choices[0].text;
assert.ok(text.length > 10, "a completion of some length: " + JSON.stringify(text));
assert.ok(t1.usage.prompt_tokens > 3);
ok("completions (text prompt): " + JSON.stringify(text.slice(0, 50)));
const ts = await streamCompletion({ ...greedy, prompt: codePrompt, max_tokens: 40 });
assert.equal(ts.text, text);
ok("completions stream (text prompt): same text");

// stop strings: a piece of the greedy text ends it there, excluded, in both modes
const cut = Math.max(4, Math.floor(text.length / 2));
const stopStr = text.slice(cut, cut + 3);
const upTo = text.slice(0, text.indexOf(stopStr));
const st1 = await client.completions.create({ ...greedy, prompt: codePrompt, max_tokens: 40, stop: [stopStr, "@@never@@"] });
assert.equal(st1.choices[0].text, upTo);
assert.equal(st1.choices[0].finish_reason, "stop");
assert.ok(st1.usage.completion_tokens < 40);
const st2 = await streamCompletion({ ...greedy, prompt: codePrompt, max_tokens: 40, stop: stopStr });
assert.equal(st2.text, upTo);
assert.equal(st2.finish, "stop");
ok("stop " + JSON.stringify(stopStr) + ": text ends before it (non-stream and stream), finish_reason stop");

// ---- chat (chatml template)
const messages = [{ role: "system", content: "You write Python." }, { role: "user", content: "def add(a, b):" }];
const ch1 = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 24 });
assert.equal(ch1.object, "chat.completion");
assert.equal(ch1.choices[0].message.role, "assistant");
assert.equal(typeof ch1.choices[0].message.content, "string");
assert.ok(["stop", "length"].includes(ch1.choices[0].finish_reason));
assert.equal(ch1.usage.total_tokens, ch1.usage.prompt_tokens + ch1.usage.completion_tokens);
ok("chat: " + JSON.stringify(ch1.choices[0].message.content.slice(0, 50)) + " (" + ch1.choices[0].finish_reason + ")");
const chs = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 24, stream: true, stream_options: { include_usage: true } });
let chatText = "", role = null, chatFinish = null, chatUsage = null;
for await (const ch of chs) {
  assert.equal(ch.object, "chat.completion.chunk");
  if (ch.usage) { chatUsage = ch.usage; continue; }
  const d = ch.choices[0].delta;
  if (d.role) role = d.role;
  if (d.content) chatText += d.content;
  if (ch.choices[0].finish_reason) chatFinish = ch.choices[0].finish_reason;
}
assert.equal(role, "assistant");
assert.equal(chatText, ch1.choices[0].message.content);
assert.equal(chatFinish, ch1.choices[0].finish_reason);
assert.deepEqual(chatUsage.completion_tokens, ch1.usage.completion_tokens);
ok("chat stream: role first, same content and usage as non-stream");
const chl = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 6, logprobs: true, top_logprobs: 2, ignore_eos: true });
const content = chl.choices[0].logprobs.content;
assert.equal(content.length, 6);
for (const t of content) {
  assert.equal(t.top_logprobs.length, 2);
  assert.equal(t.top_logprobs[0].token, t.token);
  assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
  assert.deepEqual(t.bytes, [...Buffer.from(t.token, "utf8")]);
}
ok("chat logprobs: 6 tokens, top 2 each, the chosen first, bytes");
const seeded = { model, messages, temperature: 1.0, top_p: 0.9, seed: 1234, max_tokens: 16 };
const a1 = await client.chat.completions.create(seeded), a2 = await client.chat.completions.create(seeded);
assert.equal(a1.choices[0].message.content, a2.choices[0].message.content);
ok("chat sampled with a seed: reproducible");

// ---- 16 concurrent clients, each as alone
const jobs = Array.from({ length: 16 }, (_, i) => ({ prompt: ids(100 + i, 5 + 3 * i), max_tokens: 8 + (i % 5) * 4, stream: i % 2 === 1 }));
const alone = [];
for (const j of jobs) alone.push((await client.completions.create({ ...greedy, prompt: j.prompt, max_tokens: j.max_tokens })).choices[0].text);
const together = await Promise.all(jobs.map(async (j) => j.stream
  ? (await streamCompletion({ ...greedy, prompt: j.prompt, max_tokens: j.max_tokens })).text
  : (await client.completions.create({ ...greedy, prompt: j.prompt, max_tokens: j.max_tokens })).choices[0].text));
for (let i = 0; i < 16; i++) assert.equal(together[i], alone[i], "client " + i + " differs from its run alone");
ok("16 concurrent clients (streaming and not): each the same text as alone");
await expectIdle("after the concurrent clients");

// ---- a client that aborts mid-stream
const before = (await metrics()).get("fp8moe_requests_cancelled_total");
const ac = new AbortController();
const long = await client.completions.create({ ...greedy, prompt: ids(7, 10), max_tokens: 1800, stream: true }, { signal: ac.signal });
let got = 0, finished = false;
for await (const ch of long) {
  got += ch.choices.length;
  if (ch.choices.length && ch.choices[0].finish_reason) finished = true;
  if (got >= 5) { ac.abort(); break; } // the connection closes; the server sees the client gone
}
assert.equal(finished, false);
ok("client aborted a 1800-token stream after " + got + " chunks");
const idle = await expectIdle("after the abort");
assert.ok(idle.get("fp8moe_requests_cancelled_total") > before, "the aborted request was cancelled");
ok("the aborted request counted as cancelled");

// ---- a non-stream client that closes its connection while its reply is being generated
const before2 = idle.get("fp8moe_requests_cancelled_total");
await new Promise((resolve, reject) => {
  const body = JSON.stringify({ model, prompt: ids(8, 10), max_tokens: 1800, ignore_eos: true, temperature: 0 });
  const u = new URL(base);
  const sock = net.connect(Number(u.port), u.hostname, () => {
    sock.write("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer " +
               key + "\r\nContent-Length: " + Buffer.byteLength(body) + "\r\n\r\n" + body);
    const poll = async () => { // close once the server is generating it
      if ((await metrics()).get("fp8moe_requests_running") >= 1) { sock.destroy(); resolve(); } else setTimeout(poll, 20);
    };
    poll().catch(reject);
  });
  sock.on("error", reject);
});
const idle2 = await expectIdle("after a non-stream client closed its connection");
assert.ok(idle2.get("fp8moe_requests_cancelled_total") > before2, "the closed request was cancelled");
ok("the closed non-stream request counted as cancelled");

// ---- malformed and refused requests
expectError(await raw("/v1/completions", { body: "{not json" }), 400, null, "bad JSON");
expectError(await raw("/v1/completions", { body: "[1,2]" }), 400, null, "a JSON array body");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], temperature: "hot" } }), 400, "temperature", "temperature as a string");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], max_tokens: -1 } }), 400, "max_tokens", "max_tokens -1");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], max_tokens: 2.5 } }), 400, "max_tokens", "max_tokens 2.5");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], stream: "yes" } }), 400, "stream", "stream as a string");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], stop: 5 } }), 400, "stop", "stop as a number");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], top_p: 0 } }), 400, "top_p", "top_p 0");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], logprobs: 21 } }), 400, "logprobs", "logprobs 21");
expectError(await raw("/v1/completions", { body: { model, prompt: [1.5] } }), 400, "prompt", "a fractional token id");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 999999] } }), 400, "prompt", "a token id outside the vocabulary");
expectError(await raw("/v1/completions", { body: { model, prompt: [[1, 2], [3]] } }), 400, "prompt", "a batch of prompts");
expectError(await raw("/v1/completions", { body: { model } }), 400, "prompt", "no prompt");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], n: 2 } }), 400, "n", "n = 2");
expectError(await raw("/v1/chat/completions", { body: { model, messages: "hi" } }), 400, "messages", "messages as a string");
expectError(await raw("/v1/chat/completions", { body: { model, messages: [{ content: "no role" }] } }), 400, "messages", "a message without a role");
expectError(await raw("/v1/chat/completions", { body: { model, messages, top_logprobs: 2 } }), 400, "top_logprobs", "top_logprobs without logprobs");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2], max_tokens: 5000 } }), 400, "prompt", "prompt + max_tokens beyond the context");
const ctxErr = await raw("/v1/completions", { body: { model, prompt: ids(3, 100), max_tokens: 2000 } });
expectError(ctxErr, 400, "prompt", "100 + 2000 tokens beyond 2048");
assert.equal(ctxErr.json.error.code, "context_length_exceeded");
expectError(await raw("/v1/completions", { body: { model: "gpt-4", prompt: [1, 2] } }), 404, "model", "unknown model");
expectError(await raw("/v1/completions", { body: JSON.stringify({ model, prompt: "x".repeat(2 << 20) }) }), 413, undefined, "a 2 MiB body");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2] }, auth: null }), 401, undefined, "no API key");
expectError(await raw("/v1/completions", { body: { model, prompt: [1, 2] }, auth: "wrong" }), 401, undefined, "a wrong API key");
expectError(await raw("/v1/nothing", { method: "GET" }), 404, undefined, "an unknown endpoint");
expectError(await raw("/v1/completions", { method: "GET" }), 405, undefined, "GET on /v1/completions");
// through the client library: its typed errors carry the status
await assert.rejects(client.completions.create({ model: "nope", prompt: [1] }), (e) => e.status === 404);
await assert.rejects(new OpenAI({ baseURL: base + "/v1", apiKey: "bad", maxRetries: 0 }).models.list(), (e) => e.status === 401);
await assert.rejects(client.chat.completions.create({ model, messages, n: 3 }), (e) => e.status === 400);
ok("the client library raises 404, 401 and 400 with their statuses");

// ---- queue full: a server with one slot and no queue
const busy = new OpenAI({ baseURL: busyBase + "/v1", apiKey: "none", maxRetries: 0 });
const acBusy = new AbortController();
const hog = await busy.completions.create({ model, prompt: ids(9, 8), max_tokens: 1800, ignore_eos: true, stream: true }, { signal: acBusy.signal });
const it = hog[Symbol.asyncIterator]();
await it.next(); // it runs
await assert.rejects(busy.completions.create({ model, prompt: [1, 2, 3], max_tokens: 4 }), (e) => e.status === 429 && e.error.code === "queue_full");
ok("a full server answers 429 queue_full");
acBusy.abort();
try { for (;;) { const r = await it.next(); if (r.done) break; } } catch { /* aborted */ }
await expectIdle("the busy server after its client aborted", busyBase);
const again = await busy.completions.create({ model, prompt: [1, 2, 3], max_tokens: 4, temperature: 0 });
assert.equal(again.usage.completion_tokens > 0, true);
ok("the busy server takes a request again once free");

await expectIdle("at the end");
const m = await metrics();
assert.ok(m.get("fp8moe_generation_tokens_total") > 100);
assert.match(m.text, /fp8moe_time_to_first_token_seconds_count [1-9]/);
assert.match(m.text, /fp8moe_inter_token_latency_seconds_bucket\{le="\+Inf"\} [1-9]/);
assert.match(m.text, /fp8moe_requests_total\{status="401"\} [1-9]/);
ok("metrics: tokens, histograms, statuses");
console.log("client.mjs: " + checks + " checks passed");
