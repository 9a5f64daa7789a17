// Structured outputs and the agent fields through the official `openai` npm client, on a model that knows nothing
// of JSON or tools (models/tiny-code-moe under Qwen3's chat template): whatever it samples at temperature 1, the
// constraint must make every reply valid against its schema, and a forced tool call a call of the named tool.
// usage: node structured.mjs BASE_URL   (a server started with --chat-template <Qwen3's template file>)
import assert from "node:assert/strict";
import OpenAI from "openai";

const [base] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0, timeout: 300000 });
let checks = 0;
function ok(what) { checks++; console.log("  ok  " + what); }

/* a small validator for the schema subset used here (type, properties, required, additionalProperties false,
 * enum, const, maxLength, minimum, maximum, items, minItems, maxItems, anyOf) */
function valid(v, s, path = "#") {
  if (s.anyOf) {
    const errs = s.anyOf.map((t) => valid(v, t, path)).filter((e) => e);
    return errs.length < s.anyOf.length ? null : errs[0];
  }
  if (s.enum && !s.enum.some((x) => JSON.stringify(x) === JSON.stringify(v))) return path + ": not in enum";
  if ("const" in s && JSON.stringify(s.const) !== JSON.stringify(v)) return path + ": not the const";
  const types = s.type === undefined ? null : [].concat(s.type);
  const typeOf = (x) => x === null ? "null" : Array.isArray(x) ? "array" : Number.isInteger(x) ? "integer" : typeof x;
  if (types && !types.some((t) => t === typeOf(v) || (t === "number" && typeof v === "number")))
    return path + ": type " + typeOf(v) + ", want " + types.join("|");
  if (typeof v === "string" && s.maxLength !== undefined && [...v].length > s.maxLength) return path + ": too long";
  if (typeof v === "number") {
    if (s.minimum !== undefined && v < s.minimum) return path + ": below minimum";
    if (s.maximum !== undefined && v > s.maximum) return path + ": above maximum";
  }
  if (Array.isArray(v)) {
    if (s.minItems !== undefined && v.length < s.minItems) return path + ": too few items";
    if (s.maxItems !== undefined && v.length > s.maxItems) return path + ": too many items";
    for (let i = 0; s.items && i < v.length; i++) { const e = valid(v[i], s.items, path + "/" + i); if (e) return e; }
  }
  if (typeOf(v) === "object") {
    for (const k of s.required || []) if (!(k in v)) return path + ": no " + k;
    for (const [k, x] of Object.entries(v)) {
      if (s.properties && k in s.properties) { const e = valid(x, s.properties[k], path + "/" + k); if (e) return e; }
      else if (s.additionalProperties === false) return path + ": extra key " + k;
    }
  }
  return null;
}

const person = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer", minimum: 0, maximum: 150 },
    role: { enum: ["admin", "user", null] },
    tags: { type: "array", items: { type: "string", maxLength: 4 }, maxItems: 3 },
    home: { anyOf: [{ type: "null" }, { type: "object", properties: { city: { type: "string", maxLength: 8 } },
                                           required: ["city"], additionalProperties: false }] },
  },
  required: ["name", "age", "role", "tags", "home"],
  additionalProperties: false,
};

async function main() {
  // json_schema at temperature 1, several seeds: every complete reply parses and is valid
  let complete = 0;
  const replies = await Promise.all([1, 2, 3].map((seed) => client.chat.completions.create({
    messages: [{ role: "user", content: "Describe a person." }], temperature: 1, seed, max_tokens: 250,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } },
  })));
  for (const [i, r] of replies.entries()) {
    const c = r.choices[0];
    if (c.finish_reason === "length") continue;
    const v = JSON.parse(c.message.content);
    assert.equal(valid(v, person), null, "seed " + (i + 1) + ": " + c.message.content);
    complete++;
  }
  assert.ok(complete >= 2, "at most one reply may be cut by max_tokens, " + complete + " of 3 complete");
  ok("json_schema at temperature 1: " + complete + " of 3 replies complete, each valid against the schema");

  const r2 = await client.chat.completions.create({
    messages: [{ role: "user", content: "JSON please" }], temperature: 1, seed: 7, max_tokens: 300,
    response_format: { type: "json_object" },
  });
  if (r2.choices[0].finish_reason !== "length") {
    const v = JSON.parse(r2.choices[0].message.content);
    assert.equal(typeof v, "object");
    assert.ok(v !== null && !Array.isArray(v));
  }
  ok("json_object: one JSON object");

  // a forced tool call: the named function, with arguments valid against its parameters
  const tools = [
    { type: "function", function: { name: "get_weather", parameters: { type: "object",
      properties: { city: { type: "string", maxLength: 10 } }, required: ["city"], additionalProperties: false } } },
    { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {},
      additionalProperties: false } } },
  ];
  for (const [choice, want] of [[{ type: "function", function: { name: "get_weather" } }, "get_weather"],
                                ["required", null]]) {
    const r = await client.chat.completions.create({
      messages: [{ role: "user", content: "Weather?" }], temperature: 1, seed: 3, max_tokens: 120, tools,
      tool_choice: choice, parallel_tool_calls: false,
    });
    const c = r.choices[0];
    assert.ok(c.message.tool_calls && c.message.tool_calls.length === 1, JSON.stringify(c));
    const call = c.message.tool_calls[0];
    assert.match(call.id, /^call_/);
    if (want) assert.equal(call.function.name, want);
    else assert.ok(["get_weather", "get_time"].includes(call.function.name));
    if (c.finish_reason !== "length") {
      assert.equal(c.finish_reason, "tool_calls");
      const schema = tools.find((t) => t.function.name === call.function.name).function.parameters;
      assert.equal(valid(JSON.parse(call.function.arguments), schema), null, call.function.arguments);
    }
  }
  ok("tool_choice named and required: one call of an allowed tool, its arguments valid");

  // logit_bias forces a token on the completions endpoint
  const lb = await client.completions.create({ prompt: "def", max_tokens: 3, temperature: 0, logit_bias: { "65": 100 } });
  const forced = await client.completions.create({ prompt: [65, 65, 65], max_tokens: 1, temperature: 0 });
  assert.ok(lb.choices[0].text.length > 0 && forced !== null);
  const lb2 = await client.completions.create({ prompt: "def", max_tokens: 3, temperature: 0, logprobs: 1,
                                                 logit_bias: { "65": 100 } });
  assert.ok(lb2.choices[0].logprobs.tokens.every((t) => t === lb2.choices[0].logprobs.tokens[0]));
  ok("logit_bias +100 forces one token at every step");

  // refusals name the field
  for (const [body, want] of [
    [{ response_format: { type: "bogus" } }, /response_format/],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "a+" } } } },
     /pattern/],
    [{ tool_choice: "required" }, /tools/],
    [{ logit_bias: { "-1": 5 } }, /logit_bias/],
    [{ chat_template_kwargs: 3 }, /chat_template_kwargs/],
  ]) {
    await assert.rejects(
      client.chat.completions.create({ messages: [{ role: "user", content: "x" }], max_tokens: 2, ...body }),
      (e) => e.status === 400 && want.test(e.message), JSON.stringify(body));
  }
  ok("response_format bogus, an unsupported schema keyword, tool_choice without tools, bad logit_bias: 400s naming them");
  console.log(checks + " structured-output checks passed");
}

main().catch((e) => { console.error(e); process.exit(1); });
