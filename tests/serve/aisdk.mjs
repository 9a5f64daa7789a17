// fp8moe serve through a second client nobody here wrote: the Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`
// and `zod`): generateText with a tool it runs before answering, streamText, generateObject with a zod schema
// (structured outputs: response_format json_schema, strict), and chat_template_kwargs through providerOptions.
// usage: node tests/serve/aisdk.mjs BASE_URL [API_KEY]
//   BASE_URL  fp8moe serve --model tests/models/tiny-agent
// Every check prints one line; the first failure ends the run with exit code 1.
import assert from "node:assert/strict";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [base, key = "none"] = process.argv.slice(2);
if (!base) {
  console.error("usage: node tests/serve/aisdk.mjs BASE_URL [API_KEY]");
  process.exit(2);
}
let checks = 0;
function ok(what) { checks++; console.log("  ok  " + what); }

const ids = await (await fetch(base + "/v1/models", { headers: { Authorization: "Bearer " + key } })).json();
const provider = createOpenAICompatible({
  name: "fp8moe", baseURL: base + "/v1", apiKey: key, includeUsage: true, supportsStructuredOutputs: true,
});
const model = provider(ids.data[0].id);
const common = { model, temperature: 0, maxOutputTokens: 200, maxRetries: 0 };

const calls = [];
const getWeather = tool({
  description: "Get the current weather in a city.",
  inputSchema: z.object({ city: z.string().describe("The city name.") }),
  execute: async ({ city }) => {
    calls.push(city);
    return { city, temperature: 21, condition: "sunny" };
  },
});

console.log("== aisdk: ai + @ai-sdk/openai-compatible against " + base);

// ---- generateText: the model calls the tool, the SDK runs it and sends the result, the model answers
const g = await generateText({
  ...common, tools: { get_weather: getWeather }, stopWhen: stepCountIs(3), prompt: "What is the weather in Paris?",
});
assert.deepEqual(calls, ["Paris"], "the SDK ran get_weather once with the question's city");
assert.equal(g.steps.length, 2, "two steps: the call, then the answer");
assert.equal(g.steps[0].finishReason, "tool-calls", "step 1 ends in a tool call");
assert.equal(g.steps[0].toolCalls.length, 1);
assert.equal(g.steps[0].toolCalls[0].toolName, "get_weather");
assert.deepEqual(g.steps[0].toolCalls[0].input, { city: "Paris" });
assert.ok(g.steps[0].reasoningText?.length > 0, "step 1 carries the reasoning (reasoning_content)");
assert.equal(g.finishReason, "stop");
assert.ok(g.text.includes("21") && g.text.includes("sunny"), "the answer uses the tool's result: " + JSON.stringify(g.text));
assert.ok(!/<think>|<tool_call>|<\|im_end\|>/.test(g.text), "no markup in the text: " + JSON.stringify(g.text));
assert.ok(g.totalUsage.outputTokens > 0 && g.totalUsage.inputTokens > 0, "usage");
assert.ok(g.steps[0].usage.outputTokenDetails?.reasoningTokens > 0, "reasoning tokens: " + JSON.stringify(g.steps[0].usage));
ok("generateText: get_weather({city: 'Paris'}) then " + JSON.stringify(g.text) + ", " +
  g.totalUsage.outputTokens + " output tokens");

// ---- streamText: the same agent loop, streamed
calls.length = 0;
const s = streamText({
  ...common, tools: { get_weather: getWeather }, stopWhen: stepCountIs(3), prompt: "What is the weather in Paris?",
});
const kinds = new Set();
let text = "", reasoning = "", inputDeltas = "", toolCall = null, toolResult = null;
for await (const part of s.fullStream) {
  kinds.add(part.type);
  if (part.type === "error") throw part.error;
  if (part.type === "text-delta") text += part.text;
  if (part.type === "reasoning-delta") reasoning += part.text;
  if (part.type === "tool-input-delta") inputDeltas += part.delta;
  if (part.type === "tool-call") toolCall = part;
  if (part.type === "tool-result") toolResult = part;
}
for (const k of ["reasoning-delta", "tool-input-start", "tool-input-delta", "tool-call", "tool-result", "text-delta", "finish"])
  assert.ok(kinds.has(k), "streamText emitted no " + k + " part (saw " + [...kinds].join(", ") + ")");
assert.equal(toolCall.toolName, "get_weather");
assert.deepEqual(toolCall.input, { city: "Paris" });
assert.deepEqual(JSON.parse(inputDeltas), { city: "Paris" }, "the streamed argument fragments");
assert.deepEqual(toolResult.output, { city: "Paris", temperature: 21, condition: "sunny" });
assert.equal(text, g.text, "streamed answer equals generateText's");
assert.ok(reasoning.length > 0);
assert.equal(await s.finishReason, "stop");
ok("streamText: reasoning, tool input fragments, tool call, tool result, then " + JSON.stringify(text));

// ---- generateObject: structured outputs through response_format json_schema (strict)
const o = await generateObject({
  ...common,
  schema: z.object({ city: z.string(), country: z.string() }),
  prompt: "Give the city Paris and its country as JSON.",
});
assert.equal(typeof o.object.city, "string");
assert.equal(typeof o.object.country, "string");
assert.equal(o.object.city, "Paris", "the object: " + JSON.stringify(o.object));
ok("generateObject: " + JSON.stringify(o.object));

const o2 = await generateObject({
  ...common,
  schema: z.object({ name: z.string(), age: z.number().int() }),
  prompt: "Make a JSON object for Ana, age 31.",
});
assert.ok(Number.isInteger(o2.object.age) && typeof o2.object.name === "string", JSON.stringify(o2.object));
ok("generateObject with an integer: " + JSON.stringify(o2.object));

// ---- chat_template_kwargs through providerOptions: thinking off
const t = await generateText({
  ...common, prompt: "Hello!", providerOptions: { fp8moe: { chat_template_kwargs: { enable_thinking: false } } },
});
assert.ok(!t.reasoningText, "no reasoning with enable_thinking false: " + JSON.stringify(t.reasoningText));
assert.ok(t.text.length > 0 && !t.text.includes("<think>"), JSON.stringify(t.text));
ok("providerOptions chat_template_kwargs {enable_thinking: false}: " + JSON.stringify(t.text));

console.log("aisdk: " + checks + " checks passed");
