// Structured output (issue #18) through the official `openai` SDK on the demo checkpoint (random
// weights): chat.completions.parse with a zod schema, streamed constrained replies, forced tool
// calls that must name a declared tool with arguments valid for its parameters (checked with ajv,
// keys in the schema's order), json on /v1/completions, and a 400 naming the field for every
// malformed or unenforceable response_format and tool schema. As in structured_valid.test.mjs,
// closers are biased so that random weights end their strings; the mask decides validity.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import Ajv from "ajv";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { startServer } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "book_flight",
      parameters: {
        type: "object",
        // Not alphabetical: the arguments must come back in this order.
        properties: {
          zeta_from: { type: "string" },
          alpha_to: { type: "string" },
          passengers: { type: "integer" },
          options: {
            type: "object",
            properties: { window: { type: "boolean" }, meal: { enum: ["veg", "fish", null] } },
          },
          legs: { type: "array", items: { type: "number" } },
        },
        required: ["zeta_from", "alpha_to", "passengers"],
      },
    },
  },
  { type: "function", function: { name: "get_time", parameters: { type: "object" } } },
  { type: "function", function: { name: "ping" } },
];

let server;
let client;
let bias;
let callBias;
let forcedCallBias;

async function ids(content) {
  const res = await fetch(`${server.url}/tokenize`, { method: "POST", body: JSON.stringify({ content }) });
  return (await res.json()).tokens;
}

before(async () => {
  server = await startServer(["--context", "1024", "--threads", "1"]);
  client = new OpenAI({ apiKey: "none", baseURL: server.baseURL, maxRetries: 0 });
  // JSON's string closers, or Gemma 4's string delimiter in calls; then container closers.
  bias = {};
  for (const closer of ['"', '"}', '",', '"]', '"]}']) for (const id of await ids(closer)) bias[id] = 18;
  callBias = { [(await ids('<|"|>'))[0]]: 30 };
  for (const closer of ["}", "]", ",", "},", "],", "<turn|>"]) {
    for (const id of await ids(closer)) bias[id] = callBias[id] = 9;
  }
  // In a forced call, keys are bare words ended by ':', and an object of undeclared keys
  // (get_time's) ends only when '}' wins over ',': random weights need both pushed as a value's
  // end is.
  forcedCallBias = { ...callBias };
  for (const end of [":", "}"]) for (const id of await ids(end)) forcedCallBias[id] = 30;
});

after(async () => {
  if (server) await server.stop();
});

const ajv = new Ajv({ allErrors: true, strict: false });
const ask = (content) => [{ role: "user", content }];

// A sampled request for a small JSON object (the streamed and the n-choice cases); `bias` is set
// once the server is up.
const person = () => ({
  model: MODEL, messages: ask("A person?"), temperature: 1.0, logit_bias: bias, max_tokens: 200,
  response_format: {
    type: "json_schema",
    json_schema: {
      name: "person",
      schema: {
        type: "object",
        properties: { name: { type: "string" }, age: { type: "integer" } },
        required: ["name", "age"],
        additionalProperties: false,
      },
    },
  },
});

describe("response_format", () => {
  test("chat.completions.parse with a zod schema returns parsed, valid objects", async () => {
    const Event = z.object({
      name: z.string(),
      day: z.enum(["mon", "tue", "wed"]),
      attendees: z.array(z.string()).max(3),
      room: z.number().int().nullable(),
    });
    const format = zodResponseFormat(Event, "event");
    const validate = ajv.compile(format.json_schema.schema);
    for (let seed = 0; seed < 8; ++seed) {
      const reply = await client.chat.completions.parse({
        model: MODEL, messages: ask("Plan an event."), response_format: format,
        temperature: 1.0, seed, logit_bias: bias, max_tokens: 200,
      });
      const message = reply.choices[0].message;
      assert.equal(reply.choices[0].finish_reason, "stop", message.content);
      assert.deepEqual(message.parsed, JSON.parse(message.content));
      assert.ok(validate(message.parsed), ajv.errorsText(validate.errors));
      assert.deepEqual(Event.parse(message.parsed), message.parsed);
    }
  });

  test("a streamed constrained reply is the same valid JSON as the whole one", async () => {
    const request = { ...person(), seed: 7 };
    const whole = await client.chat.completions.create(request);
    let streamed = "";
    let finish = null;
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      streamed += chunk.choices[0]?.delta?.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, "stop");
    assert.equal(streamed, whole.choices[0].message.content);
    assert.deepEqual(Object.keys(JSON.parse(streamed)), ["name", "age"]);
  });

  test("n constrained choices each follow the schema, each as its seed gives it alone", async () => {
    const request = person();
    // A grammar's state advances with every token of its sequence: choices sharing one would
    // commit each other's tokens and fail (or wander off the schema).
    const three = await client.chat.completions.create({ ...request, seed: 20, n: 3 });
    assert.equal(three.choices.length, 3);
    for (const [i, choice] of three.choices.entries()) {
      const alone = await client.chat.completions.create({ ...request, seed: 20 + i });
      assert.equal(choice.finish_reason, "stop", choice.message.content);
      assert.equal(choice.message.content, alone.choices[0].message.content);
      assert.deepEqual(Object.keys(JSON.parse(choice.message.content)), ["name", "age"]);
    }
  });

  // OpenAI makes json_schema's schema optional: without one the answer is any JSON object.
  for (const format of [{ type: "json_object" }, { type: "json_schema", json_schema: { name: "any" } }]) {
    test(`${JSON.stringify(format)} on /v1/completions is a JSON object too`, async () => {
      for (let seed = 0; seed < 4; ++seed) {
        const reply = await client.completions.create({
          model: MODEL, prompt: "JSON:", response_format: format,
          temperature: 1.0, seed, logit_bias: bias, max_tokens: 200,
        });
        assert.equal(reply.choices[0].finish_reason, "stop");
        const value = JSON.parse(reply.choices[0].text);
        assert.equal(typeof value, "object");
        assert.ok(value !== null && !Array.isArray(value));
      }
    });
  }

  test("type text is free text, as without response_format", async () => {
    const plain = await client.chat.completions.create({ model: MODEL, messages: ask("Hi"), max_tokens: 8 });
    const text = await client.chat.completions.create({
      model: MODEL, messages: ask("Hi"), max_tokens: 8, response_format: { type: "text" },
    });
    assert.equal(text.choices[0].message.content, plain.choices[0].message.content);
  });
});

describe("forced tool calls", () => {
  const validators = Object.fromEntries(
    TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters ?? { type: "object", maxProperties: 0 })]),
  );
  const declaredOrder = (name) => Object.keys(TOOLS.find((t) => t.function.name === name).function.parameters?.properties ?? {});

  function checkCalls(reply, allowed, where) {
    const choice = reply.choices[0];
    assert.equal(choice.finish_reason, "tool_calls", `${where}: ${JSON.stringify(choice.message)}`);
    assert.equal(choice.message.content, null, where);
    assert.ok(choice.message.tool_calls.length >= 1, where);
    for (const call of choice.message.tool_calls) {
      assert.ok(allowed.includes(call.function.name), `${where}: called ${call.function.name}`);
      const args = JSON.parse(call.function.arguments);
      const validate = validators[call.function.name];
      assert.ok(validate(args), `${where}: ${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
      const order = declaredOrder(call.function.name);
      if (order.length) {
        const keys = Object.keys(args);
        assert.deepEqual(keys, order.filter((k) => keys.includes(k)), `${where}: key order ${keys}`);
      }
    }
  }

  test("tool_choice required: 30 seeded replies each call declared tools with valid arguments", async () => {
    const names = TOOLS.map((t) => t.function.name);
    const called = new Set();
    for (let seed = 0; seed < 30; ++seed) {
      const reply = await client.chat.completions.create({
        model: MODEL, messages: ask("Do something."), tools: TOOLS, tool_choice: "required",
        temperature: 1.0, seed, logit_bias: forcedCallBias, max_tokens: 200,
      });
      checkCalls(reply, names, `seed ${seed}`);
      for (const call of reply.choices[0].message.tool_calls) called.add(call.function.name);
    }
    assert.ok(called.size >= 3, `only ${[...called]} were called`);
  });

  test("a named function: 20 seeded replies and a greedy one call it with valid arguments", async () => {
    const seeds = [...Array(20).keys(), null];
    for (const seed of seeds) {
      const reply = await client.chat.completions.create({
        model: MODEL, messages: ask("Book me a flight."), tools: TOOLS,
        tool_choice: { type: "function", function: { name: "book_flight" } },
        temperature: seed === null ? 0 : 1.0, ...(seed === null ? {} : { seed }),
        logit_bias: forcedCallBias, max_tokens: 200,
      });
      checkCalls(reply, ["book_flight"], `seed ${seed ?? "greedy"}`);
    }
  });

  test("parallel_tool_calls false: one call, whole or streamed; not a boolean: a 400", async () => {
    const request = {
      model: MODEL, messages: ask("Do something."), tools: TOOLS, tool_choice: "required",
      parallel_tool_calls: false, temperature: 1.0, logit_bias: forcedCallBias, max_tokens: 200,
    };
    for (let seed = 0; seed < 5; ++seed) {
      const reply = await client.chat.completions.create({ ...request, seed });
      checkCalls(reply, TOOLS.map((t) => t.function.name), `seed ${seed}`);
      assert.equal(reply.choices[0].message.tool_calls.length, 1, `seed ${seed}`);
      assert.equal(reply.choices[0].finish_reason, "tool_calls");
    }
    const stream = await client.chat.completions.create({ ...request, seed: 1, stream: true });
    const indices = new Set();
    for await (const chunk of stream) {
      for (const t of chunk.choices[0]?.delta?.tool_calls ?? []) indices.add(t.index);
    }
    assert.deepEqual([...indices], [0]);
    await assert.rejects(
      client.chat.completions.create({ ...request, parallel_tool_calls: "yes" }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "parallel_tool_calls",
    );
  });

  test("streamed forced calls arrive whole and valid", async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages: ask("Weather?"), tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      temperature: 1.0, seed: 3, logit_bias: forcedCallBias, max_tokens: 200, stream: true,
    });
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
      for (const t of chunk.choices[0]?.delta?.tool_calls ?? []) {
        const call = (calls[t.index] ??= { name: "", arguments: "" });
        call.name += t.function?.name ?? "";
        call.arguments += t.function?.arguments ?? "";
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, "tool_calls");
    for (const call of calls) {
      assert.equal(call.name, "get_weather");
      assert.ok(validators.get_weather(JSON.parse(call.arguments)), call.arguments);
    }
  });
});

describe("errors name the field", () => {
  const cases = [
    [{ response_format: "json" }, "response_format"],
    [{ response_format: {} }, "response_format.type"],
    [{ response_format: { type: "xml" } }, "response_format.type"],
    [{ response_format: { type: "json_object", schema: {} } }, "response_format.schema"],
    [{ response_format: { type: "json_schema" } }, "response_format.json_schema"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: [] } } }, "response_format.json_schema.schema"],
    [{ response_format: { type: "json_schema", json_schema: { name: 3, schema: {} } } }, "response_format.json_schema.name"],
    [{ response_format: { type: "json_schema", json_schema: { schema: {}, strict: "yes" } } }, "response_format.json_schema.strict"],
    [{ response_format: { type: "json_schema", json_schema: { schema: {}, format: 1 } } }, "response_format.json_schema.format"],
    [{ response_format: { type: "json_object" }, ignore_eos: true }, "ignore_eos"],
    // Keys JSON Schema does not define, which the grammar would pass over.
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object",
      properties: { a: { type: "string" } }, requried: ["a"] } } } }, "response_format.json_schema.schema.requried"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object",
      properties: { a: { type: "string", nullable: true } } } } } },
    "response_format.json_schema.schema.properties.a.nullable"],
  ];
  for (const [extra, param] of cases) {
    test(`${JSON.stringify(extra)} is a 400 on ${param}`, async () => {
      await assert.rejects(
        client.chat.completions.create({ model: MODEL, messages: ask("Hi"), max_tokens: 4, ...extra }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === param,
      );
    });
  }

  test("a schema keyword the grammar cannot enforce is a 400 that names it", async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL, messages: ask("Hi"), max_tokens: 4,
        response_format: {
          type: "json_schema",
          json_schema: { name: "x", schema: { type: "object", properties: { a: { type: "array", uniqueItems: true } } } },
        },
      }),
      (e) =>
        e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema" &&
        /uniqueItems/.test(e.message),
    );
  });

  test("a schema that admits no value (a $ref cycle) is a 400, streamed or not", async () => {
    const cycle = { $ref: "#/$defs/a", $defs: { a: { $ref: "#/$defs/b" }, b: { $ref: "#/$defs/a" } } };
    for (const stream of [false, true]) {
      await assert.rejects(
        client.chat.completions.create({
          model: MODEL, messages: ask("Hi"), max_tokens: 4, stream,
          response_format: { type: "json_schema", json_schema: { name: "x", schema: cycle } },
        }),
        (e) =>
          e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema" &&
          /cannot be enforced: the grammar admits no first token/.test(e.message) &&
          !e.message.includes("\n"),
      );
    }
  });

  test("a forced call whose parameters use an unsupported keyword is a 400 naming its path", async () => {
    const tools = [{
      type: "function",
      function: { name: "f", parameters: { type: "object", properties: { s: { type: "string", minLength: 3 } } } },
    }];
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages: ask("Hi"), max_tokens: 4, tools, tool_choice: "required" }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[0].function.parameters.properties.s.minLength",
    );
    // A named function's path is its place in the request.
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages: ask("Hi"), max_tokens: 4,
        tools: [{ type: "function", function: { name: "g" } }, ...tools],
        tool_choice: { type: "function", function: { name: "f" } } }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[1].function.parameters.properties.s.minLength",
    );
  });
});

describe("--constrain-tools: tool_choice auto", () => {
  let constrained;
  let constrainedClient;
  before(async () => {
    constrained = await startServer(["--context", "1024", "--threads", "1", "--constrain-tools"]);
    constrainedClient = new OpenAI({ apiKey: "none", baseURL: constrained.baseURL, maxRetries: 0 });
  });
  after(async () => {
    if (constrained) await constrained.stop();
  });

  // Biased towards opening calls, so that random weights write some.
  const request = async (to, seed) =>
    to.chat.completions.create({
      model: MODEL, messages: ask("Anything to do?"), tools: TOOLS, temperature: 1.0, seed,
      logit_bias: { ...callBias, [(await ids("<|tool_call>"))[0]]: 30 }, max_tokens: 80,
    });

  test("every call the model writes is valid; without the flag some are not", async () => {
    let calls = 0;
    let brokenWithout = 0;
    for (let seed = 0; seed < 10; ++seed) {
      const choice = (await request(constrainedClient, seed)).choices[0];
      // Free text on random weights runs to max_tokens, which may cut a call short: that is the
      // one warning allowed.
      const cut = choice.finish_reason === "length" && /ended inside a tool call/.test(choice.warning);
      assert.ok(choice.warning === undefined || cut, JSON.stringify(choice));
      for (const call of choice.message.tool_calls ?? []) {
        ++calls;
        const spec = TOOLS.find((t) => t.function.name === call.function.name);
        assert.ok(spec, call.function.name);
        const validate = ajv.compile(spec.function.parameters ?? { type: "object", maxProperties: 0 });
        assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
      }
      if ((await request(client, seed)).choices[0].warning) ++brokenWithout;
    }
    assert.ok(calls >= 3, `only ${calls} calls`);
    assert.ok(brokenWithout >= 3, `only ${brokenWithout} broken calls without the flag`);
  });
});
