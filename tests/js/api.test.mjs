// Issue #11 through the official `openai` SDK: tool calls (round trip, streamed and not, with
// tool_choice), reasoning_content, logprobs, malformed calls, sampling validation. The demo
// checkpoint has random weights, so the server runs with its test hook TORCHTPU_TEST_FORCED_OUTPUT:
// a prompt containing a rule's text gets that rule's output (Gemma 4 markup) as its tokens, counted
// and given logprobs like sampled ones. Prompts matching no rule get the model's own greedy output.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { spawn } from "node:child_process";
import { Q, RULES as SHARED_RULES, startForcedServer } from "./forced_output.mjs";
import {
  cacheDir, cliPath, makeAssistantCheckpoint, metric, metrics, startServer,
} from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const RULES = [
  ...SHARED_RULES,
  // After a tool response with thinking on, the prompt has opened the thinking channel.
  { prompt_contains: "CLOUDY-9C", output: "Cold there.\n<channel|>It is 9 degrees in Oslo." },
  { prompt_contains: "Broken call", output: "Let me check. <|tool_call>call:get_weather{city Paris}<tool_call|>" },
  { prompt_contains: "Cut call", output: `<|tool_call>call:get_weather{city:${Q}Par` },
  // 𓀀 and 𝔘 are four byte tokens each in Gemma's tokenizer (no piece holds them); ñ is a piece.
  { prompt_contains: "Unicode please", output: "Añ 𓀀B𝔘 C" },
];
const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, unit: { type: "string" } },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: { name: "get_time", description: "The time", parameters: { type: "object" } },
  },
];

let server;
let client;

before(async () => {
  server = await startForcedServer(RULES, ["--context", "1024"]);
  client = new OpenAI({ apiKey: "none", baseURL: server.baseURL, maxRetries: 0 });
});

after(async () => {
  if (server) await server.stop();
});

const ask = (content) => [{ role: "user", content }];

// A conversation that ends with the result of one get_weather call.
function afterToolResult(question, city, result) {
  const call = { id: `call_${city}`, type: "function",
    function: { name: "get_weather", arguments: JSON.stringify({ city }) } };
  return [...ask(question), { role: "assistant", content: null, tool_calls: [call] },
    { role: "tool", tool_call_id: call.id, content: result }];
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// Accumulates streamed chat deltas the way OpenAI's own clients do.
function accumulate(chunks) {
  const out = { content: "", reasoning: "", calls: [], finish: null, warnings: [], logprobs: [] };
  for (const c of chunks) {
    for (const choice of c.choices) {
      const d = choice.delta ?? {};
      out.content += d.content ?? "";
      out.reasoning += d.reasoning_content ?? "";
      for (const t of d.tool_calls ?? []) {
        const call = (out.calls[t.index] ??= { id: "", type: "", name: "", arguments: "" });
        call.id += t.id ?? "";
        call.type += t.type ?? "";
        call.name += t.function?.name ?? "";
        call.arguments += t.function?.arguments ?? "";
      }
      if (choice.warning) out.warnings.push(choice.warning);
      if (choice.logprobs?.content) out.logprobs.push(...choice.logprobs.content);
      if (choice.finish_reason) out.finish = choice.finish_reason;
    }
  }
  return out;
}

describe("tool calls", () => {
  const toolResult = (call) => [
    ...ask("Weather in Paris?"),
    { role: "assistant", content: null, tool_calls: [call] },
    { role: "tool", tool_call_id: call.id, content: "SUNNY-21C" },
  ];

  test("a stop sequence never matches inside a marker or a tool call", async () => {
    // "call" is in <|tool_call> and in call:get_weather, "Paris" in the call's arguments: none of
    // them ends the answer, which stays the whole call, streamed or not.
    for (const stop of ["call", "Paris", "tool_"]) {
      for (const stream of [false, true]) {
        const body = { model: MODEL, messages: ask("Weather in Paris?"), tools: TOOLS, stop };
        let finish;
        let content = "";
        const calls = [];
        if (stream) {
          for await (const chunk of await client.chat.completions.create({ ...body, stream })) {
            const choice = chunk.choices[0];
            content += choice?.delta?.content ?? "";
            for (const c of choice?.delta?.tool_calls ?? []) if (c.function?.name) calls.push(c);
            finish = choice?.finish_reason ?? finish;
          }
        } else {
          const { choices: [choice] } = await client.chat.completions.create(body);
          content = choice.message.content ?? "";
          calls.push(...(choice.message.tool_calls ?? []));
          finish = choice.finish_reason;
        }
        const where = `stop ${stop}, stream ${stream}`;
        assert.equal(content, "", where);
        assert.deepEqual(calls.map((c) => c.function.name), ["get_weather"], where);
        assert.equal(finish, "tool_calls", where);
      }
    }
  });

  test("round trip, whole answers: call parsed, tool result rendered, final answer", async () => {
    const first = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather in Paris?"), tools: TOOLS,
    });
    const choice = first.choices[0];
    assert.equal(choice.finish_reason, "tool_calls");
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.match(call.id, /^call_/);
    assert.equal(call.type, "function");
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris", unit: "celsius" });
    assert.ok(first.usage.completion_tokens > 5);

    const second = await client.chat.completions.create({
      model: MODEL, messages: toolResult(call), tools: TOOLS,
    });
    assert.equal(second.choices[0].finish_reason, "stop");
    assert.equal(second.choices[0].message.content, "It is sunny in Paris, 21 degrees.");
    assert.equal(second.choices[0].message.tool_calls, undefined);
  });

  test("parallel_tool_calls false keeps the first call only, whole or streamed", async () => {
    const request = { model: MODEL, messages: ask("Two calls"), tools: TOOLS };
    const both = await client.chat.completions.create(request);
    assert.deepEqual(both.choices[0].message.tool_calls.map((c) => c.function.name),
      ["get_time", "get_weather"]);
    const one = await client.chat.completions.create({ ...request, parallel_tool_calls: false });
    assert.deepEqual(one.choices[0].message.tool_calls.map((c) => c.function.name), ["get_time"]);
    assert.equal(one.choices[0].finish_reason, "tool_calls");
    assert.equal(one.choices[0].message.content, null);
    const streamed = accumulate(await collect(await client.chat.completions.create({
      ...request, parallel_tool_calls: false, stream: true,
    })));
    assert.deepEqual(streamed.calls.map((c) => c.name), ["get_time"]);
    assert.equal(streamed.finish, "tool_calls");
  });

  test("round trip, streamed: tool-call deltas, finish tool_calls, no markup in content", async () => {
    const first = accumulate(await collect(await client.chat.completions.create({
      model: MODEL, messages: ask("Weather in Paris?"), tools: TOOLS, stream: true,
    })));
    assert.equal(first.finish, "tool_calls");
    assert.equal(first.content, "");
    assert.equal(first.calls.length, 1);
    assert.match(first.calls[0].id, /^call_/);
    assert.equal(first.calls[0].type, "function");
    assert.equal(first.calls[0].name, "get_weather");
    assert.deepEqual(JSON.parse(first.calls[0].arguments), { city: "Paris", unit: "celsius" });

    const call = {
      id: first.calls[0].id, type: "function",
      function: { name: first.calls[0].name, arguments: first.calls[0].arguments },
    };
    const second = accumulate(await collect(await client.chat.completions.create({
      model: MODEL, messages: toolResult(call), tools: TOOLS, stream: true,
    })));
    assert.equal(second.finish, "stop");
    assert.equal(second.content, "It is sunny in Paris, 21 degrees.");
  });

  test("tool_choice required and a named function are honoured by opening the call", async () => {
    const required = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather anywhere?"), tools: TOOLS, tool_choice: "required",
    });
    assert.equal(required.choices[0].finish_reason, "tool_calls");
    assert.equal(required.choices[0].message.tool_calls[0].function.name, "get_weather");
    const named = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather in Oslo?"), tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    assert.equal(named.choices[0].finish_reason, "tool_calls");
    const call = named.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: "Oslo" });
  });

  test("tool_choice none: tools are not rendered and a call comes back as text", async () => {
    const withTools = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather in Paris?"), tools: TOOLS,
    });
    const none = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather in Paris?"), tools: TOOLS, tool_choice: "none",
    });
    assert.ok(none.usage.prompt_tokens < withTools.usage.prompt_tokens);
    assert.equal(none.choices[0].finish_reason, "stop");
    assert.equal(none.choices[0].message.tool_calls, undefined);
    assert.match(none.choices[0].message.content, /get_weather/);
    assert.equal(typeof none.choices[0].warning, "string");
  });

  test("a call to a function the request does not declare comes back as text", async () => {
    // The forced output calls get_weather: with no tools, and with only get_time declared.
    for (const tools of [undefined, TOOLS.filter((t) => t.function.name !== "get_weather")]) {
      for (const stream of [false, true]) {
        const request = { model: MODEL, messages: ask("Weather in Paris?"), tools, stream };
        let content, warning, finish, calls;
        if (stream) {
          const a = accumulate(await collect(await client.chat.completions.create(request)));
          [content, warning, finish, calls] = [a.content, a.warnings.join(" "), a.finish, a.calls];
        } else {
          const c = (await client.chat.completions.create(request)).choices[0];
          [content, warning, finish] = [c.message.content, c.warning, c.finish_reason];
          calls = c.message.tool_calls ?? [];
        }
        const label = `tools ${tools ? "without get_weather" : "absent"}, stream ${stream}`;
        assert.deepEqual(calls, [], label);
        assert.equal(finish, "stop", label);
        // As the model wrote it, Gemma's string quotes included.
        const Q = '<|"|>';
        assert.equal(content,
          `<|tool_call>call:get_weather{city:${Q}Paris${Q},unit:${Q}celsius${Q}}<tool_call|>`, label);
        assert.match(warning, /called 'get_weather', which is not among the functions/, label);
      }
    }
  });

  const allowedTools = (mode, name) => ({
    tools: TOOLS,
    tool_choice: {
      type: "allowed_tools",
      allowed_tools: { mode, tools: [{ type: "function", function: { name } }] },
    },
  });

  test("allowed_tools and a named function keep every tool in the prompt, so turns share the cache",
    async () => {
      const create = (fields) => client.chat.completions.create({
        model: MODEL, messages: ask("What now?"), max_tokens: 4, ...fields });
      for (const mode of ["auto", "required"]) {
        const all = await create({ tools: TOOLS, tool_choice: mode });
        const time = await create(allowedTools(mode, "get_time"));
        const weather = await create(allowedTools(mode, "get_weather"));
        assert.equal(time.usage.prompt_tokens, all.usage.prompt_tokens, mode);
        // All but the last token, which is read again for its logits.
        assert.ok(weather.usage.prompt_tokens_details.cached_tokens >= weather.usage.prompt_tokens - 1,
          `${mode}: ${JSON.stringify(weather.usage)}`);
      }
      // A named function's prompt is the one all tools give, then the opening of its call.
      const plain = await create({ tools: TOOLS });
      const named = await create({ tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_time" } } });
      assert.ok(named.usage.prompt_tokens > plain.usage.prompt_tokens);
      assert.ok(named.usage.prompt_tokens_details.cached_tokens >= plain.usage.prompt_tokens - 1,
        JSON.stringify([plain.usage, named.usage]));
    });

  test("tool_choice allowed_tools holds the model's calls to the functions it names", async () => {
    // "What now?" matches no forced rule: these are the model's own tokens under the grammar. A
    // bias on <|tool_call> makes mode auto open calls too. With the prompt and the seed the same,
    // only the allowed set differs, and every call names the allowed function.
    const [open] = (await (await fetch(`${server.url}/tokenize`, {
      method: "POST", body: JSON.stringify({ content: "<|tool_call>" }),
    })).json()).tokens;
    for (const [mode, bias] of [["required", {}], ["auto", { [open]: 100 }]]) {
      for (const name of ["get_time", "get_weather"]) {
        for (const seed of [1, 2, 3]) {
          const r = await client.chat.completions.create({
            model: MODEL, messages: ask("What now?"), ...allowedTools(mode, name), max_tokens: 24,
            temperature: 1, seed, logit_bias: bias });
          const { tool_calls: calls = [], content } = r.choices[0].message;
          const label = `${mode} ${name} seed ${seed}: ${JSON.stringify(r.choices[0].message)}`;
          // Whole calls are parsed; one cut by max_tokens comes back as text.
          const called = [...calls.map((c) => c.function.name),
            ...[...(content ?? "").matchAll(/call:(\w+)/g)].map((m) => m[1])];
          assert.ok(called.length > 0, label);
          assert.ok(called.every((c) => c === name), label);
        }
      }
    }
  });

  test("a forced output's call to a function allowed_tools leaves out comes back as text",
    async () => {
      // The test hook's tokens replace the grammar's; the parser still holds calls to the set.
      const r = await client.chat.completions.create({
        model: MODEL, messages: ask("Weather anywhere?"), ...allowedTools("required", "get_time") });
      assert.equal(r.choices[0].message.tool_calls, undefined);
      assert.match(r.choices[0].warning, /called 'get_weather', which is not among the functions/);
    });

  test("a tool_choice naming an unknown function is a 400 naming the field", async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL, messages: ask("hi"), tools: TOOLS,
        tool_choice: { type: "function", function: { name: "nope" } },
      }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "tool_choice.function.name",
    );
  });

  for (const stream of [false, true]) {
    test(`a malformed call is a 200 with its text and a warning (stream: ${stream})`, async () => {
      const request = { model: MODEL, messages: ask("Broken call"), tools: TOOLS, stream };
      let content, warning, finish, calls;
      if (stream) {
        const a = accumulate(await collect(await client.chat.completions.create(request)));
        [content, warning, finish, calls] = [a.content, a.warnings.join(" "), a.finish, a.calls];
      } else {
        const r = await client.chat.completions.create(request);
        const c = r.choices[0];
        [content, warning, finish] = [c.message.content, c.warning, c.finish_reason];
        calls = c.message.tool_calls ?? [];
      }
      assert.equal(content, "Let me check. <|tool_call>call:get_weather{city Paris}<tool_call|>");
      assert.match(warning, /could not be parsed/);
      assert.equal(finish, "stop");
      assert.deepEqual(calls, []);
    });
  }

  test("output cut inside a call is returned as text with a warning", async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: ask("Cut call"), tools: TOOLS,
    });
    assert.equal(r.choices[0].message.content, `<|tool_call>call:get_weather{city:${Q}Par`);
    assert.match(r.choices[0].warning, /ended inside a tool call/);
  });
});

describe("what SDKs send beside the basics", () => {
  test("an assistant's refusal part is the text it was, as OpenAI stores it", async () => {
    const render = async (content) => {
      const res = await fetch(`${server.url}/apply-template`, { method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ messages: [...ask("Help?"), { role: "assistant", content },
          ...ask("Why not?")] }) });
      assert.equal(res.status, 200);
      return (await res.json()).prompt;
    };
    // The template reads each part as the text parts it holds.
    assert.equal(await render([{ type: "text", text: "I can't" },
      { type: "refusal", refusal: "help with that." }]),
    await render([{ type: "text", text: "I can't" }, { type: "text", text: "help with that." }]));
  });

  test("custom tools and spoken output are 400s naming the field, not silently text", async () => {
    const refused = async (extra, param, message) => {
      await assert.rejects(
        client.chat.completions.create({ model: MODEL, messages: ask("hi"), ...extra }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === param &&
          e.error.message === message);
    };
    await refused({ tools: [{ type: "custom", custom: { name: "grep" } }] }, "tools[0].type",
      "'tools[0].type' is \"custom\": this server calls function tools only");
    await refused({ modalities: ["text", "audio"] }, "modalities", "'modalities' may hold " +
      "\"text\" alone: this server answers with text only, got \"audio\"");
    await refused({ audio: { voice: "alloy", format: "wav" } }, "audio",
      "'audio' asks for spoken output: this server answers with text only");
  });
});

describe("thinking", () => {
  test("reasoning_effort turns thinking on; the thought goes to reasoning_content", async () => {
    const plain = await client.chat.completions.create({ model: MODEL, messages: ask("What is 2+2?") });
    const r = await client.chat.completions.create({
      model: MODEL, messages: ask("What is 2+2?"), reasoning_effort: "low",
    });
    // The template's <|think|> switch makes the prompt longer.
    assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens);
    assert.equal(r.choices[0].message.reasoning_content, "Two and two.");
    assert.equal(r.choices[0].message.content, "It is 4.");
    const off = await client.chat.completions.create({
      model: MODEL, messages: ask("What is 2+2?"), reasoning_effort: "none",
    });
    assert.equal(off.usage.prompt_tokens, plain.usage.prompt_tokens);
    const kwargs = await client.chat.completions.create({
      model: MODEL, messages: ask("What is 2+2?"), chat_template_kwargs: { enable_thinking: true },
    });
    assert.equal(kwargs.usage.prompt_tokens, r.usage.prompt_tokens);
    // A typo of "none" does not turn thinking on: OpenAI's efforts or a 400.
    for (const effort of ["nonee", "bogus", 1]) {
      await assert.rejects(
        client.chat.completions.create({ model: MODEL, messages: ask("Hi"), reasoning_effort: effort }),
        (e) => e instanceof OpenAI.BadRequestError && e.error.param === "reasoning_effort" &&
          e.error.message === "'reasoning_effort' must be \"none\", \"minimal\", \"low\", " +
            `"medium", "high" or "xhigh", got ${JSON.stringify(effort)}`,
        String(effort));
    }
  });

  test("streamed reasoning arrives as reasoning_content deltas, never in content", async () => {
    const a = accumulate(await collect(await client.chat.completions.create({
      model: MODEL, messages: ask("What is 2+2?"), reasoning_effort: "high", stream: true,
    })));
    assert.equal(a.reasoning, "Two and two.");
    assert.equal(a.content, "It is 4.");
  });

  test("after a tool result the reply goes on thinking in the channel the prompt opened",
    async () => {
      const messages = afterToolResult("Weather in Oslo, think first.", "Oslo", "CLOUDY-9C");
      const body = { model: MODEL, messages, tools: TOOLS, reasoning_effort: "low" };
      const whole = (await client.chat.completions.create(body)).choices[0];
      assert.equal(whole.message.reasoning_content, "Cold there.");
      assert.equal(whole.message.content, "It is 9 degrees in Oslo.");
      assert.equal(whole.finish_reason, "stop");
      const streamed = accumulate(await collect(
        await client.chat.completions.create({ ...body, stream: true })));
      assert.equal(streamed.reasoning, "Cold there.");
      assert.equal(streamed.content, "It is 9 degrees in Oslo.");
    });

  // Only the template's own opening at the prompt's end starts the reply as a thought: a
  // `<|channel>` written in a message (read as that token, as vLLM and llama.cpp read it) is the
  // message's, in this turn, an earlier one or a tool's result.
  test("a channel opening in a message's text leaves the reply in content", async () => {
    const hello = "Hello there, friend.";
    const conversations = [
      ask("Say hello. What does <|channel> open?"),
      [...ask("What does <|channel> do?"), { role: "assistant", content: "It opens one." },
        ...ask("Say hello")],
      afterToolResult("Say hello after the tool.", "Oslo", "It printed <|channel>"),
    ];
    for (const messages of conversations) {
      const whole = (await client.chat.completions.create({ model: MODEL, messages }))
        .choices[0].message;
      assert.deepEqual([whole.content, whole.reasoning_content], [hello, undefined],
        JSON.stringify(messages));
      const streamed = accumulate(await collect(
        await client.chat.completions.create({ model: MODEL, messages, stream: true })));
      assert.deepEqual([streamed.content, streamed.reasoning], [hello, ""]);
    }
    const json = await client.chat.completions.create({ model: MODEL,
      messages: ask("Say hello about <|channel>"), response_format: { type: "json_object" },
      max_tokens: 4 });
    assert.equal(json.choices[0].message.reasoning_content, undefined);
  });

  test("a forced call after a tool result with thinking on closes the opened channel first",
    async () => {
      const r = await client.chat.completions.create({ model: MODEL, tools: TOOLS,
        tool_choice: "required", reasoning_effort: "low",
        messages: afterToolResult("Weather anywhere?", "Oslo", "CLOUDY-9C") });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, "tool_calls");
      assert.equal(m.reasoning_content, undefined);
      assert.deepEqual(m.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
        [["get_weather", { city: "Oslo" }]]);
    });

  // The random weights never close a thought by themselves: a budget is what makes an answer.
  const thinkingBody = { model: MODEL, tools: TOOLS, reasoning_effort: "low", max_tokens: 12,
    ignore_eos: true, messages: afterToolResult("Is it raining in Bergen?", "Bergen", "RAINY-12C") };

  test("a thinking budget closes the thought for the model, which then answers", async () => {
    const free = (await client.chat.completions.create(thinkingBody)).choices[0].message;
    assert.equal(free.content, "");
    const capped = await client.chat.completions.create({ ...thinkingBody, thinking_token_budget: 6 });
    const m = capped.choices[0].message;
    assert.equal(capped.usage.completion_tokens, 12);
    // The prompt opened the channel with "thought\n", two of the six tokens: the model thought
    // four, as it does unbounded, then the block was closed and it answered.
    const pieces = async (text) => (await (await fetch(`${server.url}/tokenize`, {
      method: "POST", body: JSON.stringify({ content: text }),
    })).json()).tokens.length;
    assert.ok(free.reasoning_content.startsWith(m.reasoning_content), JSON.stringify([free, m]));
    assert.equal(await pieces(m.reasoning_content), 4);
    assert.ok(m.content.length > 0);
    // llama.cpp's name for the same budget, and the same split when streamed.
    const llama = await client.chat.completions.create({ ...thinkingBody, reasoning_budget_tokens: 6 });
    assert.deepEqual(llama.choices[0].message, m);
    const streamed = accumulate(await collect(await client.chat.completions.create(
      { ...thinkingBody, thinking_token_budget: 6, stream: true })));
    assert.deepEqual([streamed.reasoning, streamed.content], [m.reasoning_content, m.content]);
    // 0 closes the block at once: no thought at all.
    const none = (await client.chat.completions.create({ ...thinkingBody, thinking_token_budget: 0 }))
      .choices[0].message;
    assert.equal(none.reasoning_content, undefined);
    assert.ok(none.content.length > 0);
  });

  test("--reasoning-budget is the default a request's -1 lifts; bad budgets are 400s", async () => {
    const capped = await startServer(["--context", "1024", "--reasoning-budget", "6"]);
    try {
      const c = new OpenAI({ apiKey: "none", baseURL: capped.baseURL, maxRetries: 0 });
      const byDefault = (await c.chat.completions.create(thinkingBody)).choices[0].message;
      const asked = (await client.chat.completions.create({ ...thinkingBody, thinking_token_budget: 6 }))
        .choices[0].message;
      assert.deepEqual(byDefault, asked);
      const lifted = (await c.chat.completions.create({ ...thinkingBody, thinking_token_budget: -1 }))
        .choices[0].message;
      assert.equal(lifted.content, "");
      const engine = await (await fetch(`${capped.url}/v1/engine`)).json();
      assert.equal(engine.reasoning_budget, 6);
      assert.equal(engine.reasoning_budget_message, "");
    } finally {
      await capped.stop();
    }
    // llama.cpp's --reasoning-budget-message: written into the thought, which then closes, for
    // the server's budget and a request's alike.
    const message = " Enough thinking, time to answer.";
    const told = await startServer(["--context", "1024", "--reasoning-budget", "6",
      "--reasoning-budget-message", message]);
    try {
      const c = new OpenAI({ apiKey: "none", baseURL: told.baseURL, maxRetries: 0 });
      const body = { ...thinkingBody, max_tokens: 24 };
      const asked = (await client.chat.completions.create({ ...body, thinking_token_budget: 6 }))
        .choices[0].message;
      const byDefault = (await c.chat.completions.create(body)).choices[0].message;
      assert.equal(byDefault.reasoning_content, asked.reasoning_content + message);
      assert.ok(byDefault.content.length > 0);
      const requested = (await c.chat.completions.create({ ...body, reasoning_budget_tokens: 6 }))
        .choices[0].message;
      assert.deepEqual(requested, byDefault);
      const engine = await (await fetch(`${told.url}/v1/engine`)).json();
      assert.equal(engine.reasoning_budget_message, message);
    } finally {
      await told.stop();
    }
    for (const [field, value, message] of [
      ["thinking_token_budget", -2, "'thinking_token_budget' must be -1 (no limit) or at least 0, got -2"],
      ["reasoning_budget_tokens", 1.5, "'reasoning_budget_tokens' must be an integer, got a number"],
    ]) {
      const e = await client.chat.completions.create({ ...thinkingBody, [field]: value }).catch((x) => x);
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.error.param, field);
      assert.equal(e.error.message, message);
    }
  });
});

describe("logprobs", () => {
  const free = ask("Tell me about the sea.");

  test("chat: one entry per returned token; greedy tokens are the argmax of top_logprobs", async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: free, max_tokens: 12, ignore_eos: true, temperature: 0,
      logprobs: true, top_logprobs: 4,
    });
    const entries = r.choices[0].logprobs.content;
    assert.equal(entries.length, r.usage.completion_tokens);
    for (const e of entries) {
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 4);
      // The returned token is an argmax: the best logprob, and among the best entries (bf16 logits
      // of the random demo tie often, and topk may order tied tokens either way).
      assert.equal(e.logprob, e.top_logprobs[0].logprob);
      const best = e.top_logprobs.filter((t) => t.logprob === e.logprob).map((t) => t.token);
      assert.ok(best.includes(e.token) || best.length === 4, `${e.token} not in ${best}`);
      assert.ok(Array.isArray(e.bytes) && e.bytes.length > 0);
      for (let i = 1; i < 4; ++i) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob);
    }
    const streamed = accumulate(await collect(await client.chat.completions.create({
      model: MODEL, messages: free, max_tokens: 12, ignore_eos: true, temperature: 0,
      logprobs: true, top_logprobs: 4, stream: true,
    })));
    assert.deepEqual(streamed.logprobs, entries);
  });

  test("forced tokens carry the model's logprob of exactly those tokens", async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: ask("What is 2+2?"), logprobs: true, top_logprobs: 1,
    });
    const entries = r.choices[0].logprobs.content;
    assert.equal(entries.length, r.usage.completion_tokens);
    assert.equal(entries.map((e) => e.token).join(""), "<|channel>thought\nTwo and two.\n<channel|>It is 4.");
    for (const e of entries) assert.ok(e.logprob <= e.top_logprobs[0].logprob);
  });

  test("bytes rebuild the text, byte tokens included; text_offset counts characters", async () => {
    const text = "Añ 𓀀B𝔘 C";
    const r = await client.chat.completions.create({
      model: MODEL, messages: ask("Unicode please"), logprobs: true, top_logprobs: 2,
    });
    const entries = r.choices[0].logprobs.content;
    assert.equal(r.choices[0].message.content, text);
    // The reply's tokens, then the end of turn the forced output closes with.
    const bytes = Buffer.from(entries.flatMap((e) => e.bytes));
    assert.ok(bytes.toString("utf8").startsWith(text), bytes.toString("utf8"));
    const lone = entries.filter((e) => e.bytes.length === 1 && e.bytes[0] >= 0x80);
    assert.deepEqual(lone.map((e) => e.bytes[0]), [...Buffer.from("𓀀𝔘")]);
    for (const e of lone) assert.equal(e.token, "\uFFFD");
    const c = await client.completions.create({
      model: MODEL, prompt: "Unicode please", max_tokens: 30, logprobs: 1,
    });
    const chars = [...c.choices[0].text];
    assert.equal(c.choices[0].text, text);
    const lp = c.choices[0].logprobs;
    // Where each whole-character token starts, as code points of `text` (Python's str indexes).
    lp.tokens.forEach((token, i) => {
      if (token.includes("\uFFFD") || i >= chars.length) return;
      assert.equal(chars.slice(lp.text_offset[i], lp.text_offset[i] + [...token].length).join(""),
        token, `token ${i} at ${lp.text_offset[i]}`);
    });
    assert.equal(lp.text_offset[lp.tokens.indexOf("B")], chars.indexOf("B"));
  });

  test("completions: tokens, token_logprobs, top_logprobs and text_offset agree", async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: "The sea is", max_tokens: 10, ignore_eos: true, temperature: 0, logprobs: 3,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, r.usage.completion_tokens);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.equal(lp.text_offset.length, lp.tokens.length);
    for (let i = 0; i < lp.tokens.length; ++i) {
      const best = Math.max(...Object.values(lp.top_logprobs[i]));
      assert.equal(lp.token_logprobs[i], best);
      if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    }
    assert.equal(lp.text_offset[0], 0);
    const streamed = await collect(await client.completions.create({
      model: MODEL, prompt: "The sea is", max_tokens: 10, ignore_eos: true, temperature: 0, logprobs: 3,
      stream: true,
    }));
    const tokens = streamed.flatMap((c) => c.choices[0]?.logprobs?.tokens ?? []);
    const offsets = streamed.flatMap((c) => c.choices[0]?.logprobs?.text_offset ?? []);
    assert.deepEqual(tokens, lp.tokens);
    assert.deepEqual(offsets, lp.text_offset);
  });
});

describe("sampling parameters", () => {
  const bad = [
    [{ temperature: 3 }, "temperature"],
    [{ top_k: -5 }, "top_k"],
    [{ top_p: 0, temperature: 1 }, "top_p"],
    [{ min_p: 1.5 }, "min_p"],
    [{ logit_bias: { abc: 1 } }, "logit_bias.abc"],
    [{ logit_bias: { 99999999: 1 } }, "logit_bias"],
    [{ logprobs: true, top_logprobs: 30 }, "top_logprobs"],
    [{ tool_choice: "sometimes", tools: TOOLS }, "tool_choice"],
    [{ tool_choice: { type: "custom", custom: { name: "x" } }, tools: TOOLS }, "tool_choice.type"],
    [{ tool_choice: { type: "allowed_tools" }, tools: TOOLS }, "tool_choice.allowed_tools"],
    [{ tool_choice: { type: "allowed_tools", allowed_tools: { mode: "sometimes", tools: [] } }, tools: TOOLS },
      "tool_choice.allowed_tools.mode"],
    [{ tool_choice: { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [] } }, tools: TOOLS },
      "tool_choice.allowed_tools.tools"],
    [{ tool_choice: { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [
      { type: "function", function: { name: "nope" } }] } }, tools: TOOLS },
    "tool_choice.allowed_tools.tools[0].function.name"],
    [{ tool_choice: { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [
      { type: "custom", custom: { name: "x" } }] } }, tools: TOOLS },
    "tool_choice.allowed_tools.tools[0].type"],
  ];
  for (const [fields, param] of bad) {
    test(`${JSON.stringify(fields)} is a 400 naming ${param}`, async () => {
      await assert.rejects(
        client.chat.completions.create({ model: MODEL, messages: ask("hi"), ...fields }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === param,
      );
    });
  }

  test("the sampler's refusals read as the server's own: the field quoted, the value as sent",
    async () => {
      for (const [fields, message] of [
        [{ top_p: 0, temperature: 1 }, "'top_p' must be in (0, 1], got 0"],
        [{ repetition_penalty: 0 }, "'repetition_penalty' must be > 0, got 0"],
        [{ min_p: 1.5 }, "'min_p' must be between 0.0 and 1.0, got 1.5"],
      ]) {
        await assert.rejects(
          client.chat.completions.create({ model: MODEL, messages: ask("hi"), ...fields }),
          (e) => e instanceof OpenAI.BadRequestError && e.error.message === message,
          message);
      }
      // Past int64 (JSON.stringify writes no such number): the value as sent, not wrapped. Past
      // 2^64 and below -2^63 the parser holds the integer as a float, which is what it quotes.
      for (const [field, message] of [
        ['"max_tokens":9223372036854775808',
          "'max_tokens' must be at most 9223372036854775807, got 9223372036854775808"],
        ['"seed":18446744073709551616',
          "'seed' must be at most 9223372036854775807, got 1.8446744073709552e+19"],
        ['"seed":-9223372036854775809',
          "'seed' must be at least -9223372036854775808, got -9.223372036854776e+18"],
      ]) {
        const res = await fetch(`${server.baseURL}/chat/completions`, {
          method: "POST", headers: { "content-type": "application/json" },
          body: `{"messages":[{"role":"user","content":"hi"}],${field}}`,
        });
        assert.equal(res.status, 400);
        const { error } = await res.json();
        assert.equal(error.message, message);
        assert.equal(error.param, field.slice(1, field.indexOf('"', 1)));
      }
    });

  test("a logit_bias of 100 forces its token; a seed reproduces sampled text", async () => {
    const [id] = (await (await fetch(`${server.url}/tokenize`, {
      method: "POST", body: JSON.stringify({ content: " ocean" }),
    })).json()).tokens;
    const { content: piece } = await (await fetch(`${server.url}/detokenize`, {
      method: "POST", body: JSON.stringify({ tokens: [id] }),
    })).json();
    const r = await client.completions.create({
      model: MODEL, prompt: "The sea is", max_tokens: 3, ignore_eos: true, temperature: 1,
      logit_bias: { [id]: 100 },
    });
    assert.equal(r.choices[0].text, piece.repeat(3));
    const sampled = (seed) => client.completions.create({
      model: MODEL, prompt: "The sea is", max_tokens: 16, ignore_eos: true, temperature: 1, seed,
    });
    assert.equal((await sampled(3)).choices[0].text, (await sampled(3)).choices[0].text);
  });
});

describe("speculative decoding (--draft-max)", () => {
  test("answers as the server without drafts does, alone or side by side, and counts its " +
    "drafts in timings", async () => {
    const drafting = await startServer(["--context", "1024", "--parallel", "4", "--draft-max", "4",
      "--draft-ngram-min", "1", "--draft-always", "--metrics-compat", "vllm"]);
    try {
      const c = new OpenAI({ apiKey: "none", baseURL: drafting.baseURL, maxRetries: 0 });
      const engine = await (await fetch(`${drafting.url}/v1/engine`)).json();
      assert.deepEqual(engine.draft, { max: 4, source: "prompt lookup", model: null, ngram_min: 1,
        ngram_max: 4, always: true });
      assert.equal(engine.scheduler.mode, "continuous batching");
      let drafted = 0;
      let accepted = 0;
      const bodies = [{ temperature: 0 }, { temperature: 0.8, seed: 11 }].map((fields) => ({
        model: MODEL, messages: ask("Repeat after me: the sea, the sea, the sea."), max_tokens: 48,
        ignore_eos: true, ...fields }));
      const answers = [];
      for (const body of bodies) {
        const plain = await client.chat.completions.create(body);
        answers.push(plain.choices[0].message.content);
        const got = await c.chat.completions.create(body);
        assert.equal(got.choices[0].message.content, plain.choices[0].message.content,
          JSON.stringify(body));
        assert.equal(got.usage.completion_tokens, 48);
        assert.equal(plain.timings.draft_n, undefined);
        assert.ok(got.timings.draft_n_accepted <= got.timings.draft_n);
        drafted += got.timings.draft_n;
        accepted += got.timings.draft_n_accepted;
        // Streamed: the same text, drafts and all.
        let streamed = "";
        for await (const chunk of await c.chat.completions.create({ ...body, stream: true })) {
          streamed += chunk.choices[0]?.delta?.content ?? "";
        }
        assert.equal(streamed, plain.choices[0].message.content);
      }
      assert.ok(drafted > 0, "no draft was made");
      // /metrics counts them, under vLLM's names too: each body was asked whole and streamed,
      // and drafted alike both times.
      const text = await metrics(drafting.url);
      assert.equal(metric(text, "torchtpu_draft_tokens_total"), drafted * 2);
      assert.equal(metric(text, "torchtpu_draft_accepted_tokens_total"), accepted * 2);
      assert.equal(metric(text, 'vllm:spec_decode_num_draft_tokens_total{model_name="' + MODEL +
        '"}'), drafted * 2);
      assert.equal(metric(text, 'vllm:spec_decode_num_accepted_tokens_total{model_name="' +
        MODEL + '"}'), accepted * 2);
      // Side by side, rows of one batch (drafting within the room a pass leaves them).
      const together = await Promise.all(bodies.map((body) => c.chat.completions.create(body)));
      assert.deepEqual(together.map((r) => r.choices[0].message.content), answers);
      assert.ok(together.some((r) => r.timings.draft_n > 0), "no draft beside another row");
      // A request turns drafts off for itself (llama-server's speculative.n_max)...
      const off = await c.chat.completions.create({ ...bodies[0], "speculative.n_max": 0 });
      assert.equal(off.choices[0].message.content, answers[0]);
      assert.equal(off.timings.draft_n, undefined);
    } finally {
      await drafting.stop();
    }
  });

  test("a request turns drafts on for itself with speculative.n_max; a wrong one is a 400",
    async () => {
      const body = { model: MODEL, messages: ask("Repeat after me: the sea, the sea, the sea."),
        max_tokens: 48, ignore_eos: true, temperature: 0 };
      const plain = await client.chat.completions.create(body);
      assert.equal(plain.timings.draft_n, undefined);
      // This server runs without --draft-max: the request's own drafts, checked while they pay,
      // give the same answer. The first pass that finds a draft after two steps checks it.
      const drafted = await client.chat.completions.create({ ...body, "speculative.n_max": 4 });
      assert.equal(drafted.choices[0].message.content, plain.choices[0].message.content);
      assert.ok(drafted.timings.draft_n > 0, JSON.stringify(drafted.timings));
      assert.ok(drafted.timings.draft_n_accepted <= drafted.timings.draft_n);
      const text = await client.completions.create({ model: MODEL, prompt: "the sea, the sea, the sea,",
        max_tokens: 24, ignore_eos: true, temperature: 0, "speculative.n_max": 3 });
      assert.ok(text.timings.draft_n >= 0, JSON.stringify(text.timings));
      for (const [value, message] of [
        [-1, "'speculative.n_max' must be 0 (no drafts) or more, got -1"],
        [2.5, "'speculative.n_max' must be an integer, got a number"],
        ["4", "'speculative.n_max' must be an integer, got a string"],
      ]) {
        const e = await client.chat.completions.create({ ...body, "speculative.n_max": value })
          .catch((x) => x);
        assert.ok(e instanceof OpenAI.BadRequestError, String(e));
        assert.equal(e.error.param, "speculative.n_max");
        assert.equal(e.error.message, message);
      }
    });

  test("drafts from an assistant (--draft-model) answer as the server without drafts does",
    async () => {
      const assistant = makeAssistantCheckpoint();
      // No --draft-max: with a draft model the server drafts 3 tokens a step by default.
      const drafting = await startServer(["--context", "1024", "--parallel", "2",
        "--draft-always", "--draft-model", assistant]);
      try {
        const c = new OpenAI({ apiKey: "none", baseURL: drafting.baseURL, maxRetries: 0 });
        const engine = await (await fetch(`${drafting.url}/v1/engine`)).json();
        assert.deepEqual(engine.draft, { max: 3, source: "assistant", model: assistant,
          ngram_min: 2, ngram_max: 4, always: true });
        const bodies = [{ temperature: 0 }, { temperature: 0.8, seed: 5 }].map((fields) => ({
          model: MODEL, messages: ask("Tell me about the sea."), max_tokens: 32, ignore_eos: true,
          ...fields }));
        const answers = [];
        for (const body of bodies) {
          const plain = await client.chat.completions.create(body);
          answers.push(plain.choices[0].message.content);
          const got = await c.chat.completions.create(body);
          assert.equal(got.choices[0].message.content, answers.at(-1), JSON.stringify(body));
          assert.ok(got.timings.draft_n > 0, JSON.stringify(got.timings));
          assert.ok(got.timings.draft_n_accepted <= got.timings.draft_n);
        }
        // Side by side, rows of one batch that draft together.
        const together = await Promise.all(bodies.map((body) => c.chat.completions.create(body)));
        assert.deepEqual(together.map((r) => r.choices[0].message.content), answers);
      } finally {
        await drafting.stop();
      }
    });

  test("a --draft-model that is not the model's assistant is refused at start", async () => {
    const demo = path.join(cacheDir(), "torchtpu-cpp", "demo-v1");
    const child = spawn(cliPath(), ["serve", "--port", "0", "--draft-model", demo],
      { stdio: "pipe", env: { ...process.env, XDG_CACHE_HOME: cacheDir() } });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const code = await new Promise((resolve) => child.on("exit", resolve));
    assert.equal(code, 2, stderr);
    assert.equal(stderr.trim(), `error: the draft model ${demo} is not a Gemma 4 assistant: ` +
      'its config.json needs model_type "gemma4_assistant"');
  });
});
