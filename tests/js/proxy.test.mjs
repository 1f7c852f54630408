// `torchtpu-cpp proxy` in front of two demo servers: it finds server A through an upstream command,
// passes a stream (server-sent events, and Ollama's newline-delimited JSON) and an upload through,
// cancels A's decode when its own client aborts, and when A stops and the command names B, the
// next request goes through B.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { eventually, metric, metrics, startProxy, startServer, tempDir, wav } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
let a;
let b;
let proxy;
let proxyUrl;
let dir;
let upstreamFile;

before(async () => {
  [a, b] = await Promise.all([startServer(["--context", "2048"]), startServer(["--context", "2048"])]);
  dir = tempDir("torchtpu-proxy-");
  upstreamFile = path.join(dir, "upstream");
  fs.writeFileSync(upstreamFile, `${a.url}\n`);
  // What a cloud CLI query would do: print some chatter, then the address on the last line.
  const script = path.join(dir, "find-upstream.sh");
  fs.writeFileSync(script, `#!/bin/sh\necho "looking up the server" >&2\necho "found:"\ncat "${upstreamFile}"\n`);
  proxy = startProxy(["--upstream-cmd", `sh ${script}`]);
  proxyUrl = await proxy.url;
});

after(async () => {
  if (proxy && proxy.child.exitCode === null) {
    proxy.child.kill("SIGTERM");
    assert.equal(await proxy.exited, 0);
  }
  await Promise.all([a, b].filter(Boolean).map((s) => s.stop()));
});

const messages = [{ role: "user", content: "Say something about rivers." }];

test("the proxy serves the chat page and reports its upstream", async () => {
  const page = await fetch(`${proxyUrl}/`);
  assert.equal(page.status, 200);
  assert.match(await page.text(), /<script src="\/web\/chat.js"/);
  const status = await (await fetch(`${proxyUrl}/proxy/status`)).json();
  assert.equal(status.upstream, a.url);
  assert.equal(status.upstream_health_status, 200);
});

test("the proxy's MCP tools read no files: a path in ask's images is refused unread", async () => {
  const res = await fetch(`${proxyUrl}/mcp`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" },
    body: JSON.stringify({
      jsonrpc: "2.0", id: 1, method: "tools/call",
      params: { name: "ask", arguments: { prompt: "What is this?", images: ["/etc/passwd"] } },
    }),
  });
  assert.equal(res.status, 200);
  const { result } = await res.json();
  assert.equal(result.isError, true);
  assert.equal(
    result.content[0].text,
    "'images[0]' names a file, and the proxy's MCP tools read no files; use the tools over stdio " +
      "(`torchtpu-cpp mcp --url PROXY`), where they read the caller's own files, or the upstream " +
      "server's /mcp if it was started with --mcp-media-dir",
  );
});

test("a stream passes through whole", async () => {
  const client = new OpenAI({ apiKey: "none", baseURL: `${proxyUrl}/v1`, maxRetries: 0 });
  const direct = new OpenAI({ apiKey: "none", baseURL: a.baseURL, maxRetries: 0 });
  const whole = await direct.chat.completions.create({ model: MODEL, messages, max_tokens: 16 });
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, stream: true });
  let text = "";
  let chunks = 0;
  let finish;
  for await (const chunk of stream) {
    chunks += 1;
    text += chunk.choices[0]?.delta?.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.ok(chunks > 3);
  assert.equal(finish, "length");
  assert.equal(text, whole.choices[0].message.content);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
});

test("an upload (multipart/form-data) passes through whole", async () => {
  // The demo has no audio encoder: the upstream's 400 names the clip, so the file reached it,
  // with its name (a WAV it told apart by its bytes) and the form's other fields.
  const body = new FormData();
  body.append("model", MODEL);
  body.append("file", new Blob([Buffer.from(wav(), "base64")]), "clip.wav");
  body.append("language", "xx");
  const res = await fetch(`${proxyUrl}/v1/audio/transcriptions`, { method: "POST", body });
  assert.equal(res.status, 400);
  const error = (await res.json()).error;
  assert.equal(error.param, "language", error.message);
  body.set("language", "fr");
  const again = await fetch(`${proxyUrl}/v1/audio/transcriptions`, { method: "POST", body });
  assert.equal(again.status, 400);
  assert.match((await again.json()).error.message, /'file' is audio, and this checkpoint has no/);
});

test("a client abort through the proxy cancels the decode upstream", async () => {
  const cancelled = metric(await metrics(a.url), "torchtpu_requests_cancelled_total");
  const controller = new AbortController();
  const res = await fetch(`${proxyUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: 4000, stream: true }),
    signal: controller.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();
  await reader.read();
  controller.abort();
  await eventually(
    async () => metric(await metrics(a.url), "torchtpu_requests_cancelled_total") === cancelled + 1,
    "A's cancel counter to move by one",
  );
});

test("an upstream that dies mid-stream breaks the client's stream off too", async () => {
  const c = await startServer(["--context", "2048"]);
  const direct = startProxy(["--upstream", c.url]);
  try {
    const res = await fetch(`${await direct.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages, max_tokens: 4000, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();
    c.child.kill("SIGKILL");
    // Read to the end: a stream the proxy ended cleanly would resolve with done, without [DONE].
    await assert.rejects(async () => {
      for (;;) if ((await reader.read()).done) return;
    });
  } finally {
    direct.child.kill("SIGTERM");
    await direct.exited;
    await c.stop();
  }
});

test("an Ollama stream (newline-delimited JSON) passes through as it is made", async () => {
  const cancelled = metric(await metrics(a.url), "torchtpu_requests_cancelled_total");
  const controller = new AbortController();
  const res = await fetch(`${proxyUrl}/api/generate`, {
    method: "POST",
    body: JSON.stringify({ model: MODEL, prompt: "Say something about rivers.", options: { num_predict: 4000 } }),
    signal: controller.signal,
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "application/x-ndjson");
  // Lines arrive while the decode goes on: a buffered answer would come only at its end.
  const reader = res.body.getReader();
  let text = "";
  while (text.split("\n").length < 3) text += new TextDecoder().decode((await reader.read()).value);
  const [first] = text.split("\n");
  assert.equal(JSON.parse(first).done, false);
  controller.abort();
  await eventually(
    async () => metric(await metrics(a.url), "torchtpu_requests_cancelled_total") === cancelled + 1,
    "A's cancel counter to move by one",
  );
});

test("when A stops, the command is asked again and the request goes to B", async () => {
  await a.stop();
  fs.writeFileSync(upstreamFile, `${b.url}/v1\n`);
  const before = metric(await metrics(b.url), "torchtpu_generated_tokens_total");
  const client = new OpenAI({ apiKey: "none", baseURL: `${proxyUrl}/v1`, maxRetries: 0 });
  const answer = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8 });
  assert.equal(answer.choices[0].finish_reason, "length");
  assert.equal(metric(await metrics(b.url), "torchtpu_generated_tokens_total"), before + 8);
  const status = await (await fetch(`${proxyUrl}/proxy/status`)).json();
  assert.equal(status.upstream, b.url);
  assert.equal(status.upstream_health_status, 200);
  assert.equal(status.lookups, 2);
});

test("an upstream command that fails, or hangs, is named with what became of it", async () => {
  for (const [command, words] of [
    ["echo oops; exit 3", "exited with status 3"],
    ["kill -9 $$", "was killed by signal 9"],
    ["true", "printed no URL"],
    ["echo 'no server is up yet'", 'printed "no server is up yet" on its last line, not an http:// URL'],
    ["sleep 100", "ran past 1 s and was killed"],
  ]) {
    const failing = startProxy(["--upstream-cmd", command, "--upstream-cmd-timeout", "1"]);
    try {
      const res = await fetch(`${await failing.url}/v1/models`);
      assert.equal(res.status, 502);
      assert.equal((await res.json()).error.message.includes(`the upstream command '${command}' ${words}`),
        true, command);
    } finally {
      failing.child.kill("SIGTERM");
      await failing.exited;
    }
  }
});
