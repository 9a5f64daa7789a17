// fp8moe serve's operations and hostile-input handling, with raw fetch and raw sockets (what a client library
// hides): fields refused by name, /tokenize and /detokenize, HEAD/405/CORS, Retry-After, a random seed, numeric
// edges, bodies that are not UTF-8 or hold \u0000, a full context, Host checks, duplicate Content-Length,
// Expect: 100-continue, idle and half-sent connections, a connection cap per client, a huge chunk size.
// usage: node server_ops.mjs OPS_URL MAIN_URL MAIN_KEY BUSY_URL
//   OPS_URL   models/tiny-code-moe, no key, --chat-template tests/chat_templates/chatml/chat_template.jinja --cors-origin https://app.example
//             --strict-fields --idle-timeout 2 --max-conns-per-client 8
//   MAIN_URL  the keyed server of client.mjs; BUSY_URL: --max-seqs 1 --max-queue 0
import assert from "node:assert/strict";
import net from "node:net";

const [base, mainBase, mainKey, busyBase] = process.argv.slice(2);
const model = "tiny-code-moe";
let checks = 0;
function ok(what) { checks++; console.log("  ok  " + what); }

async function post(path, body, { url = base, headers = {} } = {}) {
  const r = await fetch(url + path, {
    method: "POST", headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const bytes = new Uint8Array(await r.arrayBuffer());
  const text = new TextDecoder().decode(bytes);
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, bytes, headers: r.headers };
}

function expectError(r, status, param, what) {
  assert.equal(r.status, status, what + ": " + r.status + " " + r.text);
  assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", what + ": " + r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, what + ": param");
  ok(what + " -> " + status + " (" + r.json.error.message.slice(0, 80) + ")");
}

/* raw HTTP over a socket: what came back within ms (or until the server closed) */
function rawHttp(request, { ms = 4000, url = base } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    let data = "", closed = false;
    const s = net.connect(Number(port), hostname, () => s.write(request));
    s.on("data", (d) => { data += d.toString("latin1"); });
    s.on("error", () => {});
    s.on("close", () => { closed = true; resolve({ data, closed }); });
    setTimeout(() => { s.destroy(); if (!closed) resolve({ data, closed: false }); }, ms);
  });
}

// ---- endpoints and HTTP
let r = await fetch(base + "/health", { method: "HEAD" });
assert.equal(r.status, 200);
assert.equal((await r.text()).length, 0);
ok("HEAD /health: 200, no body");
r = await fetch(base + "/health", { method: "POST" });
assert.equal(r.status, 405);
assert.equal(r.headers.get("allow"), "GET, HEAD");
ok("POST /health: 405 with Allow: GET, HEAD");
r = await fetch(base + "/v1/chat/completions", {
  method: "OPTIONS",
  headers: { Origin: "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type" },
});
assert.equal(r.status, 204);
assert.equal(r.headers.get("access-control-allow-origin"), "https://app.example");
assert.match(r.headers.get("access-control-allow-methods"), /POST/);
assert.match(r.headers.get("access-control-allow-headers"), /Authorization/);
r = await fetch(base + "/v1/models", { headers: { Origin: "https://app.example" } });
assert.equal(r.headers.get("access-control-allow-origin"), "https://app.example");
const models = await r.json();
assert.equal(models.data[0].max_model_len, 2048);
r = await fetch(base + "/v1/models", { headers: { Origin: "https://evil.example" } });
assert.equal(r.headers.get("access-control-allow-origin"), null);
ok("CORS: preflight 204 and Access-Control-Allow-Origin for --cors-origin only; max_model_len in /v1/models");

// ---- /tokenize, /detokenize
const tk = await post("/tokenize", { model, prompt: "def main():", return_token_strs: true });
assert.equal(tk.status, 200, tk.text);
assert.equal(tk.json.count, tk.json.tokens.length);
assert.equal(tk.json.max_model_len, 2048);
assert.equal(tk.json.token_strs.join(""), "def main():");
const dt = await post("/detokenize", { model, tokens: tk.json.tokens });
assert.deepEqual(dt.json, { prompt: "def main():" });
const tm = await post("/tokenize", { messages: [{ role: "user", content: "hi" }], add_generation_prompt: true });
assert.equal(tm.status, 200, tm.text);
const tmText = (await post("/detokenize", { tokens: tm.json.tokens })).json.prompt;
assert.equal(tmText, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
const tm2 = await post("/tokenize", { messages: [{ role: "user", content: "hi" }], add_generation_prompt: false, chat_template_kwargs: { enable_thinking: false } });
assert.ok(tm2.json.count < tm.json.count);
ok("/tokenize (prompt, messages through the chat template) and /detokenize: " + tm.json.count + " tokens round-trip");
expectError(await post("/tokenize", { prompt: "x", frobnicate: 1 }), 400, "frobnicate", "/tokenize with an unknown field");
expectError(await post("/tokenize", { prompt: "x", messages: [] }), 400, "prompt", "/tokenize with prompt and messages");
expectError(await post("/detokenize", { tokens: [1, -2] }), 400, "tokens", "/detokenize with a negative id");
assert.equal((await fetch(base + "/tokenize")).status, 405);
ok("GET /tokenize: 405");

// ---- fields: refused by name, no effect, unknown (this server runs --strict-fields)
const greedy = { model, temperature: 0, ignore_eos: true };
expectError(await post("/v1/completions", { ...greedy, prompt: [1, 2], max_tokens: 2, suffix: "x" }), 400, "suffix", "suffix (refused)");
expectError(await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "hi" }], max_tokens: 2, audio: { voice: "x" } }), 400, "audio", "audio (refused)");
expectError(await post("/v1/completions", { ...greedy, prompt: [1, 2], max_tokens: 2, frobnicate: true }), 400, "frobnicate", "an unknown field under --strict-fields");
expectError(await post("/v1/completions", { ...greedy, prompt: [1, 2], max_tokens: 2, messages: [] }), 400, "messages", "messages on /v1/completions");
r = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "hi" }], max_tokens: 2, user: "u1", metadata: { a: "b" }, store: false, service_tier: "auto" });
assert.equal(r.status, 200, r.text);
ok("user, metadata, store, service_tier: accepted (no effect, as the table says)");

// ---- seeds and numeric edges
const sampled = { model, prompt: "def main():", max_tokens: 24, temperature: 1.0, ignore_eos: true };
const texts = new Set();
for (let i = 0; i < 3; i++) texts.add((await post("/v1/completions", sampled)).json.choices[0].text);
assert.ok(texts.size >= 2, "three unseeded samples are not all the same text");
const s1 = (await post("/v1/completions", { ...sampled, seed: 7 })).json.choices[0].text;
assert.equal((await post("/v1/completions", { ...sampled, seed: 7 })).json.choices[0].text, s1);
ok("an omitted seed draws a random one (" + texts.size + " texts of 3); seed 7 twice: the same text");
const g = (await post("/v1/completions", { ...greedy, prompt: "def main():", max_tokens: 16 })).json.choices[0].text;
r = await post("/v1/completions", { model, prompt: "def main():", max_tokens: 16, ignore_eos: true, temperature: 1, top_p: 1e-50 });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.choices[0].text, g);
r = await post("/v1/completions", { model, prompt: "def main():", max_tokens: 16, ignore_eos: true, temperature: 1e-40 });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.choices[0].text, g);
ok("top_p 1e-50 and temperature 1e-40: 200, the greedy text");

// ---- bodies
expectError(await post("/v1/completions", '{"model":"tiny-code-moe","prompt":"a\\u0000b","max_tokens":2}'), 400, undefined, "\\u0000 in a prompt");
const badUtf8 = new Uint8Array([...new TextEncoder().encode('{"prompt":"a","model":"'), 0xff, 0xfe, ...new TextEncoder().encode('"}')]);
r = await post("/v1/completions", badUtf8);
expectError(r, 400, undefined, "invalid UTF-8 in the body");
assert.ok(!r.bytes.includes(0xff) && !r.bytes.includes(0xfe), "the reply echoes no invalid byte");
const full = Array.from({ length: 2048 }, (_, i) => (i % 400) + 1);
const before = (await (await fetch(base + "/metrics")).text()).match(/fp8moe_requests_total\{status="400"\} (\d+)/)[1];
expectError(await post("/v1/completions", { model, prompt: full }), 400, "prompt", "a prompt filling the context, no max_tokens");
r = await post("/v1/completions", { model, prompt: full, stream: true });
expectError(r, 400, "prompt", "the same, streamed");
assert.equal(r.json.error.code, "context_length_exceeded");
const after = (await (await fetch(base + "/metrics")).text()).match(/fp8moe_requests_total\{status="400"\} (\d+)/)[1];
assert.ok(Number(after) >= Number(before) + 2);
ok("both counted as 400 in /metrics");

// ---- raw HTTP
let x = await rawHttp("GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n");
assert.match(x.data, /^HTTP\/1\.1 403/);
x = await rawHttp("GET /v1/models HTTP/1.1\r\nHost: localhost:1234\r\nConnection: close\r\n\r\n");
assert.match(x.data, /^HTTP\/1\.1 200/);
ok("Host evil.example on a keyless loopback server: 403; Host localhost: 200");
x = await rawHttp("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}");
assert.match(x.data, /^HTTP\/1\.1 400/);
ok("two different Content-Length headers: 400");
x = await rawHttp("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\nExpect: 100-continue\r\n\r\n");
assert.match(x.data, /^HTTP\/1\.1 413/);
assert.ok(!x.data.includes("100 Continue"));
ok("Expect: 100-continue with an over-limit length: 413 without 100 Continue");
x = await rawHttp("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nabc", { ms: 5000 });
assert.ok(x.closed || /^HTTP\/1\.1 4\d\d/.test(x.data), "a chunk size of 2^64 is answered or closed: " + x.data.slice(0, 60));
ok("a chunk size of 2^64: " + (x.data ? x.data.split("\r\n")[0] : "closed"));
let t0 = Date.now();
x = await rawHttp("", { ms: 6000 });
assert.ok(x.closed, "an idle connection is closed");
x = await rawHttp("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le", { ms: 6000 });
assert.ok(x.closed, "a half-sent request is closed");
ok("an idle connection and a half-sent request are closed (--idle-timeout 2) in " + (Date.now() - t0) + " ms");
// the per-client cap: 8 idle connections held, the 9th is closed at once; the server still answers afterwards
const { port } = new URL(base);
const held = await Promise.all(Array.from({ length: 8 }, () => new Promise((res) => {
  const s = net.connect(Number(port), "127.0.0.1", () => res(s));
  s.on("error", () => {});
})));
t0 = Date.now();
x = await rawHttp("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", { ms: 1500 });
assert.ok(!x.data.startsWith("HTTP/1.1 200"), "the 9th connection is refused: " + x.data.slice(0, 40));
held.forEach((s) => s.destroy());
await new Promise((res) => setTimeout(res, 200));
assert.equal((await fetch(base + "/health")).status, 200);
ok("--max-conns-per-client 8: the 9th connection is closed, the server answers once they go");

// ---- the key guards /metrics and /tokenize; 429 says when to retry
assert.equal((await fetch(mainBase + "/metrics")).status, 401);
assert.equal((await fetch(mainBase + "/metrics", { headers: { Authorization: "Bearer " + mainKey } })).status, 200);
assert.equal((await post("/tokenize", { prompt: "x" }, { url: mainBase })).status, 401);
ok("with --api-key: /metrics and /tokenize need the key");
const ctl = new AbortController();
const long = await fetch(busyBase + "/v1/completions", {
  method: "POST", headers: { "Content-Type": "application/json" }, signal: ctl.signal,
  body: JSON.stringify({ model, prompt: [1, 2, 3], max_tokens: 1500, ignore_eos: true, stream: true }),
});
assert.equal(long.status, 200); // its headers came: it holds the busy server's one slot (--max-queue 0)
const r429 = await post("/v1/completions", { model, prompt: [1, 2], max_tokens: 1 }, { url: busyBase });
ctl.abort();
await long.body.cancel().catch(() => {});
assert.equal(r429.status, 429, r429.text);
assert.equal(r429.headers.get("retry-after"), "1");
ok("429 with Retry-After: 1");

// ---- metrics names
const m = await (await fetch(base + "/metrics")).text();
for (const name of ["fp8moe_time_to_first_token_seconds_bucket", "fp8moe_inter_token_latency_seconds_bucket",
  "fp8moe_e2e_request_latency_seconds_bucket", "fp8moe_requests_running ", "fp8moe_requests_waiting ",
  "fp8moe_kv_cache_usage_ratio ", "fp8moe_prefix_cache_hits_total ", "fp8moe_prefix_cache_queries_total ",
  "fp8moe_requests_cut_total ", "fp8moe_draining 0"])
  assert.ok(m.includes(name), "metric " + name + " missing");
ok("metrics: latency histograms, running/waiting, KV usage, prefix-cache hits");
console.log(checks + " checks passed");
