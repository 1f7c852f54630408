// One engine thread behind a FIFO queue: concurrent clients all get their own answer, and a full
// queue answers 429 with Retry-After.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { eventually, metric, metrics, startServer } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
let wide;
let narrow;

before(async () => {
  [wide, narrow] = await Promise.all([
    startServer(["--context", "1024", "--max-queue", "16"]),
    startServer(["--context", "1024", "--max-queue", "1"]),
  ]);
});

after(async () => {
  await Promise.all([wide, narrow].filter(Boolean).map((s) => s.stop()));
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

test("16 concurrent clients with mixed lengths each get their sequential answer", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 });
  const bodies = Array.from({ length: 16 }, (_, i) => request(i));
  const sequential = [];
  for (const body of bodies) sequential.push(await answer(client, body));
  const concurrent = await Promise.all(
    bodies.map((body) => answer(new OpenAI({ apiKey: "none", baseURL: wide.baseURL, maxRetries: 0 }), body)),
  );
  assert.deepEqual(concurrent, sequential);
  const m = await metrics(wide.url);
  assert.equal(metric(m, "torchtpu_queue_depth"), 0);
  assert.equal(metric(m, "torchtpu_requests_cancelled_total"), 0);
});

test("a full queue answers 429 with Retry-After; queued work still completes", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: narrow.baseURL, maxRetries: 0 });
  const messages = [{ role: "user", content: "Hold the engine." }];
  // A long stream keeps the engine busy; its second chunk proves it is being decoded.
  const controller = new AbortController();
  const busy = await client.chat.completions.create(
    { model: MODEL, messages, max_tokens: 1000, ignore_eos: true, stream: true },
    { signal: controller.signal },
  );
  const iterator = busy[Symbol.asyncIterator]();
  await iterator.next();
  await iterator.next();
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
