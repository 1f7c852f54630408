// Issue #18: OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) through the
// official `openai` SDK: whole answers, responses.stream() with the SDK's own strict event
// accumulator and finalResponse(), tool calls and their outputs, previous_response_id, and a
// precise 400 for every malformed field. The demo checkpoint has random weights, so the server runs
// with its test hook TORCHTPU_TEST_FORCED_OUTPUT (a prompt containing a rule's text gets that
// rule's output, Gemma 4 markup included, as its tokens).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { zodTextFormat } from "openai/helpers/zod";
import { z } from "zod";
import Ajv from "ajv";
import { Q, RULES, SUNNY, startForcedServer } from "./forced_output.mjs";
import { eventually, metric, metrics } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const TOOLS = [
  {
    type: "function",
    name: "get_weather",
    description: "The weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string" } },
      required: ["city"],
    },
    strict: false,
  },
  { type: "function", name: "get_time", description: "The time", parameters: { type: "object" }, strict: false },
];

// Codex 0.171's shapes: a namespace of function tools (its sub-agents), and web_search.
const CLOSE_AGENT = { type: "function", name: "close_agent", description: "Closes a sub-agent.",
  parameters: { type: "object", properties: { id: { type: "string" } }, required: ["id"] } };
const CODEX_TOOLS = [
  ...TOOLS,
  { type: "namespace", name: "multi_agent_v1", description: "Sub-agents.", tools: [CLOSE_AGENT] },
  { type: "web_search", external_web_access: false },
];
// The tools as chat offers them to the model: a namespace's functions named NAMESPACE.NAME.
const CODEX_CHAT_TOOLS = [...TOOLS, { ...CLOSE_AGENT, name: "multi_agent_v1.close_agent" }]
  .map(({ type, ...f }) => ({ type, function: f }));

const ajv = new Ajv();
let server;
let client;

before(async () => {
  server = await startForcedServer([...RULES, {
    prompt_contains: "Close the sub-agent",
    output: `<|tool_call>call:multi_agent_v1.close_agent{id:${Q}a1${Q}}<tool_call|>`,
  }], ["--context", "1024"]);
  client = new OpenAI({ apiKey: "none", baseURL: server.baseURL, maxRetries: 0 });
});

after(async () => {
  if (server) await server.stop();
});

const chatPromptTokens = async (messages, extra = {}) =>
  (await client.chat.completions.create({ model: MODEL, messages, max_tokens: 1, ...extra })).usage
    .prompt_tokens;

describe("whole answers", () => {
  test("a string input is a user turn; output_text, usage and ids in the Responses shape", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello" });
    assert.match(r.id, /^resp_/);
    assert.equal(r.object, "response");
    assert.equal(r.status, "completed");
    assert.equal(r.model, MODEL);
    assert.equal(r.output_text, "Hello there, friend.");
    assert.equal(r.output.length, 1);
    const [message] = r.output;
    assert.equal(message.type, "message");
    assert.equal(message.role, "assistant");
    assert.match(message.id, /^msg_/);
    assert.deepEqual(message.content.map((c) => c.type), ["output_text"]);
    const u = r.usage;
    assert.equal(u.input_tokens, await chatPromptTokens([{ role: "user", content: "Say hello" }]));
    assert.ok(u.output_tokens >= 5);
    assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
    assert.equal(u.input_tokens_details.cached_tokens, 0);
    assert.equal(u.output_tokens_details.reasoning_tokens, 0);
    assert.ok(r.completed_at >= r.created_at);
  });

  test("fields that change nothing here are checked and echoed, as OpenAI echoes them", async () => {
    const fields = { user: "u-1", safety_identifier: "s-1", prompt_cache_key: "k-1" };
    const r = await client.responses.create({ model: MODEL, input: "Say hello", ...fields,
      service_tier: "auto", text: { verbosity: "low" }, reasoning: { summary: "auto" } });
    for (const [key, value] of Object.entries(fields)) assert.equal(r[key], value, key);
    assert.equal(r.service_tier, "default");
    assert.deepEqual(r.text, { format: { type: "text" }, verbosity: "low" });
    assert.equal(r.reasoning.summary, "auto");
    const plain = await client.responses.create({ model: MODEL, input: "Say hello" });
    assert.deepEqual([plain.user, plain.text.verbosity, plain.reasoning.summary], [null, "medium", null]);
  });

  test("built-in tools, which Codex sends with every request, are not offered; a namespace's functions are", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello", tools: CODEX_TOOLS });
    assert.equal(r.output_text, "Hello there, friend.");
    // The prompt is the one with the function tools, the namespace's named NAMESPACE.NAME.
    const offered = await chatPromptTokens([{ role: "user", content: "Say hello" }], { tools: CODEX_CHAT_TOOLS });
    assert.equal(r.usage.input_tokens, offered);
  });

  test("a call to a namespace's function names its namespace, and goes back as the model saw it", async () => {
    const first = await client.responses.create({ model: MODEL, input: "Close the sub-agent", tools: CODEX_TOOLS });
    const [call] = first.output;
    assert.equal(call.type, "function_call");
    assert.equal(call.name, "close_agent");
    assert.equal(call.namespace, "multi_agent_v1");
    assert.deepEqual(JSON.parse(call.arguments), { id: "a1" });
    // Streamed, the item and the arguments' done event say the same.
    const events = [];
    const stream = client.responses.stream({ model: MODEL, input: "Close the sub-agent", tools: CODEX_TOOLS });
    for await (const event of stream) events.push(event);
    const done = events.find((e) => e.type === "response.output_item.done").item;
    assert.deepEqual([done.name, done.namespace], ["close_agent", "multi_agent_v1"]);
    assert.equal(events.find((e) => e.type === "response.function_call_arguments.done").name, "close_agent");
    // Sent back with its output, the call is rendered under the name the model called.
    const second = await client.responses.create({ model: MODEL, tools: CODEX_TOOLS, input: [
      { role: "user", content: "Close the sub-agent" },
      call,
      { type: "function_call_output", call_id: call.call_id, output: "closed" },
    ] });
    const chatTurns = [
      { role: "user", content: "Close the sub-agent" },
      { role: "assistant", content: null, tool_calls: [{ id: call.call_id, type: "function",
        function: { name: "multi_agent_v1.close_agent", arguments: call.arguments } }] },
      { role: "tool", tool_call_id: call.call_id, content: "closed" },
    ];
    assert.equal(second.usage.input_tokens, await chatPromptTokens(chatTurns, { tools: CODEX_CHAT_TOOLS }));
  });

  test("instructions are the system turn; message items with text parts are their roles", async () => {
    const r = await client.responses.create({
      model: MODEL,
      instructions: "Be brief.",
      input: [
        { role: "user", content: "Hi" },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Hello." }] },
        { role: "user", content: [{ type: "input_text", text: "Say hello" }] },
      ],
    });
    assert.equal(r.instructions, "Be brief.");
    assert.equal(r.usage.input_tokens, await chatPromptTokens([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello." },
      { role: "user", content: "Say hello" },
    ]));
  });

  test("reasoning.effort turns thinking on: a reasoning item, then the message", async () => {
    const plain = await client.responses.create({ model: MODEL, input: "What is 2+2?" });
    const r = await client.responses.create({ model: MODEL, input: "What is 2+2?", reasoning: { effort: "low" } });
    assert.ok(r.usage.input_tokens > plain.usage.input_tokens, "the template's <|think|> switch");
    assert.deepEqual(r.output.map((o) => o.type), ["reasoning", "message"]);
    assert.match(r.output[0].id, /^rs_/);
    assert.deepEqual(r.output[0].content, [{ type: "reasoning_text", text: "Two and two." }]);
    assert.equal(r.output_text, "It is 4.");
    assert.equal(r.reasoning.effort, "low");
    assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
    const off = await client.responses.create({ model: MODEL, input: "What is 2+2?", reasoning: { effort: "none" } });
    assert.equal(off.usage.input_tokens, plain.usage.input_tokens);
  });

  test("a function call, then its output in the next input: the round trip", async () => {
    const first = await client.responses.create({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    assert.equal(first.status, "completed");
    assert.equal(first.output.length, 1);
    const call = first.output[0];
    assert.equal(call.type, "function_call");
    assert.match(call.id, /^fc_/);
    assert.match(call.call_id, /^call_/);
    assert.equal(call.name, "get_weather");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Paris", unit: "celsius" });
    assert.equal(first.output_text, "");

    const second = await client.responses.create({
      model: MODEL,
      tools: TOOLS,
      input: [
        { role: "user", content: "Weather in Paris?" },
        call,
        { type: "function_call_output", call_id: call.call_id, output: "SUNNY-21C" },
      ],
    });
    assert.equal(second.output_text, SUNNY);
  });

  test("previous_response_id continues a stored response; GET returns it", async () => {
    const first = await client.responses.create({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    assert.equal(first.store, true);
    const call = first.output[0];
    const second = await client.responses.create({
      model: MODEL,
      tools: TOOLS,
      previous_response_id: first.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "SUNNY-21C" }],
    });
    assert.equal(second.previous_response_id, first.id);
    assert.equal(second.output_text, SUNNY);
    // The whole conversation was rendered: the same prompt as sending every item again.
    const resent = await client.responses.create({
      model: MODEL,
      tools: TOOLS,
      store: false,
      input: [
        { role: "user", content: "Weather in Paris?" },
        call,
        { type: "function_call_output", call_id: call.call_id, output: "SUNNY-21C" },
      ],
    });
    assert.equal(second.usage.input_tokens, resent.usage.input_tokens);
    assert.deepEqual(await client.responses.retrieve(first.id), first);
  });

  test("store: false keeps nothing: GET and previous_response_id are 404s naming it", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello", store: false });
    assert.equal(r.store, false);
    await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(
      client.responses.create({ model: MODEL, input: "Say hello", previous_response_id: r.id }),
      (e) =>
        e instanceof OpenAI.NotFoundError &&
        e.param === "previous_response_id" &&
        e.message.includes(r.id),
    );
  });

  test("cancel: a stored response was no background one (400), an unknown one is a 404", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello" });
    await assert.rejects(client.responses.cancel(r.id),
      (e) => e instanceof OpenAI.BadRequestError && /only background responses can be cancelled/.test(e.message));
    assert.equal((await client.responses.retrieve(r.id)).status, "completed");
    await assert.rejects(client.responses.cancel("resp_unknown"), (e) => e instanceof OpenAI.NotFoundError);
  });

  test("DELETE forgets a stored response; other methods and deeper paths are refused", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello" });
    await client.responses.delete(r.id);
    await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(client.responses.delete(r.id), (e) => e instanceof OpenAI.NotFoundError);
    const post = await fetch(`${server.baseURL}/responses/${r.id}`, { method: "POST", body: "{}" });
    assert.equal(post.status, 405);
    assert.equal(post.headers.get("allow"), "GET, DELETE");
    await assert.rejects(client.responses.inputItems.list(r.id),
      (e) => e instanceof OpenAI.NotFoundError);
    const deeper = await fetch(`${server.baseURL}/responses/${r.id}/steps`, { method: "POST" });
    assert.equal(deeper.status, 404);
    assert.match((await deeper.json()).error.message, /unknown route/);
    // A path that is no response id is no route either: not a 405 that suggests GET.
    const compact = await fetch(`${server.baseURL}/responses/compact`, { method: "POST", body: "{}" });
    assert.equal(compact.status, 404);
  });

  test("input_items lists the chain's items with ids, newest first, a page at a time", async () => {
    const first = await client.responses.create({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    const call = first.output[0];
    const second = await client.responses.create({
      model: MODEL, tools: TOOLS, previous_response_id: first.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "SUNNY-21C" }],
    });
    // The first input, the first output (the call), the second input.
    const all = await client.responses.inputItems.list(second.id, { order: "asc" });
    assert.deepEqual(all.data.map((i) => i.type), ["message", "function_call", "function_call_output"]);
    assert.deepEqual(all.data[0].content, [{ type: "input_text", text: "Weather in Paris?" }]);
    assert.equal(all.data[0].role, "user");
    assert.deepEqual(all.data[1], call);
    assert.equal(all.data[2].call_id, call.call_id);
    assert.equal(new Set(all.data.map((i) => i.id)).size, 3);
    assert.equal(all.has_more, false);
    // The default order is newest first; pages of one follow `after` to the end.
    const ids = [];
    for await (const item of client.responses.inputItems.list(second.id, { limit: 1 })) ids.push(item.id);
    assert.deepEqual(ids, all.data.map((i) => i.id).reverse());
    const page = await (await fetch(`${server.baseURL}/responses/${second.id}/input_items?limit=2`)).json();
    assert.deepEqual([page.object, page.data.length, page.has_more, page.first_id, page.last_id],
      ["list", 2, true, ids[0], ids[1]]);
    // The first response's items are its own input only.
    const own = await client.responses.inputItems.list(first.id);
    assert.deepEqual(own.data.map((i) => i.type), ["message"]);
    for (const [query, param] of [["limit=0", "limit"], ["limit=101", "limit"], ["order=up", "order"],
      ["after=nope", "after"], ["before=x", "before"]]) {
      const r = await fetch(`${server.baseURL}/responses/${second.id}/input_items?${query}`);
      assert.equal(r.status, 400, query);
      assert.equal((await r.json()).error.param, param, query);
    }
  });

  test("metadata at OpenAI's bounds, counted in characters, is kept and echoed", async () => {
    const metadata = Object.fromEntries(Array.from({ length: 16 },
      (_, i) => [`${i}`.padEnd(64, "é"), "é".repeat(512)]));
    const r = await client.responses.create({ model: MODEL, input: "Say hello", metadata });
    assert.deepEqual(r.metadata, metadata);
    assert.deepEqual((await client.responses.retrieve(r.id)).metadata, metadata);
  });

  test("input_tokens counts the tokens a response to the same request reads", async () => {
    const request = { model: MODEL, input: "Weather in Paris?", tools: TOOLS, instructions: "Be brief." };
    const counted = await client.responses.inputTokens.count(request);
    assert.equal(counted.object, "response.input_tokens");
    const r = await client.responses.create({ ...request, store: false });
    assert.equal(counted.input_tokens, r.usage.input_tokens);
  });

  test("truncation auto drops the oldest turns, whole, until max_output_tokens fits", async () => {
    const filler = (label) => `${label}: ${"apple ".repeat(340)}`;
    const turns = [];
    for (const label of ["First", "Second", "Third"]) {
      turns.push({ role: "user", content: filler(label) }, { role: "assistant", content: "Noted." });
    }
    turns.push({ role: "user", content: "Say hello" });
    const request = { model: MODEL, instructions: "Be brief.", input: turns };
    // The prompt from each user turn on, counted as sent (input_tokens counts past the context).
    const starts = [0, 2, 4, 6];
    const counts = await Promise.all(starts.map(async (from) =>
      (await client.responses.inputTokens.count({ ...request, input: turns.slice(from) })).input_tokens));
    const context = 1024;
    await assert.rejects(client.responses.create(request),
      (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded");
    const kept = [];
    for (const max of [undefined, 400, 990]) {
      const r = await client.responses.create({ ...request, truncation: "auto", max_output_tokens: max });
      assert.equal(r.truncation, "auto");
      assert.equal(r.output_text, "Hello there, friend.");
      const from = starts.findIndex((_, i) => counts[i] + (max ?? 1) <= context);
      assert.equal(r.usage.input_tokens, counts[from], `max_output_tokens ${max}`);
      const counted = await client.responses.inputTokens.count({ ...request, truncation: "auto", max_output_tokens: max });
      assert.equal(counted.input_tokens, r.usage.input_tokens);
      kept.push(from);
    }
    // The lengths make each case cut at another turn.
    assert.deepEqual(kept, [1, 2, 3]);
  });

  test("max_output_tokens cuts the answer: status incomplete, reason max_output_tokens", async () => {
    const r = await client.responses.create({ model: MODEL, input: "Say hello", max_output_tokens: 2 });
    assert.equal(r.status, "incomplete");
    assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(r.usage.output_tokens, 2);
    assert.equal(r.max_output_tokens, 2);
    // The message it cut is incomplete too; one that ended by itself is completed.
    assert.deepEqual(r.output.map((i) => [i.type, i.status]), [["message", "incomplete"]]);
    const whole = await client.responses.create({ model: MODEL, input: "Say hello" });
    assert.equal(whole.status, "completed");
    assert.equal(whole.output.at(-1).status, "completed");
  });

  test("parallel_tool_calls false keeps the first call only", async () => {
    const both = await client.responses.create({ model: MODEL, input: "Two calls", tools: TOOLS });
    assert.deepEqual(both.output.map((o) => o.name), ["get_time", "get_weather"]);
    const one = await client.responses.create({
      model: MODEL, input: "Two calls", tools: TOOLS, parallel_tool_calls: false,
    });
    assert.deepEqual(one.output.map((o) => o.name), ["get_time"]);
    assert.equal(one.parallel_tool_calls, false);
  });

  test("include reasoning.encrypted_content: stateless clients send the thought back", async () => {
    const r = await client.responses.create({
      model: MODEL, input: "What is 2+2?", reasoning: { effort: "low" }, store: false,
      include: ["reasoning.encrypted_content"],
    });
    assert.equal(r.output[0].encrypted_content, "Two and two.");
    // A thought inside the current turn (after the last user message) is rendered: sent back as
    // encrypted_content alone, it makes the prompt longer than the same items without it.
    const turn = (reasoning) => client.responses.create({
      model: MODEL, tools: TOOLS, store: false,
      input: [
        { role: "user", content: "Weather in Paris?" },
        ...reasoning,
        { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { type: "function_call_output", call_id: "call_1", output: "SUNNY-21C" },
      ],
    });
    const sealed = { type: "reasoning", id: "rs_1", summary: [], encrypted_content: "Checking the weather." };
    const [withThought, without] = [await turn([sealed]), await turn([])];
    assert.ok(withThought.usage.input_tokens > without.usage.input_tokens);
  });

  test("include message.output_text.logprobs: the text's tokens, as chat gives them", async () => {
    const chatLogprobs = async (fields) => (await client.chat.completions.create({
      model: MODEL, logprobs: true, top_logprobs: 2, ...fields,
    })).choices[0].logprobs.content;
    const plain = await client.responses.create({
      model: MODEL, input: "Say hello", store: false, include: ["message.output_text.logprobs"],
      top_logprobs: 2,
    });
    const entries = plain.output[0].content[0].logprobs;
    assert.deepEqual(entries, await chatLogprobs({ messages: [{ role: "user", content: "Say hello" }] }));
    assert.equal(entries.map((e) => e.token).join(""), "Hello there, friend.");
    assert.ok(entries.every((e) => e.top_logprobs.length === 2));
    // After a thought, the text's entries are the last of chat's, none of the thought's.
    const stream = client.responses.stream({
      model: MODEL, input: "What is 2+2?", reasoning: { effort: "low" }, store: false,
      include: ["message.output_text.logprobs"],
    });
    const streamed = [];
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") streamed.push(...event.logprobs);
    }
    const answer = (await stream.finalResponse()).output[1].content[0].logprobs;
    assert.deepEqual(streamed, answer);
    const all = await chatLogprobs({ messages: [{ role: "user", content: "What is 2+2?" }],
      reasoning_effort: "low", top_logprobs: 0 });
    assert.deepEqual(answer, all.slice(all.length - answer.length));
    const text = answer.map((e) => e.token).join("");
    assert.ok(text.endsWith("It is 4.") && !text.includes("Two"), text);
    // Asked for nothing, nothing comes.
    const none = await client.responses.create({ model: MODEL, input: "Say hello", store: false });
    assert.deepEqual(none.output[0].content[0].logprobs, []);
  });

  test("tool_choice required and a named function are honoured", async () => {
    const required = await client.responses.create({
      model: MODEL, input: "Weather anywhere?", tools: TOOLS, tool_choice: "required",
    });
    assert.equal(required.output[0].type, "function_call");
    assert.equal(required.output[0].name, "get_weather");
    const named = await client.responses.create({
      model: MODEL, input: "Weather in Oslo?", tools: TOOLS,
      tool_choice: { type: "function", name: "get_weather" },
    });
    assert.deepEqual(JSON.parse(named.output[0].arguments), { city: "Oslo" });
  });

  test("tool_choice allowed_tools keeps every function in the prompt and calls only its own",
    async () => {
      const answer = (fields) => client.responses.create({
        model: MODEL, input: "Weather anywhere?", store: false, ...fields });
      const allowed = (mode, tools) => ({
        tools: [...TOOLS, { type: "web_search" }], tool_choice: { type: "allowed_tools", mode, tools } });
      const getTime = [{ type: "function", name: "get_time" }];
      const items = (r) => r.output.map(({ id, call_id, ...rest }) => rest);
      for (const mode of ["required", "auto"]) {
        const [x, y] = await Promise.all([answer(allowed(mode, getTime)),
          answer({ tools: TOOLS, tool_choice: mode })]);
        assert.equal(x.usage.input_tokens, y.usage.input_tokens, mode);  // every function's prompt
        if (mode === "auto") continue;
        // The forced output's call to get_weather, not allowed, comes back as text.
        assert.deepEqual(items(x).map((i) => i.type), ["message"]);
        assert.match(x.output[0].content[0].text, /get_weather\{city:/);
        assert.equal(items(y)[0].name, "get_weather");
      }
      // Only a built-in tool allowed: no function may be called.
      const [x, y] = await Promise.all([answer(allowed("auto", [{ type: "web_search" }])),
        answer({ tools: TOOLS, tool_choice: "none" })]);
      assert.equal(x.usage.input_tokens, y.usage.input_tokens);
      assert.deepEqual(items(x), items(y));
      // A namespace's function, named as a function_call item names it.
      const namespace = CODEX_TOOLS[2];
      const closeAgent = await client.responses.create({
        model: MODEL, input: "Close the sub-agent", tools: CODEX_TOOLS, tool_choice: {
          type: "allowed_tools", mode: "auto",
          tools: [{ type: "function", name: "close_agent", namespace: namespace.name }] } });
      assert.deepEqual(items(closeAgent).map(({ type, name, namespace }) => ({ type, name, namespace })),
        [{ type: "function_call", name: "close_agent", namespace: namespace.name }]);
    });
});

describe("structured output", () => {
  // Bounded values only, so that the random-weight model cannot write past max_output_tokens.
  const Verdict = z.object({ kind: z.enum(["cat", "dog", "bird"]), ok: z.boolean() });

  test("text.format json_schema is enforced: responses.parse() gets valid output_parsed", async () => {
    for (let i = 0; i < 4; i++) {
      const r = await client.responses.parse({
        model: MODEL, input: `Pick an animal, try ${i}`, temperature: 1, max_output_tokens: 100,
        text: { format: zodTextFormat(Verdict, "verdict") },
      });
      assert.equal(r.status, "completed");
      assert.deepEqual(Verdict.parse(JSON.parse(r.output_text)), r.output_parsed);
      assert.equal(r.text.format.type, "json_schema");
      assert.equal(r.text.format.name, "verdict");
    }
  });

  test("a forced function call on random weights names a declared tool with valid arguments", async () => {
    const tools = [
      {
        type: "function", name: "set_mode", strict: true,
        parameters: {
          type: "object",
          properties: { mode: { enum: ["fast", "slow"] }, loud: { type: "boolean" } },
          required: ["mode", "loud"],
          additionalProperties: false,
        },
      },
      { type: "function", name: "stop", strict: true, parameters: { type: "object", properties: {}, additionalProperties: false } },
    ];
    const validate = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.parameters)]));
    for (let i = 0; i < 4; i++) {
      const r = await client.responses.create({
        model: MODEL, input: `Choose, round ${i}`, tools, tool_choice: "required", temperature: 1, max_output_tokens: 100,
        // Random weights would go on calling until max_output_tokens: one call, then the end.
        parallel_tool_calls: false,
      });
      assert.equal(r.status, "completed");
      const calls = r.output.filter((o) => o.type === "function_call");
      assert.equal(calls.length, 1);
      for (const call of calls) {
        assert.ok(validate[call.name], `declared: ${call.name}`);
        assert.ok(validate[call.name](JSON.parse(call.arguments)), call.arguments);
      }
    }
  });

  test("streamed, the deltas make the same valid JSON", async () => {
    const stream = client.responses.stream({
      model: MODEL, input: "Pick an animal", max_output_tokens: 100,
      text: { format: zodTextFormat(Verdict, "verdict") },
    });
    let text = "";
    for await (const e of stream) if (e.type === "response.output_text.delta") text += e.delta;
    const final = await stream.finalResponse();
    assert.equal(final.output_text, text);
    Verdict.parse(JSON.parse(text));
  });
});

describe("streaming", () => {
  const kinds = (events) => events.map((e) => e.type);

  test("reasoning then text: the full event sequence, numbered, and finalResponse()", async () => {
    const stream = client.responses.stream({ model: MODEL, input: "What is 2+2?", reasoning: { effort: "high" } });
    const events = [];
    for await (const event of stream) events.push(event);
    const final = await stream.finalResponse();
    const squeezed = kinds(events).filter((t, i, all) => !(t.endsWith(".delta") && all[i - 1] === t));
    assert.deepEqual(squeezed, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
    const reasoning = events.filter((e) => e.type === "response.reasoning_text.delta").map((e) => e.delta);
    assert.equal(reasoning.join(""), "Two and two.");
    const text = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta);
    assert.ok(text.length > 1, "the text arrives in pieces");
    assert.equal(text.join(""), "It is 4.");
    assert.equal(final.output_text, "It is 4.");
    assert.deepEqual(final.output.map((o) => o.type), ["reasoning", "message"]);
    assert.equal(final.status, "completed");
    assert.ok(final.usage.output_tokens > 5);
    // The completed response is the one GET returns (less what the SDK's parse helper adds).
    const unparsed = JSON.parse(
      JSON.stringify(final, (key, value) => (["parsed", "output_parsed"].includes(key) ? undefined : value)),
    );
    assert.deepEqual(await client.responses.retrieve(final.id), unparsed);
  });

  test("a function call streams its arguments; the final response holds the call", async () => {
    const stream = client.responses.stream({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    const events = [];
    for await (const event of stream) events.push(event);
    assert.deepEqual(kinds(events), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const final = await stream.finalResponse();
    const [call] = final.output;
    assert.equal(call.type, "function_call");
    assert.equal(call.name, "get_weather");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Paris", unit: "celsius" });
    const done = events.find((e) => e.type === "response.function_call_arguments.done");
    assert.equal(done.arguments, call.arguments);
    assert.equal(done.item_id, call.id);
  });

  test("a stream cut by max_output_tokens ends with response.incomplete", async () => {
    const stream = client.responses.stream({ model: MODEL, input: "Say hello", max_output_tokens: 2 });
    const events = [];
    for await (const event of stream) events.push(event);
    assert.equal(events.at(-1).type, "response.incomplete");
    const final = await stream.finalResponse();
    assert.equal(final.status, "incomplete");
    assert.deepEqual(final.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(final.usage.output_tokens, 2);
    const done = events.filter((e) => e.type === "response.output_item.done");
    assert.deepEqual(done.map((e) => e.item.status), ["incomplete"]);
  });

  test("create({stream: true}): every SSE event's name is its data's type", async () => {
    const res = await fetch(`${server.baseURL}/responses`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, input: "Say hello", stream: true }),
    });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const blocks = (await res.text()).split("\n\n").filter(Boolean);
    assert.ok(blocks.length > 8);
    for (const block of blocks) {
      const [name, data] = block.split("\n");
      assert.equal(name.slice("event: ".length), JSON.parse(data.slice("data: ".length)).type);
    }
    assert.match(blocks.at(-1), /^event: response.completed\n/);
  });
});

describe("cancellation", () => {
  test("a client that leaves a stream cancels its decode; the next request is served", async () => {
    const cancelled = async () => metric(await metrics(server.url), "torchtpu_requests_cancelled_total");
    const before = await cancelled();
    const controller = new AbortController();
    const stream = await client.responses.create(
      { model: MODEL, input: "Tell a long story", stream: true },
      { signal: controller.signal },
    );
    let deltas = 0;
    let completed = false;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta" && ++deltas === 3) {
        controller.abort();
        break;
      }
      completed ||= event.type === "response.completed";
    }
    assert.equal(deltas, 3);
    assert.equal(completed, false);
    await eventually(async () => (await cancelled()) === before + 1, "the cancel counter to move");
    const next = await client.responses.create({ model: MODEL, input: "Say hello" });
    assert.equal(next.output_text, "Hello there, friend.");
  });
});

describe("errors", () => {
  const bad = [
    [{}, "input"],
    [{ input: 5 }, "input"],
    [{ input: [] }, "input"],
    [{ input: [{ role: "robot", content: "x" }] }, "input[0].role"],
    [{ input: [{ role: "user" }] }, "input[0].content"],
    [{ input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x/y.png" }] }] },
      "input[0].content[0].image_url"],
    [{ input: [{ type: "function_call_output", call_id: "call_nope", output: "x" }] }, "input[0].call_id"],
    [{ input: [{ type: "function_call", call_id: "c", name: "f", arguments: "{bad" }] }, "input[0].arguments"],
    [{ input: [{ type: "function_call", call_id: "c", arguments: "{}" }] }, "input[0].name"],
    [{ input: [{ type: "function_call", call_id: "c", name: "f", namespace: 3, arguments: "{}" }] }, "input[0].namespace"],
    [{ input: "hi", tools: [{ type: "namespace", tools: [] }] }, "tools[0].name"],
    [{ input: "hi", tools: [{ type: "namespace", name: "a.b", tools: [] }] }, "tools[0].name"],
    [{ input: "hi", tools: [{ type: "namespace", name: "ns" }] }, "tools[0].tools"],
    [{ input: "hi", tools: [{ type: "namespace", name: "ns", tools: {} }] }, "tools[0].tools"],
    [{ input: "hi", tools: [{ type: "namespace", name: "ns", tools: [{ type: "function" }] }] }, "tools[0].tools[0].name"],
    [{ input: [{ type: "web_search_call", id: "ws_1" }] }, "input[0].type"],
    [{ input: "hi", instructions: 5 }, "instructions"],
    [{ input: "hi", tools: [{ name: "f" }] }, "tools[0].type"],
    [{ input: "hi", tools: [{ type: "web_search" }], tool_choice: { type: "web_search" } }, "tool_choice.type"],
    [{ input: "hi", tools: [{ type: "function" }] }, "tools[0].name"],
    [{ input: "hi", tools: TOOLS, tool_choice: { type: "function", name: "nope" } }, "tool_choice.name"],
    [{ input: "hi", tools: TOOLS, tool_choice: "sometimes" }, "tool_choice"],
    [{ input: "hi", reasoning: { effort: "extreme" } }, "reasoning.effort"],
    [{ input: "hi", max_output_tokens: 0 }, "max_output_tokens"],
    [{ input: "hi", temperature: 3 }, "temperature"],
    [{ input: "hi", top_p: 2 }, "top_p"],
    [{ input: "hi", store: "yes" }, "store"],
    [{ input: "hi", text: { format: { type: "xml" } } }, "text.format.type"],
    [{ input: "hi", text: { format: { type: "json_schema", name: "x" } } }, "text.format.schema"],
    [{ input: "hi", text: { format: { type: "json_schema", name: "x", schema: 5 } } }, "text.format.schema"],
    [{ input: "hi", text: { format: { type: "json_schema", name: 5, schema: {} } } }, "text.format.name"],
    [{ input: "hi", text: { format: { type: "json_schema", name: "a b", schema: {} } } }, "text.format.name"],
    // OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, string values of 512.
    [{ input: "hi", metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"])) },
      "metadata"],
    [{ input: "hi", metadata: { ["é".repeat(65)]: "v" } }, "metadata"],
    [{ input: "hi", metadata: { k: 5 } }, "metadata.k"],
    [{ input: "hi", metadata: { k: "é".repeat(513) } }, "metadata.k"],
    [{ input: "hi", text: { verbosity: "bogus" } }, "text.verbosity"],
    [{ input: "hi", reasoning: { summary: "long" } }, "reasoning.summary"],
    [{ input: "hi", service_tier: "gold" }, "service_tier"],
    [{ input: "hi", user: 5 }, "user"],
    [{ input: "hi", include: ["file_search_call.results"] }, "include[0]"],
    [{ input: "hi", top_logprobs: 21 }, "top_logprobs"],
    [{ input: "hi", truncation: "middle" }, "truncation"],
    [{ input: "hi", tools: TOOLS, tool_choice: { type: "allowed_tools", mode: "sometimes", tools: [] } },
      "tool_choice.mode"],
    [{ input: "hi", tools: TOOLS, tool_choice: { type: "allowed_tools", mode: "auto", tools: [] } },
      "tool_choice.tools"],
    [{ input: "hi", tools: TOOLS, tool_choice: { type: "allowed_tools", mode: "auto",
      tools: [{ type: "function", name: "nope" }] } }, "tool_choice.tools[0].name"],
    [{ input: "hi", tools: [...TOOLS, { type: "web_search" }], tool_choice: { type: "allowed_tools",
      mode: "required", tools: [{ type: "web_search" }] } }, "tool_choice.tools"],
    [{ input: "hi", background: true }, "background"],
    [{ input: "hi", previous_response_id: 7 }, "previous_response_id"],
    [{ input: "hi", id_slot: 99 }, "id_slot"],
    [{ input: "hi", cache_salt: "" }, "cache_salt"],
    [{ input: "hi", lora: { id: 0 } }, "lora"],
  ];
  for (const [fields, param] of bad) {
    test(`${JSON.stringify(fields)} is a 400 naming ${param}`, async () => {
      await assert.rejects(
        client.responses.create({ model: MODEL, ...fields }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === param && e.message.includes(param),
      );
    });
  }

  test("an unknown previous_response_id or id is a 404", async () => {
    await assert.rejects(
      client.responses.create({ model: MODEL, input: "hi", previous_response_id: "resp_unknown" }),
      (e) => e instanceof OpenAI.NotFoundError && e.param === "previous_response_id",
    );
    await assert.rejects(client.responses.retrieve("resp_unknown"), (e) => e instanceof OpenAI.NotFoundError);
  });

  test("another model's name is a 404 naming the model", async () => {
    await assert.rejects(
      client.responses.create({ model: "gpt-5", input: "hi" }),
      (e) => e instanceof OpenAI.NotFoundError && e.param === "model",
    );
  });
});
