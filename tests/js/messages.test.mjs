// Issue #18: Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) through
// the official `@anthropic-ai/sdk`: whole answers, messages.stream() with finalMessage(), thinking,
// tool_use / tool_result round trips, stop sequences, count_tokens against /tokenize of the prompt
// that transformers' apply_chat_template renders, x-api-key and Bearer auth, and errors in
// Anthropic's shape naming every malformed field. The demo checkpoint has random weights, so the
// server runs with its test hook TORCHTPU_TEST_FORCED_OUTPUT (a prompt containing a rule's text gets
// that rule's output, Gemma 4 markup included, as its tokens).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import { zodOutputFormat } from "@anthropic-ai/sdk/helpers/zod";
import { z } from "zod";
import Ajv from "ajv";
import {
  RENDERED, RULES, SUNNY, startForcedServer, tokenCount as countTokens,
} from "./forced_output.mjs";
import { eventually, metric, metrics } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const KEY = "sk-messages-test";
const TOOLS = [
  {
    name: "get_weather",
    description: "The weather in a city",
    input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
];

const ajv = new Ajv();
let server;
let client;

before(async () => {
  server = await startForcedServer(RULES, ["--context", "2048", "--api-key", KEY]);
  client = new Anthropic({ apiKey: KEY, baseURL: server.url, maxRetries: 0 });
});

after(async () => {
  if (server) await server.stop();
});

const ask = (content) => [{ role: "user", content }];
const create = (fields) => client.messages.create({ model: MODEL, max_tokens: 200, ...fields });

const tokenCount = (text) => countTokens(server.url, text, KEY);

describe("whole answers", () => {
  test("a text answer: content blocks, end_turn, usage equal to count_tokens", async () => {
    const m = await create({ messages: ask("Say hello") });
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.equal(m.model, MODEL);
    assert.deepEqual(m.content, [{ type: "text", text: "Hello there, friend." }]);
    assert.equal(m.stop_reason, "end_turn");
    assert.equal(m.stop_sequence, null);
    assert.ok(m.usage.output_tokens >= 5);
    const counted = await client.messages.countTokens({ model: MODEL, messages: ask("Say hello") });
    assert.equal(m.usage.input_tokens, counted.input_tokens);
    // The nullable fields of the SDK's Usage type are there.
    assert.deepEqual([m.usage.cache_creation, m.usage.server_tool_use, m.usage.service_tier],
      [null, null, "standard"]);
  });

  test("a plain-text document block reads as its title and text; other sources are refused",
    async () => {
      const document = { type: "document", title: "Notes", source: { type: "text",
        media_type: "text/plain", data: "Rivers run to the sea." } };
      const asText = [{ role: "user", content: [{ type: "text", text: "Notes\n\nRivers run to the sea." },
        { type: "text", text: "Say hello" }] }];
      const asDocument = [{ role: "user", content: [document, { type: "text", text: "Say hello" }] }];
      const count = async (messages) =>
        (await client.messages.countTokens({ model: MODEL, messages })).input_tokens;
      assert.equal(await count(asDocument), await count(asText));
      await assert.rejects(create({ messages: [{ role: "user", content: [{ ...document,
        source: { type: "base64", media_type: "application/pdf", data: "JVBERi0=" } }] }] }),
      (e) => e.status === 400 && e.error.error.message === "'messages.0.content.0.source.type' " +
        "must be \"text\": this server reads plain-text documents only, got \"base64\"");
    });

  test("models.list() and retrieve() get Anthropic's fields beside OpenAI's", async () => {
    const page = await client.models.list();
    assert.deepEqual(page.data.map((m) => [m.id, m.type, m.display_name]), [[MODEL, "model", MODEL]]);
    assert.ok(!Number.isNaN(Date.parse(page.data[0].created_at)));
    const raw = await (await fetch(`${server.url}/v1/models`, { headers: { "x-api-key": KEY } })).json();
    assert.deepEqual([raw.object, raw.has_more, raw.first_id, raw.last_id], ["list", false, MODEL, MODEL]);
    const one = await client.models.retrieve(MODEL);
    assert.deepEqual([one.type, one.display_name, one.created_at], ["model", MODEL, page.data[0].created_at]);
    assert.equal(Date.parse(one.created_at) / 1000, raw.data[0].created);
  });

  test("count_tokens counts the prompt transformers renders: system, tools, thinking", async () => {
    const base = { model: MODEL, messages: ask("Weather in Paris?") };
    const cases = [
      [{ ...base, system: "Be brief." }, RENDERED.plain],
      [{ ...base, system: [{ type: "text", text: "Be brief." }] }, RENDERED.plain],
      [{ ...base, system: "Be brief.", tools: TOOLS }, RENDERED.tools],
      [{ ...base, system: "Be brief.", thinking: { type: "enabled", budget_tokens: 1024 } }, RENDERED.thinking],
    ];
    for (const [body, rendered] of cases) {
      const { input_tokens } = await client.messages.countTokens(body);
      assert.equal(input_tokens, await tokenCount(rendered), JSON.stringify(body));
    }
  });

  test("a system message among the others is a system turn at its place, as Claude Code sends it",
    async () => {
      // transformers' apply_chat_template of the same turns as chat messages.
      const rendered = "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nIs it warm?<turn|>\n" +
        "<|turn>model\nSunny.<turn|>\n<|turn>system\nAnswer in French.<turn|>\n" +
        "<|turn>user\nSay hello<turn|>\n<|turn>model\n";
      const messages = [
        ...ask("Is it warm?"),
        { role: "assistant", content: "Sunny." },
        { role: "system", content: [{ type: "text", text: "Answer in French.", cache_control: { type: "ephemeral" } }] },
        ...ask("Say hello"),
      ];
      const { input_tokens } = await client.messages.countTokens({ model: MODEL, system: "Be brief.", messages });
      assert.equal(input_tokens, await tokenCount(rendered));
      const m = await create({ system: "Be brief.", messages });
      assert.deepEqual(m.content, [{ type: "text", text: "Hello there, friend." }]);
      assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, input_tokens);
    });

  test("thinking enabled: a thinking block, then the text", async () => {
    const m = await create({
      messages: ask("What is 2+2?"), max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 },
    });
    assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text"]);
    assert.equal(m.content[0].thinking, "Two and two.");
    assert.equal(m.content[1].text, "It is 4.");
    const adaptive = await create({ messages: ask("What is 2+2?"), thinking: { type: "adaptive" } });
    assert.deepEqual(adaptive.content, m.content);
    const omitted = await create({ messages: ask("What is 2+2?"), thinking: { type: "adaptive", display: "omitted" } });
    assert.deepEqual(omitted.content, [{ type: "thinking", thinking: "", signature: "" }, m.content[1]]);
  });

  test("thinking enabled: once budget_tokens are spent the block is closed and the text follows",
    async () => {
      // After a tool result the prompt has opened the thinking block; the random weights, greedy,
      // never close it by themselves.
      const messages = [...ask("Is it raining in Bergen?"),
        { role: "assistant", content: [{ type: "tool_use", id: "toolu_9", name: "get_weather",
          input: { city: "Bergen" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_9", content: "RAINY-12C" }] }];
      const body = { messages, tools: TOOLS, max_tokens: 1030, temperature: 0 };
      const unbounded = await create({ ...body, thinking: { type: "adaptive" } });
      assert.deepEqual(unbounded.content.map((b) => b.type), ["thinking"]);
      const m = await create({ ...body, thinking: { type: "enabled", budget_tokens: 1024 } });
      assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text"]);
      assert.ok(unbounded.content[0].thinking.startsWith(m.content[0].thinking));
      assert.ok(m.content[1].text.length > 0);
      assert.equal(m.usage.output_tokens, 1030);
    });

  test("tool_use, then tool_result: the round trip", async () => {
    const first = await create({ messages: ask("Weather in Paris?"), tools: TOOLS });
    assert.equal(first.stop_reason, "tool_use");
    assert.equal(first.content.length, 1);
    const [use] = first.content;
    assert.equal(use.type, "tool_use");
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, "get_weather");
    assert.deepEqual(use.input, { city: "Paris", unit: "celsius" });

    const second = await create({
      tools: TOOLS,
      messages: [
        ...ask("Weather in Paris?"),
        { role: "assistant", content: first.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "SUNNY-21C" }] },
      ],
    });
    assert.equal(second.stop_reason, "end_turn");
    assert.deepEqual(second.content, [{ type: "text", text: SUNNY }]);
  });

  test("tool_choice any and tool are honoured; none drops the tools from the prompt", async () => {
    const any = await create({ messages: ask("Weather anywhere?"), tools: TOOLS, tool_choice: { type: "any" } });
    assert.equal(any.stop_reason, "tool_use");
    assert.equal(any.content[0].name, "get_weather");
    const named = await create({
      messages: ask("Weather in Oslo?"), tools: TOOLS, tool_choice: { type: "tool", name: "get_weather" },
    });
    assert.deepEqual(named.content[0].input, { city: "Oslo" });
    const none = await client.messages.countTokens({
      model: MODEL, messages: ask("Hi"), tools: TOOLS, tool_choice: { type: "none" },
    });
    assert.equal(none.input_tokens, (await client.messages.countTokens({ model: MODEL, messages: ask("Hi") })).input_tokens);
  });

  test("stop_sequences cut the text: stop_reason stop_sequence names the sequence", async () => {
    const m = await create({ messages: ask("Say hello"), stop_sequences: ["nothing", "friend"] });
    assert.deepEqual(m.content, [{ type: "text", text: "Hello there, " }]);
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, "friend");
  });

  test("max_tokens cuts the answer: stop_reason max_tokens", async () => {
    const m = await create({ messages: ask("Say hello"), max_tokens: 2 });
    assert.equal(m.stop_reason, "max_tokens");
    assert.equal(m.usage.output_tokens, 2);
  });
});

describe("structured output", () => {
  // Bounded values only, so that the random-weight model cannot write past max_tokens.
  const Verdict = z.object({ kind: z.enum(["cat", "dog", "bird"]), ok: z.boolean() });

  test("output_config.format is enforced: messages.parse() gets a valid parsed_output", async () => {
    for (let i = 0; i < 4; i++) {
      const m = await client.messages.parse({
        model: MODEL, max_tokens: 100, temperature: 1, messages: ask(`Pick an animal, try ${i}`),
        output_config: { format: zodOutputFormat(Verdict) },
      });
      assert.equal(m.stop_reason, "end_turn");
      assert.deepEqual(Verdict.parse(JSON.parse(m.content[0].text)), m.parsed_output);
    }
  });

  test("a forced single tool call on random weights is one declared tool with valid input", async () => {
    const tools = [
      {
        name: "set_mode",
        input_schema: {
          type: "object",
          properties: { mode: { enum: ["fast", "slow"] }, loud: { type: "boolean" } },
          required: ["mode", "loud"],
          additionalProperties: false,
        },
      },
      { name: "stop", input_schema: { type: "object", properties: {}, additionalProperties: false } },
    ];
    const validate = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.input_schema)]));
    for (let i = 0; i < 4; i++) {
      const m = await create({
        messages: ask(`Choose, round ${i}`),
        tools,
        tool_choice: { type: "any", disable_parallel_tool_use: true },
        temperature: 1,
        max_tokens: 100,
      });
      assert.equal(m.stop_reason, "tool_use");
      const calls = m.content.filter((b) => b.type === "tool_use");
      assert.equal(calls.length, 1, JSON.stringify(m.content));
      for (const block of calls) {
        assert.ok(validate[block.name], `declared: ${block.name}`);
        assert.ok(validate[block.name](block.input), JSON.stringify(block.input));
      }
    }
  });

  test("a format other than json_schema, or an effort that is no string, is refused naming the field",
    async () => {
      const refused = (output_config, field) =>
        assert.rejects(
          create({ messages: ask("hi"), output_config }),
          (e) => e instanceof Anthropic.BadRequestError && e.error.error.message.startsWith(`'${field}'`),
        );
      await refused({ format: { type: "xml" } }, "output_config.format.type");
      await refused({ format: { type: "json_schema" } }, "output_config.format.schema");
      await refused({ format: { type: "json_schema", schema: 5 } }, "output_config.format.schema");
      await refused({ effort: 5 }, "output_config.effort");
    });

  test("an effort (Claude Code sends one with every request) is accepted and changes nothing", async () => {
    const plain = await create({ messages: ask("Say hello") });
    for (const effort of ["low", "high", "max"]) {
      const m = await create({ messages: ask("Say hello"), output_config: { effort } });
      assert.deepEqual(m.content, plain.content, effort);
    }
  });
});

describe("streaming", () => {
  test("thinking and text: the SDK's stream and finalMessage() agree with the whole answer", async () => {
    const body = { messages: ask("What is 2+2?"), max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 } };
    const stream = client.messages.stream({ model: MODEL, ...body });
    const events = [];
    for await (const event of stream) events.push(event);
    const final = await stream.finalMessage();
    const squeezed = events
      .map((e) => (e.type === "content_block_delta" ? `delta:${e.delta.type}` : e.type))
      .filter((t, i, all) => !(t.startsWith("delta:") && all[i - 1] === t));
    assert.deepEqual(squeezed, [
      "message_start",
      "content_block_start",
      "delta:thinking_delta",
      "delta:signature_delta",
      "content_block_stop",
      "content_block_start",
      "delta:text_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    const whole = await create(body);
    assert.deepEqual(final.content, whole.content);
    assert.equal(final.stop_reason, "end_turn");
    assert.equal(final.usage.input_tokens, whole.usage.input_tokens);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  test("a tool call streams as tool_use with input_json_delta", async () => {
    const stream = client.messages.stream({ model: MODEL, max_tokens: 200, messages: ask("Weather in Paris?"), tools: TOOLS });
    const events = [];
    for await (const event of stream) events.push(event);
    const final = await stream.finalMessage();
    assert.equal(final.stop_reason, "tool_use");
    assert.equal(final.content[0].type, "tool_use");
    assert.deepEqual(final.content[0].input, { city: "Paris", unit: "celsius" });
    assert.ok(events.some((e) => e.type === "content_block_delta" && e.delta.type === "input_json_delta"));
  });

  test("the raw stream: named events, a ping after message_start, message_stop last", async () => {
    const res = await fetch(`${server.url}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": KEY, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, max_tokens: 50, messages: ask("Say hello"), stream: true }),
    });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const blocks = (await res.text()).split("\n\n").filter(Boolean);
    const names = blocks.map((b) => {
      const [name, data] = b.split("\n");
      assert.equal(name.slice("event: ".length), JSON.parse(data.slice("data: ".length)).type);
      return name.slice("event: ".length);
    });
    assert.deepEqual(names.slice(0, 3), ["message_start", "ping", "content_block_start"]);
    assert.deepEqual(names.slice(-2), ["message_delta", "message_stop"]);
  });
});

describe("cancellation", () => {
  test("a client that leaves a stream cancels its decode; the next request is served", async () => {
    const cancelled = async () =>
      metric(await metrics(server.url, { authorization: `Bearer ${KEY}` }), "torchtpu_requests_cancelled_total");
    const before = await cancelled();
    const controller = new AbortController();
    const stream = await client.messages.create(
      { model: MODEL, max_tokens: 1000, messages: ask("Tell a long story"), stream: true },
      { signal: controller.signal },
    );
    let deltas = 0;
    let stopped = false;
    for await (const event of stream) {
      if (event.type === "content_block_delta" && ++deltas === 3) {
        controller.abort();
        break;
      }
      stopped ||= event.type === "message_stop";
    }
    assert.equal(deltas, 3);
    assert.equal(stopped, false);
    await eventually(async () => (await cancelled()) === before + 1, "the cancel counter to move");
    const next = await create({ messages: ask("Say hello") });
    assert.deepEqual(next.content, [{ type: "text", text: "Hello there, friend." }]);
  });
});

describe("auth", () => {
  test("x-api-key and Bearer are both accepted; a wrong key is authentication_error", async () => {
    const bearer = new Anthropic({ apiKey: null, authToken: KEY, baseURL: server.url, maxRetries: 0 });
    assert.equal((await bearer.messages.countTokens({ model: MODEL, messages: ask("hi") })).input_tokens > 0, true);
    const wrong = new Anthropic({ apiKey: "sk-wrong", baseURL: server.url, maxRetries: 0 });
    await assert.rejects(
      wrong.messages.create({ model: MODEL, max_tokens: 5, messages: ask("hi") }),
      (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === "authentication_error",
    );
  });
});

describe("errors", () => {
  const bad = [
    [{ max_tokens: undefined }, "max_tokens"],
    [{ max_tokens: 0 }, "max_tokens"],
    [{ max_tokens: "ten" }, "max_tokens"],
    [{ messages: undefined }, "messages"],
    [{ messages: [] }, "messages"],
    [{ messages: [{ role: "developer", content: "x" }] }, "messages.0.role"],
    [{ messages: [{ role: "system", content: [{ type: "image" }] }, ...ask("hi")] }, "messages.0.content.0.type"],
    [{ messages: [{ role: "user" }] }, "messages.0.content"],
    [{ messages: [{ role: "user", content: 5 }] }, "messages.0.content"],
    [{ messages: [{ role: "user", content: [] }] }, "messages.0.content"],
    [{ messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }, "messages.0.content.0.source.type"],
    [{ messages: [{ role: "user", content: [{ type: "text" }] }] }, "messages.0.content.0.text"],
    [{ messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_nope" }] }] },
      "messages.0.content.0.tool_use_id"],
    [{ messages: [{ role: "user", content: [{ type: "tool_use", id: "t", name: "f", input: {} }] }] },
      "messages.0.content.0.type"],
    [{ messages: [{ role: "assistant", content: [{ type: "tool_use", id: "t", name: "f", input: "{}" }] }, ...ask("hi")] },
      "messages.0.content.0.input"],
    [{ messages: [...ask("hi"), { role: "assistant", content: "Sure" }] }, "messages.1"],
    [{ system: 5 }, "system"],
    [{ system: [{ type: "image" }] }, "system.0.type"],
    [{ temperature: 1.5 }, "temperature"],
    [{ top_p: -1 }, "top_p"],
    [{ top_k: -1 }, "top_k"],
    [{ stop_sequences: [""] }, "stop_sequences.0"],
    [{ stop_sequences: "stop" }, "stop_sequences"],
    [{ thinking: { type: "enabled", budget_tokens: 100 } }, "thinking.budget_tokens"],
    [{ thinking: { type: "enabled" } }, "thinking.budget_tokens"],
    [{ thinking: { type: "sometimes" } }, "thinking.type"],
    [{ thinking: { type: "between_tools" } }, "thinking.type"],
    [{ thinking: { type: "adaptive", display: "verbose" } }, "thinking.display"],
    [{ tools: [{ name: "x" }] }, "tools.0.input_schema"],
    [{ tools: [{ input_schema: { type: "object" } }] }, "tools.0.name"],
    [{ tools: [{ type: "web_search_20250305", name: "web_search" }] }, "tools.0.type"],
    [{ tools: TOOLS, tool_choice: { type: "tool", name: "nope" } }, "tool_choice.name"],
    [{ tools: TOOLS, tool_choice: { type: "sometimes" } }, "tool_choice.type"],
    // A forced tool's schema keyword the grammar cannot enforce, named in Messages' terms.
    [{ tools: [...TOOLS, { name: "f", input_schema: { type: "object", properties: { s: { type: "string",
      minLength: 3 } } } }], tool_choice: { type: "tool", name: "f" } }, "tools.1.input_schema.properties.s.minLength"],
    [{ tool_choice: { type: "any" } }, "tool_choice"],
    // llama-server's and vLLM's fields, passed on as chat completions take them.
    [{ id_slot: 99 }, "id_slot"],
    [{ cache_salt: "" }, "cache_salt"],
    [{ lora: [{ id: 0, scale: 1 }] }, "lora"],
    [{ tools: TOOLS, tool_choice: { type: "any" }, max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 } },
      "thinking"],
    [{ messages: [{ role: "user", content: [{ type: "redacted_thinking", data: "x" }] }] },
      "messages.0.content.0.type"],
    [{ messages: [{ role: "assistant", content: [{ type: "redacted_thinking" }] }, ...ask("hi")] },
      "messages.0.content.0.data"],
  ];
  for (const [fields, param] of bad) {
    test(`${JSON.stringify(fields)} is a 400 invalid_request_error naming ${param}`, async () => {
      await assert.rejects(
        create({ messages: ask("hi"), ...fields }),
        (e) =>
          e instanceof Anthropic.BadRequestError &&
          e.error.type === "error" &&
          e.error.error.type === "invalid_request_error" &&
          e.error.error.message.startsWith(`'${param}'`),
      );
    });
  }

  test("a redacted_thinking block in an assistant turn (a conversation begun on Anthropic's API) is dropped", async () => {
    const turns = (blocks) => [...ask("Weather in Paris?"), { role: "assistant", content: blocks }, ...ask("hi")];
    const plain = await client.messages.countTokens({ model: MODEL, messages: turns([{ type: "text", text: "Sure." }]) });
    const redacted = await client.messages.countTokens({ model: MODEL, messages: turns([
      { type: "redacted_thinking", data: "EmwKAhgBEgy3va3pzix/LafPsn4a" }, { type: "text", text: "Sure." }]) });
    assert.equal(redacted.input_tokens, plain.input_tokens);
  });

  test("disable_parallel_tool_use keeps the first call only", async () => {
    const tools = [...TOOLS, { name: "get_time", description: "The time", input_schema: { type: "object" } }];
    const names = async (choice) => (await create({ messages: ask("Two calls"), tools,
      ...(choice ? { tool_choice: choice } : {}) })).content.map((b) => b.name);
    assert.deepEqual(await names(), ["get_time", "get_weather"]);
    assert.deepEqual(await names({ type: "auto", disable_parallel_tool_use: true }), ["get_time"]);
  });

  test("an image in a tool result says where images go", async () => {
    const image = { type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } };
    await assert.rejects(
      create({ messages: [...ask("Look."),
        { role: "assistant", content: [{ type: "tool_use", id: "toolu_9", name: "get_weather",
          input: { city: "Oslo" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_9",
          content: [{ type: "text", text: "shot" }, image] }] }] }),
      (e) => e instanceof Anthropic.BadRequestError &&
        e.error.error.message === "'messages.2.content.0.content.1.type' must be \"text\": this " +
          "field holds text only (images and audio go in a user message's own content), got \"image\"",
    );
  });

  test("count_tokens validates the same fields, and needs no max_tokens", async () => {
    await assert.rejects(
      client.messages.countTokens({ model: MODEL, messages: [{ role: "robot", content: "x" }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.error.error.message.startsWith("'messages.0.role'"),
    );
  });

  test("a prompt past the context is too long in Anthropic's words (Claude Code compacts on them)",
    async () => {
      const messages = ask("word ".repeat(3000));
      const { input_tokens } = await client.messages.countTokens({ model: MODEL, messages });
      assert.ok(input_tokens > 2048);
      for (const stream of [false, true]) {
        await assert.rejects(
          client.messages.create({ model: MODEL, max_tokens: 5, messages, stream }),
          (e) => e instanceof Anthropic.BadRequestError &&
            e.error.error.type === "invalid_request_error" &&
            e.error.error.message === `prompt is too long: ${input_tokens} tokens > 2048 maximum`,
          `stream: ${stream}`);
      }
    });

  test("a reply the context ends before max_tokens stops for the context window", async () => {
    // The forced story is about 900 tokens: past the room the prompt leaves in the context.
    const messages = ask(`Tell a long story. ${"word ".repeat(1800)}`);
    const { input_tokens } = await client.messages.countTokens({ model: MODEL, messages });
    const room = 2048 - input_tokens + 1;
    assert.ok(room > 0 && room < 500, `input_tokens ${input_tokens}`);
    for (const stream of [false, true]) {
      const body = { model: MODEL, max_tokens: 1000, messages };
      const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
      assert.equal(m.stop_reason, "model_context_window_exceeded", `stream: ${stream}`);
      assert.equal(m.usage.output_tokens, room, `stream: ${stream}`);
    }
    const capped = await create({ messages, max_tokens: 5 });
    assert.equal(capped.stop_reason, "max_tokens");
  });

  test("another model's name is a 404 not_found_error", async () => {
    await assert.rejects(
      client.messages.create({ model: "claude-opus-4", max_tokens: 5, messages: ask("hi") }),
      (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === "not_found_error",
    );
  });

  test("a body that is not JSON, and a wrong method, are answered in Anthropic's shape", async () => {
    const headers = { "x-api-key": KEY, "content-type": "application/json" };
    const notJson = await fetch(`${server.url}/v1/messages`, { method: "POST", headers, body: "{" });
    assert.equal(notJson.status, 400);
    const body = await notJson.json();
    assert.equal(body.type, "error");
    assert.equal(body.error.type, "invalid_request_error");
    assert.match(body.error.message, /not valid JSON/);
    const get = await fetch(`${server.url}/v1/messages`, { headers });
    assert.equal(get.status, 405);
    assert.equal((await get.json()).error.type, "invalid_request_error");
    const missingKey = await fetch(`${server.url}/v1/messages`, { method: "POST", body: "{}" });
    assert.equal(missingKey.status, 401);
    const unauthorized = await missingKey.json();
    assert.equal(unauthorized.error.type, "authentication_error");
    assert.match(unauthorized.error.message, /x-api-key/);
  });
});
