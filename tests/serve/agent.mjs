// fp8moe serve as an agent's backend, through the official `openai` npm client: tool calls (non-streamed,
// streamed, the runTools helper), reasoning, the thinking switch, tool_choice, and the errors OpenAI gives.
// usage: node tests/serve/agent.mjs BASE_URL [API_KEY]
//   BASE_URL  fp8moe serve --model tests/models/tiny-agent (a Qwen3-MoE trained to think, call get_weather / add /
//             convert_units with the argument named in the question, and answer from the tool's result)
// The shapes asserted are OpenAI's documented ones. Every check prints one line; the first failure ends the run
// with exit code 1.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { VERSION } from "openai/version";

const [base, key = "none"] = process.argv.slice(2);
if (!base) {
  console.error("usage: node tests/serve/agent.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
let checks = 0;
function ok(what) { checks++; console.log("  ok  " + what); }

// the tools as the model saw them in training (tools/make_agent_model.py)
const fn = (name, description, properties) => ({
  type: "function",
  function: { name, description, parameters: { type: "object", properties, required: Object.keys(properties) } },
});
const weatherTool = fn("get_weather", "Get the current weather in a city.", { city: { type: "string", description: "The city name." } });
const addTool = fn("add", "Add two integers.", {
  a: { type: "integer", description: "The first number." },
  b: { type: "integer", description: "The second number." },
});
const convertTool = fn("convert_units", "Convert a value from one unit to another.", {
  value: { type: "number", description: "The value to convert." },
  from_unit: { type: "string", description: "The unit of the value." },
  to_unit: { type: "string", description: "The unit to convert to." },
});
const tools = [weatherTool, addTool, convertTool];
const parisWeather = { city: "Paris", temperature: 21, condition: "sunny" };

const models = await client.models.list();
const model = models.data[0].id;
const req = { model, temperature: 0, max_tokens: 200 };
const ask = (content) => [{ role: "user", content }];

async function raw(body) {
  const r = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + key },
    body: JSON.stringify({ ...req, ...body }),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

function expect400(r, what, param) {
  assert.equal(r.status, 400, what + ": status " + r.status + " " + r.text.slice(0, 300));
  assert.ok(r.json?.error?.message, what + ": no error.message: " + r.text.slice(0, 300));
  if (param !== undefined) assert.equal(r.json.error.param, param, what + ": error.param");
  ok(what + " -> 400 (" + r.json.error.message.slice(0, 70) + ")");
}

/* message.tool_calls as OpenAI documents them: one call, an id, type function, a name, arguments a JSON string */
function expectCall(msg, name, args, what) {
  assert.ok(Array.isArray(msg.tool_calls), what + ": no message.tool_calls: " + JSON.stringify(msg));
  assert.equal(msg.tool_calls.length, 1, what + ": one tool call");
  const tc = msg.tool_calls[0];
  assert.equal(typeof tc.id, "string");
  assert.ok(tc.id.length > 0, what + ": tool call id");
  assert.equal(tc.type, "function");
  assert.equal(tc.function.name, name, what + ": function.name");
  assert.equal(typeof tc.function.arguments, "string", what + ": function.arguments is a JSON string");
  if (args !== undefined) assert.deepEqual(JSON.parse(tc.function.arguments), args, what + ": arguments");
  return tc;
}

function noMarkup(text, what) {
  if (text == null) return;
  for (const tag of ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"])
    assert.ok(!text.includes(tag), what + ": " + tag + " leaked into the text: " + JSON.stringify(text));
}

function reasoningTokens(usage) {
  return usage?.completion_tokens_details?.reasoning_tokens;
}

console.log("== agent: openai " + VERSION + " against " + base + " (model " + model + ")");

// ---- a tool round trip, non-streamed, thinking on (the template's default)
const q = ask("What is the weather in Paris?");
const r1 = await client.chat.completions.create({ ...req, messages: q, tools });
const c1 = r1.choices[0];
assert.equal(r1.object, "chat.completion");
assert.equal(c1.finish_reason, "tool_calls", "finish_reason");
assert.equal(c1.message.role, "assistant");
const tc1 = expectCall(c1.message, "get_weather", { city: "Paris" }, "tool call");
assert.equal(c1.message.content, null, "message.content is null beside tool calls");
ok("tool call: finish_reason tool_calls, get_weather " + tc1.function.arguments + ", id " + tc1.id + ", content null");
assert.equal(typeof c1.message.reasoning_content, "string", "message.reasoning_content");
assert.ok(c1.message.reasoning_content.trim().length > 0, "reasoning_content is empty");
noMarkup(c1.message.reasoning_content, "reasoning_content");
ok("reasoning_content: " + JSON.stringify(c1.message.reasoning_content.slice(0, 60)));
const rt1 = reasoningTokens(r1.usage);
assert.ok(Number.isInteger(rt1) && rt1 > 0 && rt1 < r1.usage.completion_tokens,
  "usage.completion_tokens_details.reasoning_tokens: " + JSON.stringify(r1.usage));
ok("usage: " + rt1 + " of " + r1.usage.completion_tokens + " completion tokens are reasoning");

// the client sends the assistant message back as it came (content null, reasoning_content beside) and the result
const history = [...q, c1.message, { role: "tool", tool_call_id: tc1.id, content: JSON.stringify(parisWeather) }];
const r2 = await client.chat.completions.create({ ...req, messages: history, tools });
const c2 = r2.choices[0];
assert.equal(c2.finish_reason, "stop", "finish_reason after the tool's result");
assert.ok(!c2.message.tool_calls || c2.message.tool_calls.length === 0, "no tool call after the result");
assert.equal(typeof c2.message.content, "string");
noMarkup(c2.message.content, "answer");
assert.ok(c2.message.content.includes("sunny") && c2.message.content.includes("21"),
  "the answer uses the tool's result: " + JSON.stringify(c2.message.content));
ok("answer from the tool's result: " + JSON.stringify(c2.message.content));
assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens, "the history reached the prompt");

// the same history with the assistant's reasoning dropped (clients that keep only content and tool_calls)
const { reasoning_content: _dropped, ...bare } = c1.message;
const r2b = await client.chat.completions.create({ ...req, messages: [...q, bare, history[2]], tools });
assert.ok(r2b.choices[0].message.content.includes("21"), "answer without the reasoning in the history");
ok("answer with the history's reasoning dropped: " + JSON.stringify(r2b.choices[0].message.content));

// the tools reach the prompt: the same question without them costs fewer prompt tokens and calls nothing
const r0 = await client.chat.completions.create({ ...req, messages: q });
assert.ok(r0.usage.prompt_tokens < r1.usage.prompt_tokens, "tools add prompt tokens");
assert.ok(!r0.choices[0].message.tool_calls?.length, "no tools, no tool call");
assert.notEqual(r0.choices[0].finish_reason, "tool_calls");
ok("without tools: " + r0.usage.prompt_tokens + " prompt tokens (with: " + r1.usage.prompt_tokens + "), no tool call");

// ---- the same call streamed
const stream = await client.chat.completions.create({
  ...req, messages: q, tools, stream: true, stream_options: { include_usage: true },
});
let reasoning = "", content = "", finish = null, usage = null, streamId = null, callDeltas = [];
for await (const chunk of stream) {
  assert.equal(chunk.object, "chat.completion.chunk");
  streamId ??= chunk.id;
  assert.equal(chunk.id, streamId, "one id for every chunk");
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    assert.equal(ch.index, 0);
    const d = ch.delta;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) content += d.content;
    if (d.tool_calls) callDeltas.push(...d.tool_calls);
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(finish, "tool_calls", "streamed finish_reason");
assert.equal(content, "", "no content beside the streamed tool call: " + JSON.stringify(content));
assert.equal(reasoning, c1.message.reasoning_content, "streamed reasoning equals the non-streamed one");
assert.ok(callDeltas.length >= 2, "a tool call streams as a header then argument fragments: " + JSON.stringify(callDeltas));
const first = callDeltas[0];
assert.equal(first.index, 0);
assert.equal(typeof first.id, "string");
assert.equal(first.type, "function");
assert.equal(first.function.name, "get_weather");
for (const d of callDeltas.slice(1)) {
  assert.equal(d.index, 0, "every fragment names its call's index");
  assert.ok(d.id === undefined || d.id === first.id, "later fragments repeat no other id");
  assert.ok(d.function?.name === undefined || d.function.name === first.function.name, "no second name");
}
const streamedArgs = callDeltas.map((d) => d.function?.arguments ?? "").join("");
assert.deepEqual(JSON.parse(streamedArgs), { city: "Paris" }, "streamed arguments");
assert.equal(streamedArgs, tc1.function.arguments, "streamed arguments equal the non-streamed ones");
ok("streamed: reasoning deltas, delta.tool_calls header (index, id, type, name) then " + (callDeltas.length - 1) +
  " argument fragments, finish_reason tool_calls");
assert.ok(usage && reasoningTokens(usage) === rt1, "streamed usage with reasoning_tokens: " + JSON.stringify(usage));
ok("streamed usage chunk: reasoning_tokens " + reasoningTokens(usage));

// the SDK's own stream accumulator rebuilds the same message (it rejects deltas out of OpenAI's shape)
const acc = await client.chat.completions.stream({ ...req, messages: q, tools }).finalChatCompletion();
expectCall(acc.choices[0].message, "get_weather", { city: "Paris" }, "stream helper");
ok("chat.completions.stream().finalChatCompletion(): the same tool call");

// a streamed answer after the tool's result
let answer = "";
for await (const chunk of await client.chat.completions.create({ ...req, messages: history, tools, stream: true }))
  answer += chunk.choices[0]?.delta?.content ?? "";
assert.equal(answer, c2.message.content, "streamed answer equals the non-streamed one");
ok("streamed answer: " + JSON.stringify(answer));

// ---- thinking off: chat_template_kwargs (vLLM's and SGLang's extension, passed through by the client)
const r3 = await client.chat.completions.create({
  ...req, messages: ask("What is 12 plus 30?"), tools, chat_template_kwargs: { enable_thinking: false },
});
expectCall(r3.choices[0].message, "add", { a: 12, b: 30 }, "thinking off");
assert.ok(!r3.choices[0].message.reasoning_content, "no reasoning with enable_thinking false");
assert.equal(reasoningTokens(r3.usage) ?? 0, 0, "reasoning_tokens 0 with enable_thinking false");
ok("enable_thinking false: add {a: 12, b: 30}, no reasoning_content, reasoning_tokens 0");
const r3b = await client.chat.completions.create({
  ...req, messages: ask("What is 12 plus 30?"), tools, chat_template_kwargs: { enable_thinking: true },
});
assert.ok(r3b.usage.prompt_tokens < r3.usage.prompt_tokens, "enable_thinking false adds the empty think block");
assert.ok(r3b.choices[0].message.reasoning_content?.length > 0, "enable_thinking true thinks");
ok("enable_thinking true vs false: " + r3b.usage.prompt_tokens + " vs " + r3.usage.prompt_tokens + " prompt tokens");

const r4 = await client.chat.completions.create({
  ...req, messages: ask("Hello!"), chat_template_kwargs: { enable_thinking: false },
});
assert.equal(r4.choices[0].finish_reason, "stop");
assert.ok(r4.choices[0].message.content.length > 0);
noMarkup(r4.choices[0].message.content, "plain answer");
ok("plain answer, thinking off: " + JSON.stringify(r4.choices[0].message.content));

// ---- tool_choice
const r5 = await client.chat.completions.create({ ...req, messages: ask("Hello!"), tools, tool_choice: "required" });
const m5 = r5.choices[0].message;
assert.ok(m5.tool_calls?.length >= 1, "tool_choice required: a call even for a greeting: " + JSON.stringify(m5));
for (const tc of m5.tool_calls) {
  const t = tools.find((x) => x.function.name === tc.function.name);
  assert.ok(t, "required: a call of a given tool, not " + tc.function.name);
  const args = JSON.parse(tc.function.arguments);
  for (const [k, s] of Object.entries(t.function.parameters.properties)) {
    assert.ok(k in args, "required: argument " + k + " present: " + tc.function.arguments);
    const v = args[k];
    assert.ok(s.type === "string" ? typeof v === "string" : s.type === "integer" ? Number.isInteger(v) : typeof v === "number",
      "required: argument " + k + " is a " + s.type + ": " + tc.function.arguments);
  }
}
assert.ok(["tool_calls", "stop"].includes(r5.choices[0].finish_reason));
ok("tool_choice required: " + m5.tool_calls.map((t) => t.function.name + t.function.arguments).join(", "));

const r6 = await client.chat.completions.create({
  ...req, messages: ask("What is 12 plus 30?"), tools, tool_choice: { type: "function", function: { name: "get_weather" } },
});
const tc6 = expectCall(r6.choices[0].message, "get_weather", undefined, "named tool_choice");
assert.equal(typeof JSON.parse(tc6.function.arguments).city, "string", "named: its schema's arguments");
ok("tool_choice {function: get_weather} for an addition: get_weather " + tc6.function.arguments);

const r7 = await client.chat.completions.create({ ...req, messages: ask("Hello!"), tools, tool_choice: "none" });
assert.ok(!r7.choices[0].message.tool_calls?.length, "tool_choice none: no tool call");
assert.notEqual(r7.choices[0].finish_reason, "tool_calls");
assert.equal(typeof r7.choices[0].message.content, "string");
noMarkup(r7.choices[0].message.content, "tool_choice none");
ok("tool_choice none: no call, content " + JSON.stringify(r7.choices[0].message.content.slice(0, 60)));

const r8 = await client.chat.completions.create({ ...req, messages: q, tools, parallel_tool_calls: false });
expectCall(r8.choices[0].message, "get_weather", { city: "Paris" }, "parallel_tool_calls false");
ok("parallel_tool_calls false: one call");

// ---- the runTools helper: it calls our function with the parsed arguments and sends the result back
const seen = [];
const runner = client.chat.completions.runTools({
  ...req,
  messages: q,
  tools: [{
    type: "function",
    function: {
      ...weatherTool.function,
      parse: JSON.parse,
      function: async (args) => { seen.push(args); return parisWeather; },
    },
  }],
});
const final = await runner.finalContent();
assert.deepEqual(seen, [{ city: "Paris" }], "runTools called get_weather once with the question's city");
assert.ok(final.includes("21") && final.includes("sunny"), "runTools' final answer: " + JSON.stringify(final));
const roles = runner.messages.map((m) => m.role);
assert.deepEqual(roles, ["user", "assistant", "tool", "assistant"], "runTools' conversation: " + roles.join(","));
ok("runTools: get_weather(" + JSON.stringify(seen[0]) + ") then " + JSON.stringify(final));

// ---- what a client can get wrong is refused with OpenAI's error shape
expect400(await raw({ messages: q, tools, tool_choice: { type: "function", function: { name: "nope" } } }),
  "tool_choice naming no given tool", "tool_choice");
expect400(await raw({ messages: q, tool_choice: "required" }), "tool_choice required without tools", "tool_choice");
expect400(await raw({ messages: q, tools, tool_choice: "sometimes" }), "tool_choice sometimes", "tool_choice");
expect400(await raw({ messages: q, tools: [{ type: "function" }] }), "a tool without a function", "tools");
expect400(await raw({ messages: [...q, { role: "tool", content: "{}" }] }), "a tool message without tool_call_id",
  "messages");

console.log("agent: " + checks + " checks passed");
