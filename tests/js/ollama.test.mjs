// Ollama's own API (POST /api/chat and /api/generate, GET /api/tags, POST /api/show, GET /api/ps,
// GET /api/version, POST /api/pull) through the official `ollama` client: whole and streamed
// answers, thinking, tool calls and their round trip, format (json and a schema, checked with
// ajv), options, the prompt against the one transformers' apply_chat_template renders, and errors
// in Ollama's shape naming every malformed field, the model store's routes (501) among them. The
// demo checkpoint has random weights, so the server runs with its test hook
// TORCHTPU_TEST_FORCED_OUTPUT (a prompt containing a rule's text gets that rule's output, Gemma 4
// markup included, as its tokens).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Ollama } from "ollama";
import Ajv from "ajv";
import {
  RENDERED, RULES, SUNNY, startForcedServer, tokenCount as countTokens,
} from "./forced_output.mjs";
import { eventually } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const KEY = "sk-ollama-test";
const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

let server;
let ollama;

before(async () => {
  server = await startForcedServer(RULES, ["--context", "2048", "--api-key", KEY]);
  ollama = new Ollama({ host: server.url, headers: { Authorization: `Bearer ${KEY}` } });
});

after(async () => {
  if (server) await server.stop();
});

const user = (content) => ({ role: "user", content });
const chat = (fields) => ollama.chat({ model: MODEL, ...fields });

const tokenCount = (text) => countTokens(server.url, text, KEY);

// The error a call fails with: the client's ResponseError (status_code, error) for a refused
// request, or the Error a streamed {"error"} line raises.
async function failure(call) {
  try {
    const r = await call();
    if (r && typeof r[Symbol.asyncIterator] === "function") for await (const _ of r);
  } catch (e) {
    return e;
  }
  assert.fail("the call succeeded");
}

describe("the model, as Ollama describes it", () => {
  test("version, tags, show and ps", async () => {
    const { version } = await ollama.version();
    assert.match(version, /^\d+\.\d+\.\d+$/);
    const [major, minor] = version.split(".").map(Number);
    assert.ok(major > 0 || minor >= 6, version);  // VS Code Copilot asks for 0.6.4 or later

    const { models } = await ollama.list();
    assert.equal(models.length, 1);
    const [tag] = models;
    assert.equal(tag.name, `${MODEL}:latest`);
    assert.equal(tag.model, `${MODEL}:latest`);
    assert.ok(tag.size > 0);
    assert.match(tag.digest, /^[0-9a-f]{16}$/);
    assert.equal(tag.details.family, "gemma4");
    assert.ok(!Number.isNaN(Date.parse(tag.modified_at)));

    for (const name of [MODEL, `${MODEL}:latest`]) {
      const show = await ollama.show({ model: name });
      assert.equal(show.model_info["general.architecture"], "gemma4");
      assert.equal(show.model_info["gemma4.context_length"], 2048);
      assert.deepEqual(show.capabilities, ["completion", "tools", "thinking"]);
      assert.match(show.parameters, /^temperature /);
      assert.match(show.template, /enable_thinking/);
    }

    const ps = await ollama.ps();
    assert.equal(ps.models.length, 1);
    assert.equal(ps.models[0].name, `${MODEL}:latest`);
    assert.equal(ps.models[0].context_length, 2048);
    assert.ok(Date.parse(ps.models[0].expires_at) > Date.now() + 1000 * 3600 * 24 * 365);
  });

  test("pull of a model served here succeeds with nothing to download", async () => {
    // The client sends the model as Ollama's older field, "name"; "model" is read too.
    for (const model of [MODEL, `${MODEL}:latest`]) {
      assert.deepEqual(await ollama.pull({ model, stream: false }), { status: "success" });
      const parts = [];
      for await (const part of await ollama.pull({ model, stream: true, insecure: true })) {
        parts.push(part);
      }
      assert.deepEqual(parts, [{ status: "success" }]);
    }
    const res = await fetch(`${server.url}/api/pull`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "application/x-ndjson");
    assert.equal(await res.text(), '{"status":"success"}\n');
  });

  test("nothing to generate loads the model; with keep_alive 0 it unloads it", async () => {
    const engine = async () => (await (await fetch(`${server.url}/v1/engine`, {
      headers: { authorization: `Bearer ${KEY}` } })).json()).scheduler;
    const sleeps = (await engine()).sleeps;
    const unloaded = await chat({ messages: [], stream: false, keep_alive: 0 });
    assert.equal(unloaded.done, true);
    assert.equal(unloaded.done_reason, "unload");
    await eventually(async () => (await ollama.ps()).models.length === 0, "/api/ps to list nothing");
    assert.deepEqual([(await engine()).asleep, (await engine()).sleeps], [true, sleeps + 1]);
    const loaded = await chat({ messages: [], stream: false, keep_alive: "5m" });
    assert.equal(loaded.done_reason, "load");
    // Answered once the weights are back.
    assert.equal((await engine()).asleep, false);
    assert.equal((await ollama.ps()).models.length, 1);
    const generated = await ollama.generate({ model: MODEL, prompt: "", stream: false, keep_alive: 0 });
    assert.equal(generated.done_reason, "unload");
    assert.equal(generated.response, "");
    // The next request loads it again, as any request to a sleeping server does.
    await eventually(async () => (await engine()).asleep, "the engine to sleep");
    const r = await chat({ messages: [user("Say hello")], stream: false, keep_alive: -1 });
    assert.equal(r.message.content, "Hello there, friend.");
    assert.equal((await engine()).sleeps, sleeps + 2);
  });

  test("keep_alive keeps the model loaded that long after a request, until the next one", async () => {
    const engine = async () => (await (await fetch(`${server.url}/v1/engine`, {
      headers: { authorization: `Bearer ${KEY}` } })).json()).scheduler;
    const sleeps = (await engine()).sleeps;
    const answered = Date.now();
    const r = await chat({ messages: [user("Say hello")], stream: false, keep_alive: "1.5s" });
    assert.equal(r.message.content, "Hello there, friend.");
    const expires = Date.parse((await ollama.ps()).models[0].expires_at);
    assert.ok(expires >= answered && expires < Date.now() + 5000, `expires_at ${expires}`);
    await eventually(async () => (await engine()).asleep, "the engine to sleep after the answer");
    assert.equal((await engine()).sleeps, sleeps + 1);
    // A request that gives none: the server's own limit again (--sleep-idle-seconds: never here).
    const again = await chat({ messages: [user("Say hello")], stream: false });
    assert.equal(again.message.content, "Hello there, friend.");
    const ps = await ollama.ps();
    assert.ok(Date.parse(ps.models[0].expires_at) > Date.now() + 1000 * 3600 * 24 * 365);
    await new Promise((resolve) => setTimeout(resolve, 2500));
    assert.deepEqual([(await engine()).asleep, (await engine()).sleeps], [false, sleeps + 1]);
  });
});

describe("/api/chat", () => {
  test("a whole answer: the text, done_reason, and counts of the prompt transformers renders",
    async () => {
      const r = await chat({ messages: [user("Say hello")], stream: false });
      assert.equal(r.model, MODEL);
      assert.equal(r.message.role, "assistant");
      assert.equal(r.message.content, "Hello there, friend.");
      assert.equal(r.done, true);
      assert.equal(r.done_reason, "stop");
      assert.ok(r.eval_count >= 5);
      assert.ok(r.total_duration > 0 && r.prompt_eval_duration > 0);
      assert.ok(r.total_duration >= r.prompt_eval_duration + r.eval_duration);

      const cases = [
        [{ messages: [{ role: "system", content: "Be brief." }, user("Weather in Paris?")] }, RENDERED.plain],
        [{ messages: [{ role: "SYSTEM", content: "Be brief." }, user("Weather in Paris?")], tools: TOOLS },
          RENDERED.tools],
        [{ messages: [{ role: "system", content: "Be brief." }, user("Weather in Paris?")], think: true },
          RENDERED.thinking],
        [{ messages: [{ role: "system", content: "Be brief." }, user("Weather in Paris?")], think: "low" },
          RENDERED.thinking],
      ];
      for (const [body, rendered] of cases) {
        const counted = await chat({ ...body, stream: false, options: { num_predict: 1 } });
        assert.equal(counted.prompt_eval_count, await tokenCount(rendered), JSON.stringify(body));
      }
    });

  test("streamed: pieces that add up to the whole answer, then a done line with the counts",
    async () => {
      const name = `${MODEL}:latest`;
      const pieces = [];
      for await (const part of await ollama.chat({ model: name, messages: [user("Say hello")], stream: true })) {
        pieces.push(part);
      }
      const last = pieces.at(-1);
      assert.ok(pieces.length >= 3);
      assert.ok(pieces.slice(0, -1).every((p) => p.done === false && p.model === name));
      assert.equal(pieces.map((p) => p.message.content).join(""), "Hello there, friend.");
      assert.equal(last.done, true);
      assert.equal(last.done_reason, "stop");
      assert.equal(last.message.content, "");
      const whole = await chat({ messages: [user("Say hello")], stream: false });
      assert.equal(last.eval_count, whole.eval_count);
      assert.equal(last.prompt_eval_count, whole.prompt_eval_count);
    });

  test("think: the reasoning in message.thinking, the answer in content", async () => {
    const r = await chat({ messages: [user("What is 2+2?")], think: true, stream: false });
    assert.equal(r.message.thinking, "Two and two.");
    assert.equal(r.message.content, "It is 4.");
    let thinking = "";
    let content = "";
    for await (const part of await chat({ messages: [user("What is 2+2?")], think: "high", stream: true })) {
      thinking += part.message.thinking ?? "";
      content += part.message.content;
    }
    assert.equal(thinking, "Two and two.");
    assert.equal(content, "It is 4.");
  });

  test("a tool call, then its result: the round trip, by tool_name or by order", async () => {
    const first = await chat({ messages: [user("Weather in Paris?")], tools: TOOLS, stream: false });
    assert.equal(first.done_reason, "stop");
    assert.equal(first.message.content, "");
    assert.equal(first.message.tool_calls.length, 1);
    const [call] = first.message.tool_calls;
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(call.function.arguments, { city: "Paris", unit: "celsius" });
    assert.equal(call.function.index, 0);

    const history = [user("Weather in Paris?"), first.message];
    const byName = await chat({
      tools: TOOLS, stream: false,
      messages: [...history, { role: "tool", content: "SUNNY-21C", tool_name: "get_weather" }],
    });
    assert.equal(byName.message.content, SUNNY);
    // Without tool_name the result answers the call in its place; the prompt is the same.
    const byOrder = await chat({
      tools: TOOLS, stream: false, messages: [...history, { role: "tool", content: "SUNNY-21C" }],
    });
    assert.equal(byOrder.message.content, SUNNY);
    assert.equal(byOrder.prompt_eval_count, byName.prompt_eval_count);
    // What an OpenAI client sends for the same turns renders to the same prompt.
    const openai = await fetch(`${server.url}/apply-template`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: JSON.stringify({
        tools: TOOLS,
        messages: [user("Weather in Paris?"),
          { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function",
            function: { name: "get_weather", arguments: JSON.stringify(call.function.arguments) } }] },
          { role: "tool", tool_call_id: "c1", content: "SUNNY-21C" }],
      }),
    });
    const { prompt } = await openai.json();
    assert.equal(byName.prompt_eval_count, await tokenCount(prompt));
  });

  test("streamed tool calls come in a message of their own", async () => {
    const calls = [];
    for await (const part of await chat({ messages: [user("Weather in Paris?")], tools: TOOLS, stream: true })) {
      calls.push(...(part.message.tool_calls ?? []));
    }
    assert.deepEqual(calls.map((c) => c.function.arguments), [{ city: "Paris", unit: "celsius" }]);
  });

  test("format: json and a JSON schema are enforced", async () => {
    const schema = {
      type: "object",
      properties: { kind: { type: "string", enum: ["cat", "dog", "bird"] }, ok: { type: "boolean" } },
      required: ["kind", "ok"],
      additionalProperties: false,
    };
    const validate = new Ajv().compile(schema);
    for (let i = 0; i < 3; i++) {
      const r = await chat({
        messages: [user(`Pick an animal, try ${i}`)], format: schema, stream: false,
        options: { temperature: 1, seed: i, num_predict: 100 },
      });
      const parsed = JSON.parse(r.message.content);
      assert.ok(validate(parsed), r.message.content);
    }
    const json = await chat({
      messages: [user("Any JSON")], format: "json", stream: false,
      options: { temperature: 0, num_predict: 60 },
    });
    assert.match(json.message.content, /^\s*\{/);
  });

  test("logprobs: chat's entries, on the lines of their tokens and whole", async () => {
    const ask = { messages: [user("Tell me anything")], options: { num_predict: 6 }, logprobs: true,
      top_logprobs: 3 };
    const whole = await chat({ ...ask, stream: false });
    assert.equal(whole.logprobs.length, whole.eval_count);
    for (const entry of whole.logprobs) {
      assert.equal(typeof entry.token, "string");
      assert.ok(entry.logprob <= 0);
      assert.deepEqual(entry.bytes, [...Buffer.from(entry.token)]);
      assert.equal(entry.top_logprobs.length, 3);
      assert.ok(entry.top_logprobs[0].logprob >= entry.logprob - 1e-6);
    }
    // The same tokens and numbers as chat/completions gives for the same request.
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, messages: ask.messages, max_tokens: 6, logprobs: true,
        top_logprobs: 3 }),
    });
    const openai = (await res.json()).choices[0].logprobs.content;
    assert.deepEqual(whole.logprobs, openai);
    const streamed = [];
    for await (const part of await chat({ ...ask, stream: true })) streamed.push(...(part.logprobs ?? []));
    assert.deepEqual(streamed, whole.logprobs);
    const raw = await ollama.generate({ model: MODEL, prompt: "<bos>Once", raw: true, stream: false,
      logprobs: true, options: { num_predict: 3 } });
    assert.equal(raw.logprobs.length, 3);
    assert.ok(raw.logprobs.every((e) => e.top_logprobs.length === 0));
    const none = await chat({ ...ask, logprobs: false, stream: false });
    assert.equal(none.logprobs, undefined);
  });

  test("options: num_predict, stop, seed", async () => {
    const cut = await chat({ messages: [user("Say hello")], stream: false, options: { num_predict: 2 } });
    assert.equal(cut.eval_count, 2);
    assert.equal(cut.done_reason, "length");
    const stopped = await chat({
      messages: [user("Say hello")], stream: false, options: { stop: ["a", "b", "c", "d", "friend"] },
    });
    assert.equal(stopped.message.content, "Hello there, ");
    const sampled = (seed) => chat({
      messages: [user("Tell me anything")], stream: false,
      options: { temperature: 1, top_k: 40, top_p: 0.9, seed, num_predict: 8, num_ctx: 8192, num_gpu: 99 },
    });
    const [a, b] = [await sampled(7), await sampled(7)];
    assert.equal(a.message.content, b.message.content);
    assert.equal(a.eval_count, 8);
  });
});

describe("/api/generate", () => {
  test("a prompt with a system message is rendered as a chat turn", async () => {
    const r = await ollama.generate({ model: MODEL, prompt: "Say hello", stream: false });
    assert.equal(r.response, "Hello there, friend.");
    assert.equal(r.done_reason, "stop");
    const counted = await ollama.generate({
      model: MODEL, system: "Be brief.", prompt: "Weather in Paris?", stream: false,
      options: { num_predict: 1 },
    });
    assert.equal(counted.prompt_eval_count, await tokenCount(RENDERED.plain));
  });

  test("streamed, with thinking in its own field", async () => {
    let response = "";
    let thinking = "";
    let last;
    for await (const part of await ollama.generate({ model: MODEL, prompt: "What is 2+2?", think: true, stream: true })) {
      response += part.response;
      thinking += part.thinking ?? "";
      last = part;
    }
    assert.equal(response, "It is 4.");
    assert.equal(thinking, "Two and two.");
    assert.equal(last.done, true);
  });

  test("raw: the prompt is read as it is", async () => {
    const prompt = RENDERED.plain.replace("Weather in Paris?", "Say hello");
    const r = await ollama.generate({ model: MODEL, prompt, raw: true, stream: false });
    assert.equal(r.response, "Hello there, friend.");
    assert.equal(r.prompt_eval_count, await tokenCount(prompt));
  });
});

describe("errors in Ollama's shape", () => {
  const cases = [
    ["no model", () => ollama.chat({ model: "", messages: [user("Hi")], stream: false }), 400, /^model is required$/],
    ["an unknown model", () => chat({ model: "llama3", messages: [user("Hi")], stream: false }), 404,
      /'llama3' does not exist/],
    ["a load of an unknown model", () => chat({ model: "llama3", messages: [], stream: false }), 404,
      /'llama3' does not exist/],
    ["an unknown option", () => chat({ messages: [user("Hi")], stream: false, options: { temprature: 1 } }), 400,
      /'options\.temprature' is not an Ollama option/],
    ["an option of the wrong type", () => chat({ messages: [user("Hi")], stream: false, options: { top_k: "5" } }),
      400, /'options\.top_k' must be an integer, got a string/],
    ["a runner option of the wrong type", () => chat({ messages: [user("Hi")], stream: false,
      options: { num_ctx: "big" } }), 400, /'options\.num_ctx' must be an integer, got a string/],
    ["a boolean runner option of the wrong type", () => chat({ messages: [user("Hi")], stream: false,
      options: { use_mmap: 1 } }), 400, /'options\.use_mmap' must be a boolean, got /],
    ["an integer option too large", () => chat({ messages: [user("Hi")], stream: false, options: { num_predict: 1e300 } }),
      400, /'options\.num_predict' must be an integer of at most 15 digits, got 1e\+300/],
    ["a temperature out of range", () => chat({ messages: [user("Hi")], stream: false, options: { temperature: 7 } }),
      400, /'options\.temperature' must be between 0\.0 and 2\.0, got 7/],
    ["mirostat", () => chat({ messages: [user("Hi")], stream: false, options: { mirostat: 2 } }), 400,
      /'options\.mirostat' must be 0: Mirostat sampling is not implemented here, got 2/],
    ["a bad think", () => chat({ messages: [user("Hi")], stream: false, think: "deep" }), 400,
      /'think' must be true, false, "high", "medium", "low" or "max", got "deep"/],
    ["a bad format", () => chat({ messages: [user("Hi")], stream: false, format: "yaml" }), 400,
      /'format' must be "json" or a JSON schema object, got "yaml"/],
    ["a bad keep_alive", () => chat({ messages: [user("Hi")], stream: false, keep_alive: "5 minutes" }), 400,
      /'keep_alive' must be a number of seconds or a duration such as "5m"/],
    ["a bad role", () => chat({ messages: [{ role: "narrator", content: "Hi" }], stream: false }), 400,
      /'messages\[0\]\.role' must be "system", "developer", "user", "assistant" or "tool", got "narrator"/],
    ["an image that is no image", () => chat({ messages: [{ ...user("Hi"), images: ["aGVsbG8gd29ybGQ="] }],
      stream: false }), 400, /'messages\[0\]\.images\[0\]' is not a base64 PNG, JPEG or WebP image/],
    ["images on an assistant message", () => chat({ messages: [user("Hi"),
      { role: "assistant", content: "A cat.", images: ["aGVsbG8gd29ybGQ="] }, user("More?")], stream: false }),
      400, /^'messages\[1\]\.images' belong to user messages, not assistant ones$/],
    ["images on a tool message", () => chat({ messages: [user("Hi"),
      { role: "tool", content: "done", images: ["aGVsbG8gd29ybGQ="] }], stream: false }),
      400, /^'messages\[1\]\.images' belong to user messages, not tool ones$/],
    ["thinking on a user message", () => chat({ messages: [{ ...user("Hi"), thinking: "hm" }], stream: false }),
      400, /'messages\[0\]\.thinking' belongs to assistant messages, not user ones/],
    ["a suffix", () => ollama.generate({ model: MODEL, prompt: "def f(", suffix: "return 1", stream: false }), 400,
      /'suffix' is not supported: Gemma 4 has no fill-in-the-middle tokens/],
    ["a raw prompt with a system message", () => ollama.generate({ model: MODEL, prompt: "x", raw: true,
      system: "Be brief.", stream: false }), 400, /'system' cannot be given with raw: true/],
    ["top_logprobs out of range", () => chat({ messages: [user("Hi")], stream: false, logprobs: true,
      top_logprobs: 21 }), 400, /'top_logprobs' must be between 0 and 20, got 21/],
    ["top_logprobs out of range on a raw prompt", () => ollama.generate({ model: MODEL, prompt: "x",
      raw: true, stream: false, logprobs: true, top_logprobs: 21 }), 400,
      /^'top_logprobs' must be between 0 and 20, got 21$/],
    ["embeddings", () => ollama.embed({ model: MODEL, input: "Hi" }), 400, /does not make embeddings/],
    ["show of an unknown model", () => ollama.show({ model: "llama3" }), 404, /'llama3' does not exist/],
    ["a pull of an unknown model", () => ollama.pull({ model: "llama3", stream: false }), 404,
      /^the model 'llama3' does not exist; this server serves 'torchtpu-demo-random-weights'$/],
    ["a pull without a model", () => ollama.pull({ model: "", stream: false }), 400, /^model is required$/],
    ["a pull with insecure not a boolean",
      () => ollama.pull({ model: MODEL, stream: false, insecure: "yes" }), 400,
      /'insecure' must be a boolean, got a string/],
    ["a pull with stream not a boolean", () => ollama.pull({ model: MODEL, stream: 1 }), 400,
      /'stream' must be a boolean, got /],
    ["create", () => ollama.create({ model: "mine", from: MODEL, stream: false }), 501,
      /^\/api\/create is not supported: this server keeps no model store; it serves the model it/],
    ["copy", () => ollama.copy({ source: MODEL, destination: "mine" }), 501, /^\/api\/copy is not supported/],
    ["delete", () => ollama.delete({ model: MODEL }), 501, /^\/api\/delete is not supported/],
    ["push", () => ollama.push({ model: MODEL, stream: false }), 501, /^\/api\/push is not supported/],
  ];
  for (const [what, call, status, message] of cases) {
    test(`${what}: ${status}, {"error"} naming it`, async () => {
      const e = await failure(call);
      assert.equal(e.name, "ResponseError", String(e));
      assert.equal(e.status_code, status, e.error);
      assert.match(e.error, message);
    });
  }

  test("without the key: 401 in Ollama's shape; a wrong method: 405", async () => {
    const bare = new Ollama({ host: server.url });
    const e = await failure(() => bare.list());
    assert.equal(e.status_code, 401);
    assert.match(e.error, /missing API key/);
    const res = await fetch(`${server.url}/api/chat`, { headers: { authorization: `Bearer ${KEY}` } });
    assert.equal(res.status, 405);
    assert.equal(res.headers.get("allow"), "POST");
    assert.match((await res.json()).error, /GET is not allowed on \/api\/chat/);
  });

  test("the blobs a create uploads first: 501", async () => {
    const digest = `sha256:${"0".repeat(64)}`;
    for (const method of ["HEAD", "POST"]) {
      const res = await fetch(`${server.url}/api/blobs/${digest}`, {
        method, headers: { authorization: `Bearer ${KEY}` }, body: method === "POST" ? "x" : undefined,
      });
      assert.equal(res.status, 501, method);
      if (method === "POST") {
        assert.match((await res.json()).error, /^\/api\/blobs\/sha256:0+ is not supported/);
      }
    }
  });

  test("a streamed answer is newline-delimited JSON", async () => {
    const res = await fetch(`${server.url}/api/generate`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, prompt: "Say hello" }),
    });
    assert.equal(res.headers.get("content-type"), "application/x-ndjson");
    const lines = (await res.text()).trim().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines.map((l) => l.response).join(""), "Hello there, friend.");
    assert.equal(lines.at(-1).done, true);
  });
});
