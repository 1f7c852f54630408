// LoRA adapters through the server (--lora): the tokens PEFT's model decodes with an adapter on the
// demo checkpoint, whether the request names the adapter as its model (vLLM) or scales it in
// `lora` (llama-server); adapters side by side in one batch; the prefix cache kept apart per
// adapter; the server-wide scales of /lora-adapters; adapters loaded and unloaded while serving
// (vLLM's /v1/load_lora_adapter), a running request keeping its adapter; slot files kept apart per
// adapter; the errors of every malformed request.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import {
  cacheDir, cliPath, closedPort, eventually, makeLoraAdapters, startServer, tempDir,
} from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";

let server;
let client;
let adapters;
let want;  // PEFT's text with the first adapter, and transformers' without
let hub;  // the Hub endpoint the server is given: a port nothing listens on

async function detokenize(url, tokens) {
  const res = await fetch(`${url}/detokenize`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tokens }),
  });
  return (await res.json()).content;
}

async function post(pathname, body, url = server.url) {
  const res = await fetch(`${url}${pathname}`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  const text = await res.text();
  // vLLM's load and unload routes answer 200 with plain text, errors with JSON.
  const json = res.headers.get("content-type")?.startsWith("application/json");
  return { status: res.status, text, body: json ? JSON.parse(text) : null };
}

// torchtpu_lora_requests_info's labels, checked equal to vLLM's name's.
async function loraInfo() {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const labels = (name) => {
    const line = text.split("\n").find((l) => l.startsWith(`${name}{`));
    return line.slice(line.indexOf("{"), line.indexOf("}") + 1);
  };
  assert.equal(labels("vllm:lora_requests_info"), labels("torchtpu_lora_requests_info"));
  return labels("torchtpu_lora_requests_info");
}

// The completion of the reference prompt (token ids), greedy, through the official client.
async function complete(fields) {
  const r = await client.completions.create({
    model: MODEL, prompt: adapters.expected.prompt, max_tokens: adapters.expected.tokens.length,
    temperature: 0, ignore_eos: true, ...fields });
  return r.choices[0].text;
}

before(async () => {
  // The first server writes the demo checkpoint the adapters are made for.
  const plain = await startServer(["--context", "256"]);
  await plain.stop();
  adapters = makeLoraAdapters();
  // float32, as PEFT's reference ran; loaded at scale 0, so requests that name none get the base.
  hub = `http://127.0.0.1:${await closedPort()}`;
  server = await startServer(["--context", "512", "--dtype", "float32", "--parallel", "3",
    "--lora", adapters.first, "--lora", `two=${adapters.second}`, "--lora-init-without-apply",
    "--metrics-compat", "vllm", "--max-loras", "3", "--runtime-lora"],
  { env: { HF_ENDPOINT: hub, HF_HUB_CACHE: tempDir("torchtpu-lora-hub-"), HF_HUB_OFFLINE: "0" } });
  client = new OpenAI({ apiKey: "none", baseURL: server.baseURL, maxRetries: 0 });
  want = {
    first: await detokenize(server.url, adapters.expected.tokens),
    base: await detokenize(server.url, adapters.expected.base_tokens),
  };
  assert.notEqual(want.first, want.base);
});

after(async () => {
  await server?.stop();
});

describe("LoRA adapters", () => {
  test("the server lists its adapters as models and in /lora-adapters and /v1/engine", async () => {
    const listed = await (await fetch(`${server.url}/lora-adapters`)).json();
    assert.deepEqual(listed, [
      { id: 0, name: "first", path: adapters.first, scale: 0 },
      { id: 1, name: "two", path: adapters.second, scale: 0 },
    ]);
    const models = (await client.models.list()).data;
    assert.deepEqual(models.map((m) => m.id), [MODEL, "first", "two"]);
    assert.equal(models[1].parent, MODEL);
    assert.equal(models[1].root, adapters.first);
    assert.equal((await client.models.retrieve("two")).root, adapters.second);
    const engine = await (await fetch(`${server.url}/v1/engine`)).json();
    assert.deepEqual(engine.lora.map((a) => [a.name, a.r, a.lora_alpha]),
      [["first", 8, 16], ["two", 8, 16]]);
    assert.deepEqual(engine.lora[0].targets, ["self_attn.q_proj", "self_attn.k_proj",
      "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]);
  });

  test("an adapter named as the model, or scaled in `lora`, gives PEFT's tokens", async () => {
    assert.equal(await complete({}), want.base);
    assert.equal(await complete({ model: "first" }), want.first);
    assert.equal(await complete({ lora: [{ id: 0, scale: 1 }] }), want.first);
    // `lora` wins over the model's name; scale 0 is the base model.
    assert.equal(await complete({ model: "first", lora: [{ id: 0, scale: 0 }] }), want.base);
    assert.notEqual(await complete({ model: "two" }), want.first);
  });

  test("requests with different adapters side by side answer as each alone", async () => {
    const asks = [{}, { model: "first" }, { model: "two" }, { lora: [{ id: 0, scale: 0.5 }] },
      { model: "first" }];
    const alone = [];
    for (const fields of asks) alone.push(await complete(fields));
    assert.equal(alone[1], want.first);
    assert.equal(new Set(alone).size, 4);
    const together = await Promise.all(asks.map((fields) => complete(fields)));
    assert.deepEqual(together, alone);
  });

  test("the prefix cache reuses a conversation only under the same adapter", async () => {
    const ask = (model, messages) => client.chat.completions.create({
      model, messages, max_tokens: 4, temperature: 0 });
    const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;
    const question = {
      role: "user", content: "A long question about the sea, the tides and the moon." };
    const first = await ask("first", [question]);
    const turn = [question, { role: "assistant", content: first.choices[0].message.content },
      { role: "user", content: "And the rivers?" }];
    // The first turn's state was written under `first`: not for the base model or `two`.
    assert.equal(cached(await ask(MODEL, turn)), 0);
    assert.equal(cached(await ask("two", turn)), 0);
    const hit = await ask("first", turn);
    assert.ok(cached(hit) >= first.usage.prompt_tokens - 1, JSON.stringify(hit.usage));
    const alone = await client.chat.completions.create({
      model: "first", messages: turn, max_tokens: 4, temperature: 0, cache_salt: "fresh" });
    assert.equal(cached(alone), 0);
    assert.equal(hit.choices[0].message.content, alone.choices[0].message.content);
  });

  test("the Responses and Anthropic routes take an adapter by model name", async () => {
    const content = "Say something about rivers.";
    const chat = await client.chat.completions.create({
      model: "first", max_tokens: 8, temperature: 0, messages: [{ role: "user", content }] });
    const base = await client.chat.completions.create({
      model: MODEL, max_tokens: 8, temperature: 0, messages: [{ role: "user", content }] });
    assert.notEqual(chat.choices[0].message.content, base.choices[0].message.content);
    const responses = await post("/v1/responses", {
      model: "first", input: content, max_output_tokens: 8, temperature: 0 });
    assert.equal(responses.status, 200, JSON.stringify(responses.body));
    assert.equal(responses.body.model, MODEL);
    assert.equal(responses.body.output.at(-1).content[0].text, chat.choices[0].message.content);
    const messages = await post("/v1/messages", {
      model: "first", max_tokens: 8, temperature: 0, messages: [{ role: "user", content }] });
    assert.equal(messages.status, 200, JSON.stringify(messages.body));
    assert.equal(messages.body.content[0].text, chat.choices[0].message.content);
  });

  test("POST /lora-adapters sets the scales of requests that name no adapter", async () => {
    try {
      const set = await post("/lora-adapters", [{ id: 0, scale: 1 }]);
      assert.equal(set.status, 200);
      assert.deepEqual(set.body.map((a) => a.scale), [1, 0]);
      assert.equal(await complete({}), want.first);
      assert.equal(await complete({ model: "two" }),
        await complete({ lora: [{ id: 1, scale: 1 }] }));
    } finally {
      const reset = await post("/lora-adapters", []);
      assert.deepEqual(reset.body.map((a) => a.scale), [0, 0]);
    }
    assert.equal(await complete({}), want.base);
  });

  test("vllm:lora_requests_info names the adapters running requests apply", async () => {
    const info = loraInfo;
    const idle = '{max_lora="3",running_lora_adapters="",waiting_lora_adapters=""}';
    assert.equal(await info(), idle);
    const controller = new AbortController();
    const stream = await client.completions.create({
      model: "two", prompt: "Once upon a time", max_tokens: 400, ignore_eos: true, stream: true },
      { signal: controller.signal });
    const chunks = stream[Symbol.asyncIterator]();
    await chunks.next();
    assert.equal(await info(),
      '{max_lora="3",running_lora_adapters="two",waiting_lora_adapters=""}');
    controller.abort();
    await chunks.next().catch(() => {});
    await eventually(async () => (await info()) === idle, "the adapter counted out");
  });

  test("malformed adapter requests get a 400 naming the field; the server goes on", async () => {
    const cases = [
      [{ lora: [{ id: 2, scale: 1 }] }, "lora",
        "names adapter 2, which this server never loaded; its adapters: 0 (first), 1 (two)"],
      [{ lora: { id: 0 } }, "lora", "'lora' must be an array"],
      [{ lora: [{ id: 0 }] }, "lora[0].scale", "must be a number, got nothing"],
      [{ lora: [{ id: -1, scale: 1 }] }, "lora[0].id", "an adapter's index from 0"],
      [{ lora: [{ id: 0, scale: 1 }, { id: 0, scale: 2 }] }, "lora[1].id", "names adapter 0 twice"],
    ];
    for (const [fields, param, words] of cases) {
      const r = await post("/v1/completions",
        { model: MODEL, prompt: "Hi", max_tokens: 2, ...fields });
      assert.equal(r.status, 400, JSON.stringify(fields));
      assert.equal(r.body.error.param, param);
      assert.ok(r.body.error.message.includes(words), r.body.error.message);
    }
    const unknown = await post("/v1/chat/completions", {
      model: "third", messages: [{ role: "user", content: "Hi" }] });
    assert.equal(unknown.status, 404);
    assert.ok(unknown.body.error.message.includes("'first' (LoRA), 'two' (LoRA)"),
      unknown.body.error.message);
    const bad = await post("/lora-adapters", [{ id: 7, scale: 1 }]);
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, "id");
    assert.equal(bad.body.error.message, "'id' names adapter 7, which this server never loaded; " +
      "its adapters: 0 (first), 1 (two)");
    const wrongMethod = await fetch(`${server.url}/lora-adapters`, { method: "DELETE" });
    assert.equal(wrongMethod.status, 405);
    assert.equal(wrongMethod.headers.get("allow"), "GET, POST");
    assert.equal(await complete({ model: "first" }), want.first);
  });

  test("an adapter loaded while serving applies to the requests that name it", async () => {
    const names = async () => (await client.models.list()).data.map((m) => m.id);
    const loaded = await post("/v1/load_lora_adapter",
      { lora_name: "late", lora_path: adapters.first });
    assert.equal(loaded.status, 200, loaded.text);
    assert.equal(loaded.text, "Success: LoRA adapter 'late' added successfully.");
    assert.deepEqual(await names(), [MODEL, "first", "two", "late"]);
    assert.equal((await client.models.retrieve("late")).root, adapters.first);
    const engine = await (await fetch(`${server.url}/v1/engine`)).json();
    assert.deepEqual(engine.lora.map((a) => [a.name, a.scale]), [["first", 0], ["two", 0],
      ["late", 0]]);
    assert.ok(engine.storage.some((s) => s.family === "lora late"), JSON.stringify(engine.storage));
    // PEFT's tokens, by name or by id; requests that name no adapter do not apply it.
    assert.equal(await complete({ model: "late" }), want.first);
    assert.equal(await complete({ lora: [{ id: 2, scale: 1 }] }), want.first);
    assert.equal(await complete({}), want.base);
    const full = await post("/v1/load_lora_adapter",
      { lora_name: "fourth", lora_path: adapters.second });
    assert.equal(full.status, 400);
    assert.ok(full.body.error.message.includes("4 LoRA adapters would be loaded, more than " +
      "max_lora (3)"), full.body.error.message);

    // Requests under `late`, one running and one waiting for a row (the other two rows busy),
    // keep it through the unload and answer whole; the unload answers once the waiting one has
    // taken a row.
    const long = (model) => client.completions.create({
      model, prompt: adapters.expected.prompt, max_tokens: 300, temperature: 0, ignore_eos: true,
      stream: true });
    const read = async (chunks, text = "") => {
      let finish;
      for (let c = await chunks.next(); !c.done; c = await chunks.next()) {
        text += c.value.choices[0].text;
        finish = c.value.choices[0].finish_reason ?? finish;
      }
      return { text, finish };
    };
    const running = (await long("late"))[Symbol.asyncIterator]();
    const ran = read(running, (await running.next()).value.choices[0].text);
    const others = (await Promise.all([long(MODEL), long(MODEL)]))
      .map((stream) => read(stream[Symbol.asyncIterator]()));
    const waiting = complete({ model: "late" });
    await eventually(async () => (await loraInfo()).includes('waiting_lora_adapters="late"'),
      "the request under late waiting for a row");
    const unloaded = await post("/v1/unload_lora_adapter", { lora_name: "late" });
    assert.equal(unloaded.status, 200, unloaded.text);
    assert.equal(unloaded.text, "Success: LoRA adapter 'late' removed successfully.");
    assert.deepEqual(await names(), [MODEL, "first", "two"]);
    const { text, finish } = await ran;
    assert.equal(finish, "length");
    assert.ok(text.startsWith(want.first), text);
    assert.equal(await waiting, want.first);
    await Promise.all(others);
    const gone = await post("/v1/completions", { model: "late", prompt: "Hi", max_tokens: 2 });
    assert.equal(gone.status, 404);
    assert.equal(gone.body.error.code, "model_not_found");
    const again = await post("/v1/unload_lora_adapter", { lora_name: "late" });
    assert.equal(again.status, 404);
    assert.equal(again.body.error.message, "the LoRA adapter 'late' is not loaded");

    // Ids are not reused: `late`'s id names no other adapter after its unload, and one loaded
    // later, of the same name too, gets a new id.
    const later = await post("/v1/load_lora_adapter", { lora_name: "late", lora_path: adapters.second });
    assert.equal(later.status, 200, later.text);
    const listed = await (await fetch(`${server.url}/lora-adapters`)).json();
    assert.deepEqual(listed.map((a) => [a.id, a.name]), [[0, "first"], [1, "two"], [3, "late"]]);
    const stale = await post("/v1/completions", { prompt: "Hi", max_tokens: 2, lora: [{ id: 2, scale: 1 }] });
    assert.equal(stale.status, 400);
    assert.equal(stale.body.error.message, "'lora' names adapter 2 ('late'), which was unloaded; " +
      "its adapters: 0 (first), 1 (two), 3 (late)");
    assert.equal(await complete({ lora: [{ id: 3, scale: 1 }] }), await complete({ model: "late" }));
    assert.equal(await complete({ lora: [{ id: 3, scale: 1 }] }), await complete({ model: "two" }));
    assert.equal((await post("/v1/unload_lora_adapter", { lora_name: "late" })).status, 200);
  });

  test("malformed loads and unloads get a precise error; the server goes on", async () => {
    const notPeft = tempDir("torchtpu-not-lora-");
    const cases = [
      ["/v1/load_lora_adapter", { lora_path: adapters.first }, 400, "lora_name",
        "non-empty string \"lora_name\""],
      ["/v1/load_lora_adapter", { lora_name: "x", lora_path: 3 }, 400, "lora_path",
        "non-empty string \"lora_path\""],
      ["/v1/load_lora_adapter", { lora_name: MODEL, lora_path: adapters.first }, 400,
        "lora_name", "is the base model's name"],
      ["/v1/load_lora_adapter", { lora_name: "two", lora_path: adapters.first }, 400,
        "lora_name", "the LoRA adapter 'two' is loaded already"],
      ["/v1/load_lora_adapter", { lora_name: "x", lora_path: "/no/such/dir" }, 404, "lora_path",
        "no directory /no/such/dir on this server"],
      ["/v1/load_lora_adapter", { lora_name: "x", lora_path: notPeft }, 400, "lora_path",
        "has no adapter_config.json"],
      // A Hub id it has not cached while the Hub cannot be reached: the server is its gateway.
      ["/v1/load_lora_adapter", { lora_name: "x", lora_path: "fixture-org/adapter" }, 502,
        "lora_path", `cannot reach the Hub at ${hub}`],
      ["/v1/unload_lora_adapter", {}, 400, "lora_name", "a string \"lora_name\""],
      ["/v1/unload_lora_adapter", { lora_name: "x" }, 404, "lora_name",
        "the LoRA adapter 'x' is not loaded"],
    ];
    for (const [route, body, status, param, words] of cases) {
      const r = await post(route, body);
      assert.equal(r.status, status, `${route} ${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.body.error.param, param);
      assert.ok(r.body.error.message.includes(words), r.body.error.message);
    }
    const wrongMethod = await fetch(`${server.url}/v1/load_lora_adapter`);
    assert.equal(wrongMethod.status, 405);
    assert.equal(wrongMethod.headers.get("allow"), "POST");
    assert.deepEqual((await client.models.list()).data.map((m) => m.id), [MODEL, "first", "two"]);
    assert.equal(await complete({ model: "first" }), want.first);
    // Without --runtime-lora both routes answer 403 naming the flag.
    const fixed = await startServer(["--context", "256", "--lora", adapters.first]);
    try {
      for (const route of ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]) {
        const r = await post(route, { lora_name: "first", lora_path: adapters.first }, fixed.url);
        assert.equal(r.status, 403);
        assert.equal(r.body.error.code, "runtime_lora_disabled");
        assert.ok(r.body.error.message.includes("--runtime-lora"), r.body.error.message);
      }
    } finally {
      await fixed.stop();
    }
  });

  test("a slot saved under an adapter serves that adapter's files alone after a restart",
    async () => {
      const slots = tempDir("torchtpu-lora-slots-");
      const prompt = adapters.expected.prompt;
      const next = [...prompt, 818, 5279, 529];
      const args = (first) => ["--context", "512", "--dtype", "float32", "--parallel", "2",
        "--slot-save-path", slots, "--lora", `first=${first}`, "--lora-init-without-apply"];
      const ask = async (url, model, ids) => {
        const r = await post("/v1/completions", { model, prompt: ids, max_tokens: 4,
          temperature: 0, ignore_eos: true }, url);
        assert.equal(r.status, 200, r.text);
        return { text: r.body.choices[0].text,
          cached: r.body.usage.prompt_tokens_details.cached_tokens };
      };
      let expected;
      const a = await startServer(args(adapters.first));
      try {
        // One token: the row's state is the prompt alone, read under `first`.
        const r = await post("/v1/completions", { model: "first", prompt, max_tokens: 1,
          temperature: 0, id_slot: 1 }, a.url);
        assert.equal(r.status, 200, r.text);
        const saved = await post("/slots/1?action=save", { filename: "first.bin" }, a.url);
        assert.equal(saved.status, 200, saved.text);
        expected = await ask(a.url, "first", next);
        assert.equal(expected.cached, prompt.length);
      } finally {
        await a.stop();
      }
      const restore = async (url) => {
        const r = await post("/slots/1?action=restore", { filename: "first.bin" }, url);
        assert.equal(r.status, 200, r.text);
      };
      const b = await startServer(args(adapters.first));
      try {
        await restore(b.url);
        assert.equal((await ask(b.url, MODEL, next)).cached, 0, "not for the base model");
        assert.deepEqual(await ask(b.url, "first", next), expected);
      } finally {
        await b.stop();
      }
      // The same name over other files: the state is not theirs.
      const c = await startServer(args(adapters.second));
      try {
        await restore(c.url);
        assert.equal((await ask(c.url, "first", next)).cached, 0);
      } finally {
        await c.stop();
      }
    });

  test("a --lora directory that is not a PEFT adapter is refused at start", async () => {
    const empty = tempDir("torchtpu-not-lora-");
    const child = spawn(cliPath(), ["serve", "--port", "0", "--lora", empty],
      { stdio: "pipe", env: { ...process.env, XDG_CACHE_HOME: cacheDir() } });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const code = await new Promise((resolve) => child.on("exit", resolve));
    assert.equal(code, 1, stderr);
    assert.ok(stderr.includes(`LoRA adapter ${empty} has no adapter_config.json`), stderr);
  });
});
