// The engine's scheduler through the official client: concurrent requests are decoded together
// (--parallel rows) and each gets the answer it gets alone; beyond the rows they wait in a FIFO
// queue, and a full queue answers 429 with Retry-After; a conversation's next turn reuses the
// previous turn's KV from the prefix cache and reports it in usage.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { eventually, histogram, metric, metrics, startServer } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
let wide;
let narrow;
let uncached;

before(async () => {
  // float32: a sequence decoded beside others gives exactly the tokens it gives alone (bf16's
  // matmuls may round differently with more rows). `wide` lets prompts admitted in the same step
  // share a pass, which the CPU does not by default; whether any do depends on when the requests
  // arrive (tests/cpp/batch_test.cpp counts the passes).
  [wide, narrow, uncached] = await Promise.all([
    startServer(["--context", "1024", "--max-queue", "16", "--parallel", "4", "--dtype", "float32",
      "--pass-rows", "16"]),
    startServer(["--context", "1024", "--max-queue", "1", "--parallel", "1"]),
    startServer(["--context", "1024", "--cache-mb", "0", "--dtype", "float32"]),
  ]);
});

after(async () => {
  await Promise.all([wide, narrow, uncached].filter(Boolean).map((s) => s.stop()));
});

const topics = ["the ocean", "mountains", "a city at night", "bread", "rain", "a library",
  "trains", "the moon"];

function request(i) {
  const stream = i % 3 === 0;
  return {
    model: MODEL,
    messages: [{ role: "user", content: `Write about ${topics[i % topics.length]} (${i}).` }],
    max_tokens: 4 + ((i * 7) % 29),
    ignore_eos: i % 2 === 0,
    ...(stream ? { stream: true } : {}),
  };
}

async function answer(client, body) {
  const r = await client.chat.completions.create(body);
  if (!body.stream) return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason };
  let text = "";
  let finish;
  for await (const chunk of r) {
    text += chunk.choices[0]?.delta?.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

// Runs `work` while sampling the running and waiting gauges; returns its result and the most
// of each seen.
async function watchingLoad(url, work) {
  const seen = { running: 0, waiting: 0 };
  let done = false;
  const watcher = (async () => {
    while (!done) {
      const m = await metrics(url);
      seen.running = Math.max(seen.running, metric(m, "torchtpu_running_requests"));
      seen.waiting = Math.max(seen.waiting, metric(m, "torchtpu_queue_depth"));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  try {
    return [await work(), seen];
  } finally {
    done = true;
    await watcher;
  }
}

async function concurrentlyAsAlone(bodies) {
  const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  const alone = [];
  for (const body of bodies) alone.push(await answer(client, body));
  const [together, seen] = await watchingLoad(wide.url, () =>
    Promise.all(
      bodies.map((body) =>
        answer(new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 }), body),
      ),
    ),
  );
  assert.deepEqual(together, alone);
  // They were decoded together, 4 at a time, the rest waiting for a row.
  assert.equal(seen.running, 4);
  assert.ok(seen.waiting > 0, JSON.stringify(seen));
  const m = await metrics(wide.url);
  assert.equal(metric(m, "torchtpu_queue_depth"), 0);
  assert.equal(metric(m, "torchtpu_running_requests"), 0);
  assert.equal(metric(m, "torchtpu_requests_cancelled_total"), 0);
}

test("16 concurrent clients with mixed lengths each get the answer they get alone", async () => {
  await concurrentlyAsAlone(Array.from({ length: 16 }, (_, i) => request(i)));
  const { scheduler } = await (await fetch(`${wide.url}/v1/engine`)).json();
  assert.equal(scheduler.pass_rows, 16);
  assert.equal(scheduler.step_tokens, 128 + 4);
});

test("16 concurrent streams, sampled with seeds, each arrive whole", async () => {
  await concurrentlyAsAlone(
    Array.from({ length: 16 }, (_, i) => ({
      ...request(i),
      stream: true,
      temperature: 0.8,
      top_p: 0.9,
      seed: 100 + i,
    })),
  );
});

test("the next turn of a chat reuses the previous turn from the prefix cache", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  const plain = new OpenAI({ apiKey: "none", baseURL: uncached.baseURL, maxRetries: 0 });
  const system = { role: "system", content: "You answer in one short line. ".repeat(20) };
  const turn1 = [system, { role: "user", content: "Name a river." }];
  const first = await client.chat.completions.create({ model: MODEL, messages: turn1, max_tokens: 12 });
  const turn2 = [
    ...turn1,
    { role: "assistant", content: first.choices[0].message.content },
    { role: "user", content: "And a mountain?" },
  ];
  const before = await metrics(wide.url);
  const second = await client.chat.completions.create({ model: MODEL, messages: turn2, max_tokens: 12 });
  // At least the first turn's prompt was not read again: only what follows it.
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= first.usage.prompt_tokens && cached < second.usage.prompt_tokens,
    `cached ${cached} of ${second.usage.prompt_tokens}, first prompt ${first.usage.prompt_tokens}`);
  const after = await metrics(wide.url);
  assert.equal(
    metric(after, "torchtpu_prefix_cache_reused_tokens_total") -
      metric(before, "torchtpu_prefix_cache_reused_tokens_total"),
    cached,
  );
  assert.equal(
    metric(after, "torchtpu_prefix_cache_hits_total") - metric(before, "torchtpu_prefix_cache_hits_total"),
    1,
  );
  // The same answer as a server without the cache reading the whole conversation.
  const fresh = await plain.chat.completions.create({ model: MODEL, messages: turn2, max_tokens: 12 });
  assert.equal(fresh.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(second.choices[0].message.content, fresh.choices[0].message.content);
  const engine = await (await fetch(`${uncached.url}/v1/engine`)).json();
  assert.equal(engine.prefix_cache.budget_bytes, 0);
  assert.equal(engine.parallel, 4);
  // The defaults on the CPU: a pass per prompt, 128 prompt tokens a step beside the 4 rows.
  assert.equal(engine.scheduler.pass_rows, 1);
  assert.equal(engine.scheduler.step_tokens, 128 + 4);
});

// The tokens of the prompt `messages` render to, before the `fromEnd`-th turn from its end (the
// generation prompt's own turn is the first): /apply-template's text cut at a <|turn> marker, a
// special token, so the cut text's tokens are the prompt's.
async function tokensBeforeTurn(messages, fromEnd) {
  const post = (route, body) => fetch(`${wide.url}${route}`, { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }).then((r) => r.json());
  const { prompt } = await post("/apply-template", { model: MODEL, messages });
  const cut = prompt.split("<|turn>").slice(0, -fromEnd).join("<|turn>");
  return (await post("/tokenize", { content: cut, add_special: false })).tokens.length;
}

test("a conversation that parts from another at a turn starts from that turn", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  const plain = new OpenAI({ apiKey: "none", baseURL: uncached.baseURL, maxRetries: 0 });
  const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;
  // Each answer is the one a server without the cache gives.
  const ask = async (messages) => {
    const body = { model: MODEL, messages, max_tokens: 8 };
    const got = await client.chat.completions.create(body);
    assert.equal(got.choices[0].message.content,
      (await plain.chat.completions.create(body)).choices[0].message.content);
    return got;
  };
  // Shorter than a cache block (256 tokens), so no block end inside it was saved.
  const system = { role: "system", content: "You answer briefly and kindly. ".repeat(12) };
  const river = [system, { role: "user", content: "Name a river." }];
  const first = await ask(river);
  // Another conversation with the same system prompt: all of its turn comes from the cache.
  const bird = [system, { role: "user", content: "Name a bird." }];
  const before = await tokensBeforeTurn(bird, 2);
  assert.ok(before > 40 && before < 256, `${before}`);
  assert.equal(cached(await ask(bird)), before);
  // The last message edited: everything before its turn.
  const history = [...river, { role: "assistant", content: first.choices[0].message.content },
    { role: "user", content: "And a lake?" }];
  await ask(history);
  const edited = [...history.slice(0, -1), { role: "user", content: "And a sea?" }];
  assert.equal(cached(await ask(edited)), await tokensBeforeTurn(edited, 2));
});

test("cache_salt: a prompt reuses only what was cached under its own salt", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  // Longer than a cache block (256 tokens): the prompts share the block at its start.
  const system = { role: "system", content: "You answer tenants in one short line. ".repeat(45) };
  const ask = (content, salt) => client.chat.completions.create({ model: MODEL, max_tokens: 4,
    messages: [system, { role: "user", content }], ...(salt ? { cache_salt: salt } : {}) });
  const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;
  const first = await ask("Name a river.", "tenant-a");
  assert.equal(cached(first), 0);
  // The same system prompt under the same salt comes from the cache, up to the user's turn.
  const lake = [system, { role: "user", content: "Name a lake." }];
  assert.equal(cached(await ask("Name a lake.", "tenant-a")), await tokensBeforeTurn(lake, 2));
  // Under another salt, or none, nothing does; the answers are those of the prompt alone.
  const other = await ask("Name a river.", "tenant-b");
  assert.equal(cached(other), 0);
  const none = await ask("Name a river.");
  assert.equal(cached(none), 0);
  assert.equal(other.choices[0].message.content, first.choices[0].message.content);
  assert.equal(none.choices[0].message.content, first.choices[0].message.content);
  // The Responses API takes it too.
  const responses = (salt) => fetch(`${wide.url}/v1/responses`, { method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: MODEL, input: "Name a sea.", instructions: system.content,
      max_output_tokens: 4, cache_salt: salt }) }).then((r) => r.json());
  assert.equal((await responses("tenant-c")).usage.input_tokens_details.cached_tokens, 0);
  // The same prompt again: all of it but the last token, read again for the logits.
  const again = (await responses("tenant-c")).usage;
  assert.equal(again.input_tokens_details.cached_tokens, again.input_tokens - 1);
  for (const [salt, message] of [
    ["", "'cache_salt' must not be empty: leave it out for no salt"],
    [7, "'cache_salt' must be a string, got an integer"],
  ]) {
    const e = await client.chat.completions.create({ model: MODEL, max_tokens: 4,
      messages: [{ role: "user", content: "Hi." }], cache_salt: salt }).catch((x) => x);
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.error.param, "cache_salt");
    assert.equal(e.error.message, message);
  }
});

const messages = [{ role: "user", content: "Hold the engine." }];

// Starts a long stream that keeps `client`'s engine busy (its second chunk proves it is being
// decoded); aborting the returned controller ends it.
async function holdEngine(client) {
  const controller = new AbortController();
  const busy = await client.chat.completions.create(
    { model: MODEL, messages, max_tokens: 1000, ignore_eos: true, stream: true },
    { signal: controller.signal },
  );
  const iterator = busy[Symbol.asyncIterator]();
  await iterator.next();
  await iterator.next();
  return controller;
}

test("a full queue answers 429 with Retry-After; queued work still completes", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
  const controller = await holdEngine(client);
  // One request waits in the queue (--max-queue 1) ...
  const queued = client.chat.completions.create({ model: MODEL, messages, max_tokens: 3 });
  await eventually(async () => metric(await metrics(narrow.url), "torchtpu_queue_depth") === 1,
    "the second request to wait in the queue");
  // ... so a third is turned away.
  const third = await client.chat.completions
    .create({ model: MODEL, messages, max_tokens: 3 })
    .withResponse()
    .catch((e) => e);
  assert.ok(third instanceof OpenAI.RateLimitError, String(third));
  assert.equal(third.status, 429);
  assert.equal(third.headers.get("retry-after"), "1");
  assert.equal(third.error.type, "rate_limit_error");
  controller.abort();
  const r = await queued;
  assert.equal(r.object, "chat.completion");
});

const TIMINGS = ["request_queue_time", "request_prefill_time", "request_decode_time",
  "e2e_request_latency", "time_to_first_token", "inter_token_latency"];

// The timing histograms of `url`, by the names in TIMINGS.
async function timings(url) {
  const text = await metrics(url);
  return Object.fromEntries(TIMINGS.map((n) => [n, histogram(text, `torchtpu_${n}_seconds`)]));
}

test("the timing histograms: a request's wait for a row, its prompt, its decode, its tokens' gaps",
  async () => {
    const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
    const body = { model: MODEL, prompt: "Count the stars.", max_tokens: 6, ignore_eos: true };
    let before = await timings(narrow.url);
    const started = Date.now();
    const r = await client.completions.create(body);
    const wall = (Date.now() - started) / 1000;
    let now = await timings(narrow.url);
    const delta = (name, field) => now[name][field] - before[name][field];
    assert.equal(r.usage.completion_tokens, 6);
    for (const name of TIMINGS.slice(0, 5)) assert.equal(delta(name, "count"), 1, name);
    // One gap between each two of the 6 tokens, all within the decode.
    assert.equal(delta("inter_token_latency", "count"), 5);
    const gaps = delta("inter_token_latency", "sum");
    const queue = delta("request_queue_time", "sum");
    const prefill = delta("request_prefill_time", "sum");
    const decode = delta("request_decode_time", "sum");
    const e2e = delta("e2e_request_latency", "sum");
    assert.ok(gaps > 0 && gaps <= decode + 1e-6, `gaps ${gaps} s, decode ${decode} s`);
    assert.ok(Math.abs(delta("time_to_first_token", "sum") - (queue + prefill)) < 1e-6);
    assert.ok(queue + prefill + decode <= e2e + 1e-6 && e2e <= wall,
      `queue ${queue}, prefill ${prefill}, decode ${decode}, e2e ${e2e}, client ${wall} s`);

    // A request queued behind one that holds the only row waits at least as long as it is held.
    const controller = await holdEngine(client);
    before = await timings(narrow.url);
    const queued = client.completions.create({ ...body, max_tokens: 2 });
    await eventually(async () => metric(await metrics(narrow.url), "torchtpu_queue_depth") === 1,
      "the request to wait in the queue");
    const heldFrom = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 400));
    controller.abort();
    const held = (Date.now() - heldFrom) / 1000;
    await queued;
    // Both end: the holder, left by its client, and the one that waited.
    await eventually(async () => {
      now = await timings(narrow.url);
      return delta("e2e_request_latency", "count") === 2;
    }, "both requests to be counted");
    assert.equal(delta("request_queue_time", "count"), 2);
    assert.ok(delta("request_queue_time", "sum") >= held, `${delta("request_queue_time", "sum")}`);
    // The request that waited is counted in a bucket above 0.3 s (how soon the holder got its
    // row is the server's speed, not asserted).
    const above = (h) => h.le["+Inf"] - h.le["0.3"];
    assert.ok(above(now.request_queue_time) - above(before.request_queue_time) >= 1);
  });

// Every choice's text, by index, from a whole answer or a stream of chunks.
async function choicesOf(response, stream, chat) {
  const piece = (c) => (chat ? (stream ? c.delta?.content : c.message.content) : c.text) ?? "";
  if (!stream) {
    return {
      texts: response.choices.map(piece),
      finishes: response.choices.map((c) => c.finish_reason),
      indexes: response.choices.map((c) => c.index),
      usage: response.usage,
    };
  }
  const texts = [];
  const finishes = [];
  let usage;
  for await (const chunk of response) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] ?? "") + piece(c);
      if (c.finish_reason) {
        assert.equal(finishes[c.index], undefined, `choice ${c.index} finished twice`);
        finishes[c.index] = c.finish_reason;
      }
    }
  }
  return { texts, finishes, indexes: texts.map((_, i) => i), usage };
}

for (const chat of [true, false]) {
  for (const stream of [false, true]) {
    test(`n choices (${chat ? "chat" : "completions"}, stream: ${stream}): choice i is what seed + i gives alone`, async () => {
      const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
      // The answers alone come from the server without a cache, so that no state of this prompt
      // is in `wide`'s cache before the n choices; the prompt is each case's own for the same
      // reason.
      const plain = new OpenAI({ apiKey: "none", baseURL: uncached.baseURL, maxRetries: 0 });
      const create = (body, on = client) =>
        chat
          ? on.chat.completions.create({ ...body, messages: [{ role: "user", content: `Tell me a story (${stream}).` }] })
          : on.completions.create({ ...body, prompt: `Once upon a time (${stream})` });
      const base = { model: MODEL, max_tokens: 10, ignore_eos: true, temperature: 1, top_k: 50 };
      const alone = [];
      for (const seed of [40, 41, 42]) {
        alone.push(await choicesOf(await create({ ...base, seed }, plain), false, chat));
      }
      const before = await metrics(wide.url);
      const n = await choicesOf(
        await create({ ...base, seed: 40, n: 3, ...(stream ? { stream, stream_options: { include_usage: true } } : {}) }),
        stream,
        chat,
      );
      // The prompt was read once: choices 1 and 2 started from choice 0's state before its last
      // token.
      assert.equal(
        metric(await metrics(wide.url), "torchtpu_prefix_cache_reused_tokens_total") -
          metric(before, "torchtpu_prefix_cache_reused_tokens_total"),
        2 * (n.usage.prompt_tokens - 1),
      );
      assert.deepEqual(n.indexes, [0, 1, 2]);
      assert.deepEqual(n.texts, alone.map((a) => a.texts[0]));
      assert.deepEqual(n.finishes, ["length", "length", "length"]);
      // Three different draws: the seeds differ, so the choices do (10 tokens of 262,144 apiece).
      assert.equal(new Set(n.texts).size, 3, JSON.stringify(n.texts));
      // The prompt counts once, every choice's tokens count.
      assert.equal(n.usage.prompt_tokens, alone[0].usage.prompt_tokens);
      assert.equal(n.usage.completion_tokens, 30);
      const m = await metrics(wide.url);
      assert.equal(metric(m, "torchtpu_running_requests"), 0);
      assert.equal(metric(m, "torchtpu_queue_depth"), 0);
    });
  }
}

for (const stream of [false, true]) {
  test(`several prompts in one completions request (stream: ${stream}): prompt p's choice j is what it gives alone with seed + j`, async () => {
    const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
    const prompts = [`The tide (${stream})`, `A lantern (${stream})`, [2, 651, 1210, 603, 7]];
    const base = { model: MODEL, max_tokens: 8, ignore_eos: true, temperature: 1, top_k: 50 };
    const alone = [];
    for (const prompt of prompts) {
      for (const seed of [60, 61]) {
        alone.push(await choicesOf(await client.completions.create({ ...base, prompt, seed }), false, false));
      }
    }
    const all = await choicesOf(
      await client.completions.create({
        ...base, prompt: prompts, seed: 60, n: 2, ...(stream ? { stream, stream_options: { include_usage: true } } : {}),
      }),
      stream,
      false,
    );
    assert.deepEqual(all.indexes, [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(all.texts, alone.map((a) => a.texts[0]));
    assert.deepEqual(all.finishes, Array(6).fill("length"));
    // Each prompt counts once, every choice's tokens count.
    assert.equal(all.usage.prompt_tokens, alone[0].usage.prompt_tokens + alone[2].usage.prompt_tokens +
      alone[4].usage.prompt_tokens);
    assert.equal(all.usage.completion_tokens, 48);
    const m = await metrics(wide.url);
    assert.equal(metric(m, "torchtpu_running_requests"), 0);
    assert.equal(metric(m, "torchtpu_queue_depth"), 0);
  });
}

test("a completions request's prompts are checked one by one and must fit the rows and the queue together", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
  const body = { model: MODEL, max_tokens: 2 };
  for (const [prompt, n, param, why] of [
    [["a", "b", "c"], 1, "prompt", /'prompt' lists 3 prompts of 1 choices each \('n'\), .*at most 2 choices$/],
    [Array(65).fill("a"), 2, "prompt", /'prompt' lists 65 prompts of 2 choices each \('n'\): at most 128 choices in all/],
    [["a", 5], 1, "prompt[1]", /'prompt\[1\]' must be a string or an array of token ids, got an integer/],
    [["a", ""], 1, "prompt[1]", /'prompt\[1\]' must not be empty/],
    [[[2, 3], []], 1, "prompt[1]", /'prompt\[1\]' must not be empty/],
    [["a", [2, 99999999]], 1, "prompt[1]", /99999999/],
  ]) {
    const e = await client.completions.create({ ...body, prompt, n }).catch((err) => err);
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.error.param, param);
    assert.match(e.error.message, why);
  }
  const m = await metrics(narrow.url);
  assert.equal(metric(m, "torchtpu_queue_depth"), 0);
  assert.equal(metric(m, "torchtpu_running_requests"), 0);
  const two = await client.completions.create({ ...body, prompt: ["a", "b"] });
  assert.equal(two.choices.length, 2);
});

test("n greedy choices are one answer n times; n beyond the rows and the queue is a 400", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
  const body = { model: MODEL, messages: [{ role: "user", content: "Count." }], max_tokens: 6 };
  const one = await client.chat.completions.create(body);
  // --parallel 1 --max-queue 1: the second choice waits for the first's row.
  const two = await client.chat.completions.create({ ...body, n: 2 });
  assert.deepEqual(two.choices.map((c) => c.message.content), [1, 2].map(() => one.choices[0].message.content));
  assert.equal(two.usage.completion_tokens, 2 * one.usage.completion_tokens);
  for (const [n, why] of [[3, /'n' is 3, .*at most 2 choices/], [0, /'n' must be between 1 and 128, got 0/],
    [129, /'n' must be between 1 and 128, got 129/]]) {
    const e = await client.chat.completions.create({ ...body, n }).catch((err) => err);
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.error.param, "n");
    assert.match(e.error.message, why);
  }
  const m = await metrics(narrow.url);
  assert.equal(metric(m, "torchtpu_queue_depth"), 0);
  assert.equal(metric(m, "torchtpu_running_requests"), 0);
});

test("choices the queue cannot take whole are a 429 that queues none; leaving cancels them all", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
  const controller = await holdEngine(client);
  // The one row is taken and the queue holds one: two choices do not fit, so neither waits.
  const refused = await client.chat.completions
    .create({ model: MODEL, messages, max_tokens: 3, n: 2 })
    .catch((e) => e);
  assert.ok(refused instanceof OpenAI.RateLimitError, String(refused));
  assert.match(refused.error.message, /the request's 2 sequences do not fit/);
  assert.equal(metric(await metrics(narrow.url), "torchtpu_queue_depth"), 0);
  controller.abort();

  // A streamed request of three choices, left after a few chunks: every choice ends, counted as
  // one cancelled request, and the server goes on.
  const wideClient = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  const cancelled = async () => metric(await metrics(wide.url), "torchtpu_requests_cancelled_total");
  const before = await cancelled();
  const leaving = new AbortController();
  const stream = await wideClient.chat.completions.create(
    { model: MODEL, messages, max_tokens: 1000, ignore_eos: true, stream: true, n: 3 },
    { signal: leaving.signal },
  );
  let seen = 0;
  for await (const chunk of stream) {
    if (chunk.choices[0].delta.content && ++seen === 6) leaving.abort();
  }
  await eventually(async () => metric(await metrics(wide.url), "torchtpu_running_requests") === 0,
    "every choice to end");
  assert.equal(await cancelled(), before + 1);
  const next = await wideClient.chat.completions.create({ model: MODEL, messages, max_tokens: 3 });
  assert.equal(next.choices.length, 1);
});
