// Soak and faults against `torchtpu-cpp serve` on the demo checkpoint, over loopback (issue #16):
// many concurrent clients sending chat and text completions, streamed and whole, a share of them
// leaving mid-answer; SIGTERM under load; slow and oversized requests. Every client is node:http on
// a connection of its own, so leaving means closing that connection.
//
// TORCHTPU_SOAK=short (the default, run by CTest) or long (>= 1,000 requests, documented in
// docs/RELIABILITY.md); TORCHTPU_SOAK_SEED picks the mix. Each run prints one "soak: {...}" line
// with its figures.
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import fs from "node:fs";
import { after, before, describe, test } from "node:test";
import { eventually, metric, metrics, startServer } from "./server_helpers.mjs";

// The warm-up brings the heap to where it levels off (oneDNN's cache of products for the shapes
// the mix meets, glibc's arenas), so that RSS growth over the run is what a leak would add: with
// 96 and 160 warm-up requests the runs still grew 2-8% on their way there (docs/RELIABILITY.md).
const PROFILES = {
  short: { requests: 120, clients: 16, warmup: 192 },
  long: { requests: 1200, clients: 32, warmup: 384 },
};
const PROFILE_NAME = process.env.TORCHTPU_SOAK ?? "short";
const PROFILE = PROFILES[PROFILE_NAME];
if (!PROFILE) throw new Error(`TORCHTPU_SOAK must be short or long, got '${PROFILE_NAME}'`);
const SEED = Number(process.env.TORCHTPU_SOAK_SEED ?? 1);
const ABANDON_SHARE = 0.2;
// Left requests ask for this many tokens, so they are still being decoded when their client goes.
const ABANDONED_MAX_TOKENS = 3000;
const CONTEXT = 4096;
const BODY_LIMIT = 256_000;
// A request that takes longer than this has hung: the longest honest wait is the whole queue.
const HANG_MS = 120_000;

// mulberry32: a small seeded generator, so a failing mix can be replayed.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const topics = ["the ocean", "mountains", "a city at night", "bread", "rain", "a library"];

// Request i with the given shape; a client that leaves goes `leaveAfterMs` after sending (whole)
// or at the first generated text (streamed).
function request(i, { chat, stream, maxTokens, abandon = false, leaveAfterMs = 0 }) {
  const text = `Write about ${topics[i % topics.length]} (${i}).`;
  const body = {
    ...(chat ? { messages: [{ role: "user", content: text }] } : { prompt: text }),
    max_tokens: maxTokens,
    ignore_eos: true,
    ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
  };
  return { path: chat ? "/v1/chat/completions" : "/v1/completions", body, stream, abandon,
    leaveAfterMs };
}

// Request i of a soak run: chat or completion, streamed or whole, left or not, drawn from `rand`.
function plan(rand, i) {
  const chat = rand() < 0.75;
  const stream = rand() < 0.5;
  const abandon = rand() < ABANDON_SHARE;
  const maxTokens = abandon ? ABANDONED_MAX_TOKENS : 1 + Math.floor(rand() * 16);
  const leaveAfterMs = 50 + Math.floor(rand() * 200);
  return request(i, { chat, stream, maxTokens, abandon, leaveAfterMs });
}

// Sends one planned request on a fresh connection. Resolves to {status, text, events, left}; a
// client that leaves resolves once its connection is closed.
function send(url, p) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(p.body);
    const req = http.request(`${url}${p.path}`, {
      method: "POST",
      agent: false,
      headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(payload) },
    });
    const hang = setTimeout(() => {
      req.destroy();
      reject(new Error(`hung: ${p.path} ${payload} got no complete answer in ${HANG_MS} ms`));
    }, HANG_MS);
    const done = (value) => {
      clearTimeout(hang);
      resolve(value);
    };
    const leave = () => {
      req.destroy();
      done({ left: true });
    };
    req.on("error", (e) => {
      if (!req.destroyed || !p.abandon) {
        clearTimeout(hang);
        reject(e);
      }
    });
    req.on("response", (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        text += d;
        // A streaming client leaves once the first generated text has arrived.
        if (p.abandon && p.stream && /"(content|text)":"[^"]/.test(text)) leave();
      });
      res.on("end", () => {
        if (p.abandon) {
          reject(new Error(`the answer to a request left mid-way was completed: ${text}`));
          return;
        }
        done({ status: res.statusCode, text, left: false });
      });
      res.on("error", (e) => (p.abandon ? null : reject(e)));
    });
    req.end(payload, () => {
      if (p.abandon && !p.stream) setTimeout(leave, p.leaveAfterMs);
    });
  });
}

// Throws unless `r` is the complete answer to `p`: status 200, every generated token there.
function checkWhole(p, r) {
  const what = `${p.path} ${JSON.stringify(p.body)}`;
  assert.equal(r.status, 200, `${what}: ${r.text}`);
  if (!p.stream) {
    const body = JSON.parse(r.text);
    assert.equal(body.choices[0].finish_reason, "length", what);
    assert.equal(body.usage.completion_tokens, p.body.max_tokens, what);
    return;
  }
  const events = r.text.split("\n\n").filter((e) => e.length > 0);
  assert.equal(events.at(-1), "data: [DONE]", `${what}: the stream did not end with [DONE]`);
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, "")));
  assert.equal(chunks.at(-2).choices[0].finish_reason, "length", what);
  assert.equal(chunks.at(-1).usage.completion_tokens, p.body.max_tokens, what);
}

function rssBytes(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(status.match(/VmRSS:\s+(\d+) kB/)[1]) * 1024;
}

// Sends `plans` from `clients` concurrent clients; resolves to the count of requests left.
async function run(url, plans, clients) {
  let next = 0;
  let left = 0;
  const client = async () => {
    while (next < plans.length) {
      const p = plans[next++];
      const r = await send(url, p);
      if (r.left) {
        left++;
      } else {
        checkWhole(p, r);
      }
    }
  };
  await Promise.all(Array.from({ length: clients }, client));
  return left;
}

async function cancelled(url) {
  return metric(await metrics(url), "torchtpu_requests_cancelled_total");
}

// Writes `parts` to a fresh loopback connection `gapMs` apart (a slow client), then, with
// `halfClose`, shuts down its sending side (as `nc -N` and Go's CloseWrite do), then reads until
// the server closes it. Resolves to {status, body (parsed JSON or null), ms}.
function rawExchange(url, parts, gapMs, { halfClose = false } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const start = Date.now();
    const socket = net.connect(Number(port), hostname);
    let text = "";
    socket.setEncoding("latin1");
    socket.on("data", (d) => (text += d));
    socket.on("error", reject);
    socket.on("close", () => {
      const status = Number(text.match(/^HTTP\/1\.1 (\d{3})/)?.[1]);
      const body = text.slice(text.indexOf("\r\n\r\n") + 4);
      let json = null;
      try {
        json = JSON.parse(body);
      } catch {}
      resolve({ status, body: json, ms: Date.now() - start });
    });
    (async () => {
      for (const part of parts) {
        if (socket.destroyed) return;
        socket.write(part);
        if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
      }
      if (halfClose && !socket.destroyed) socket.end();
    })();
  });
}

// `text` in pieces of `size` bytes.
function pieces(text, size) {
  const out = [];
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
  return out;
}

function post(path, body, extraHeaders = "") {
  return `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n${extraHeaders}` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

describe(`soak (${PROFILE_NAME}: ${PROFILE.requests} requests, ${PROFILE.clients} clients)`, () => {
  let server;
  before(async () => {
    // A prefix cache the warm-up fills (about 23 KB a request here): RSS is then measured with
    // the cache at its budget, evicting, rather than growing toward the default 1 GiB by design.
    server = await startServer([
      "--context", String(CONTEXT), "--max-queue", String(2 * PROFILE.clients),
      "--max-body-bytes", String(BODY_LIMIT), "--threads", "1", "--cache-mb", "1",
    ]);
  });
  after(async () => {
    if (server) await server.stop();
  });

  test("every request not left is answered whole; cancels = left; RSS holds", async () => {
    const rand = random(SEED);
    const warmup = Array.from({ length: PROFILE.warmup }, (_, i) => plan(rand, i));
    const plans = Array.from({ length: PROFILE.requests }, (_, i) => plan(rand, i));
    // A left request is counted once the engine reaches it, after the requests queued before it:
    // on a loaded machine that took over 30 s once (fresh clone, 2026-11-30), so the bound is the
    // soak's own hang limit.
    // A timeout names what the server showed last, so a lost cancel and a slow queue tell apart.
    const quiet = async (expected) => {
      let seen = "";
      try {
        await eventually(async () => {
          const m = await metrics(server.url);
          const [queued, cancels, running] = ["torchtpu_queue_depth",
            "torchtpu_requests_cancelled_total", "torchtpu_running_requests"].map((n) => metric(m, n));
          seen = `queue ${queued}, cancels ${cancels}, running ${running}; answered: ` +
            m.split("\n").filter((l) => l.startsWith("torchtpu_requests_total{")).join(", ");
          return queued === 0 && cancels >= expected;
        }, `${expected} cancels counted and an empty queue`, HANG_MS);
      } catch (e) {
        throw new Error(`${e.message} (last seen: ${seen})`);
      }
    };

    const start = Date.now();
    const leftInWarmup = await run(server.url, warmup, PROFILE.clients);
    await quiet(leftInWarmup);
    const rssWarm = rssBytes(server.child.pid);
    const runStart = Date.now();
    const left = await run(server.url, plans, PROFILE.clients);
    const runSeconds = (Date.now() - runStart) / 1000;
    await quiet(leftInWarmup + left);
    // Counted late cancels would show up here: give them the time a decode step takes, twice.
    await new Promise((r) => setTimeout(r, 200));
    const counted = await cancelled(server.url);
    const rssAfter = rssBytes(server.child.pid);
    const figures = {
      profile: PROFILE_NAME, seed: SEED, requests: PROFILE.requests, warmup: PROFILE.warmup,
      clients: PROFILE.clients, streamed: plans.filter((p) => p.stream).length, left,
      left_in_warmup: leftInWarmup, cancelled_counter: counted, run_seconds: runSeconds,
      total_seconds: (Date.now() - start) / 1000, rss_after_warmup_mib: rssWarm / 2 ** 20,
      rss_after_run_mib: rssAfter / 2 ** 20, rss_change: rssAfter / rssWarm - 1,
    };
    console.log(`soak: ${JSON.stringify(figures)}`);
    assert.ok(left > 0 && plans.some((p) => p.stream && p.abandon), "the mix left no stream");
    assert.equal(counted, leftInWarmup + left, "the cancel counter counts the requests left");
    assert.ok(rssAfter <= rssWarm * 1.05,
      `RSS grew ${(100 * figures.rss_change).toFixed(1)}% over the run (limit 5%)`);
  });

  test("slow and oversized requests get their status without holding the engine", async () => {
    const chat = JSON.stringify({ messages: [{ role: "user", content: "Hi." }], max_tokens: 4,
      ignore_eos: true });
    const wire = post("/v1/chat/completions", chat);
    const headEnd = wire.indexOf("\r\n\r\n") + 4;
    const deep = `{"messages":[{"role":"user","content":"Hi."}],"chat_template_kwargs":{"a":${
      "[".repeat(100_000)}${"]".repeat(100_000)}}}`;
    const before = metric(await metrics(server.url), "torchtpu_generated_tokens_total");
    const faults = {
      // Headers, then the body, a few bytes every 100 ms: answered once complete.
      trickledHeaders: rawExchange(server.url, pieces(wire.slice(0, headEnd), 6)
        .concat([wire.slice(headEnd)]), 100),
      trickledBody: rawExchange(server.url, [wire.slice(0, headEnd),
        ...pieces(wire.slice(headEnd), 3)], 100),
      // Headers that stop coming: the read timeout (5 s) ends the request.
      stalledHeaders: rawExchange(server.url, [wire.slice(0, 40)], 0),
      longHeaderLine: rawExchange(server.url,
        [post("/v1/chat/completions", chat, `X-Long: ${"a".repeat(9000)}\r\n`)], 0),
      // More header lines than a head may hold (64 KiB), and one line that never ends: a 431,
      // once a limit (the head's, a line's) is passed, however little of a line is left.
      manyHeaderLines: rawExchange(server.url, [post("/v1/chat/completions", chat,
        Array.from({ length: 80 }, (_, i) => `X-Filler-${i}: ${"a".repeat(1000)}\r\n`).join(""))],
      0),
      endlessHeaderLine: rawExchange(server.url,
        [`GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ${"a".repeat(1 << 20)}`], 0),
      longTarget: rawExchange(server.url,
        [post(`/v1/chat/completions?${"a".repeat(9000)}`, chat)], 0),
      bodyOverLimit: rawExchange(server.url, [post("/v1/chat/completions", `{"x":"${
        "a".repeat(BODY_LIMIT)}"}`)], 0),
      deepJson: rawExchange(server.url, [post("/v1/chat/completions", deep)], 0),
      deepMcp: rawExchange(server.url, [post("/mcp", "[".repeat(100_000) + "]".repeat(100_000),
        "Accept: application/json, text/event-stream\r\n")], 0),
      // Neither Content-Length nor Transfer-Encoding (`curl -X POST URL`): no body (RFC 9112),
      // answered at once, not after the read timeout as a malformed request.
      noBodyWake: rawExchange(server.url,
        ["POST /wake_up HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"], 0),
      noBodyChat: rawExchange(server.url,
        ["POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"], 0),
      noBodyCancel: rawExchange(server.url, ["POST /v1/responses/resp_none/cancel HTTP/1.1\r\n" +
        "Host: 127.0.0.1\r\nConnection: close\r\n\r\n"], 0),
      // The same on a route that takes GET only: its 405, not the library's 400 of a body it
      // cannot read.
      noBodyModels: rawExchange(server.url,
        ["POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"], 0),
    };
    // Meanwhile the engine serves everyone else at once: none of the above holds it.
    let probes = 0;
    const pending = Promise.all(Object.values(faults));
    let settled = false;
    pending.finally(() => (settled = true));
    while (!settled) {
      const t = Date.now();
      const probe = request(probes, { chat: true, stream: false, maxTokens: 4 });
      checkWhole(probe, await send(server.url, probe));
      assert.ok(Date.now() - t < 3000, `a request took ${Date.now() - t} ms beside slow clients`);
      probes++;
    }
    const r = Object.fromEntries(
      await Promise.all(Object.entries(faults).map(async ([k, v]) => [k, await v])));
    const seen = Object.fromEntries(Object.entries(r).map(([k, v]) =>
      [k, { status: v.status, code: v.body?.error?.code ?? null, ms: v.ms }]));
    console.log(`faults: ${JSON.stringify({ ...seen, probes })}`);
    assert.equal(r.trickledHeaders.status, 200);
    assert.equal(r.trickledHeaders.body.usage.completion_tokens, 4);
    assert.equal(r.trickledBody.status, 200);
    assert.equal(r.trickledBody.body.usage.completion_tokens, 4);
    assert.deepEqual([r.stalledHeaders.status, r.stalledHeaders.body.error.code],
      [400, "malformed_request"]);
    // One line past the library's bound on a header line (8 KiB), ended or not, before the head's.
    for (const fault of [r.longHeaderLine, r.endlessHeaderLine]) {
      assert.deepEqual([fault.status, fault.body.error],
        [431, { message: "a header line of the request is longer than 8192 bytes",
          type: "invalid_request_error", param: null, code: "request_header_fields_too_large" }]);
    }
    assert.deepEqual([r.longTarget.status, r.longTarget.body.error.code], [414, "uri_too_long"]);
    assert.deepEqual([r.manyHeaderLines.status, r.manyHeaderLines.body.error.message],
      [431, "the request's head (its request line and headers) is larger than 65536 bytes"]);
    assert.deepEqual([r.bodyOverLimit.status, r.bodyOverLimit.body.error.code],
      [413, "request_too_large"]);
    assert.deepEqual([r.deepJson.status, r.deepJson.body.error.code], [400, "json_too_deep"]);
    assert.equal(r.noBodyWake.status, 200);
    assert.deepEqual([r.noBodyChat.status, r.noBodyChat.body.error.code], [400, "invalid_json"]);
    assert.deepEqual([r.noBodyCancel.status, r.noBodyCancel.body.error.code], [404, "not_found"]);
    assert.deepEqual([r.noBodyModels.status, r.noBodyModels.body.error.message],
      [405, "POST is not allowed on /v1/models (use GET)"]);
    assert.equal(r.deepMcp.status, 400);
    assert.match(r.deepMcp.body.error.message, /deeper than 64 levels/);
    assert.ok(probes >= 2, `only ${probes} requests were served beside the slow clients`);
    // Only the probes and the two trickled requests, once complete, reached the engine.
    const after = metric(await metrics(server.url), "torchtpu_generated_tokens_total");
    assert.equal(after - before, 4 * (probes + 2));
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
  });

  // Connections that send nothing (a browser's preconnects, a balancer's pool) each hold one of
  // the server's threads until their head comes or times out: 60 of them must not keep /health
  // from answering while they are still open.
  test("/health answers while 60 connections sit idle", async () => {
    const { hostname, port } = new URL(server.url);
    const open = () => new Promise((resolve, reject) => {
      const socket = net.connect(Number(port), hostname, () => resolve(socket));
      socket.on("error", reject);
    });
    const idle = await Promise.all(Array.from({ length: 60 }, open));
    const closed = idle.map((socket) => new Promise((resolve) => socket.on("close", resolve)));
    let closedFirst = 0;
    for (const c of closed) c.then(() => closedFirst++);
    try {
      assert.equal((await fetch(`${server.url}/health`)).status, 200);
      assert.equal(closedFirst, 0, "idle connections were timed out before /health was answered");
    } finally {
      for (const socket of idle) socket.destroy();
    }
  });

  // A shut-down sending side cannot be told from a client gone (both are a FIN until an answer is
  // written), and a generation is cancelled when its client goes, as llama-server's is: the
  // client that only half-closed reads a 499 saying so; other routes answer it.
  test("a client that shuts down its sending side gets a 499 that says why", async () => {
    const chat = JSON.stringify({ messages: [{ role: "user", content: "Hi." }], max_tokens: 400,
      ignore_eos: true });
    const r = await rawExchange(server.url, [post("/v1/chat/completions", chat)], 0,
      { halfClose: true });
    assert.deepEqual([r.status, r.body.error], [499, {
      message: "the client closed the connection before its answer was complete (one that only " +
        "shuts down its sending side is taken as gone too)",
      type: "invalid_request_error", param: null, code: "client_closed_request" }]);
    const models = await rawExchange(server.url,
      ["GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"], 0,
      { halfClose: true });
    assert.equal(models.status, 200);
  });
});

// The drain (issue #21): SIGTERM turns /health to 503 at once while requests are still served for
// --drain-grace seconds (routers need that long to stop sending); after the grace new requests
// get 503 shutting_down, every request accepted before is answered whole, and the exit status is
// 0. Timing margins cover only the trip of a request over loopback on a busy machine.
describe("SIGTERM under load", () => {
  test("readiness 503 first, requests served through the grace, 503 after it, none lost, exit 0",
    async () => {
      const GRACE_MS = 2000;
      const MARGIN_MS = 300;
      const server = await startServer(["--context", "1024", "--max-queue", "64", "--threads", "1",
        "--drain-grace", String(GRACE_MS / 1000)]);
      const inFlight = Array.from({ length: 12 }, (_, i) =>
        request(i, { chat: i % 3 !== 0, stream: i % 2 === 0, maxTokens: 48 }));
      let answered = 0;
      const track = (promise) => promise.then((r) => {
        answered++;
        return r;
      });
      const answers = inFlight.map((p) => track(send(server.url, p)));
      // Signal once all twelve are in (one decoding, the rest waiting) and tokens flow.
      const admitted = async (count) => {
        const m = await metrics(server.url);
        return metric(m, "torchtpu_running_requests") + metric(m, "torchtpu_queue_depth") +
          answered === count && metric(m, "torchtpu_generated_tokens_total") > 8;
      };
      await eventually(() => admitted(inFlight.length), "every in-flight request admitted");
      // Last in the queue, one long request keeps the engine busy past the grace, so requests
      // after it meet a server that is still up.
      const anchor = request(12, { chat: false, stream: true, maxTokens: 900 });
      inFlight.push(anchor);
      answers.push(track(send(server.url, anchor)));
      await eventually(() => admitted(inFlight.length), "the long request admitted");

      server.child.kill("SIGTERM");
      const t0 = Date.now();
      let ready;
      await eventually(async () => {
        ready = await fetch(`${server.url}/health`);
        return ready.status === 503;
      }, "readiness to turn 503", 2000);
      const tReady = Date.now() - t0;
      assert.equal((await ready.json()).status, "draining");

      // Requests every 100 ms through the grace and well past it, until three have been refused
      // and three were sent well past it. Counted, not timed: on a loaded machine a 100 ms timer
      // can fire far later, and the refusals of the uncertain span just after the grace must not
      // end the probing before any request meets the closed server.
      const probes = [];
      let refused = 0;
      let sentPast = 0;
      let anchorDone = false;
      answers.at(-1).then(() => (anchorDone = true), () => (anchorDone = true));
      const past = tReady + GRACE_MS + MARGIN_MS;
      for (let i = 0; refused < 3 || sentPast < 3; i++) {
        assert.ok(!anchorDone, "the engine finished everything before the grace ended: raise the " +
          "long request's max_tokens");
        const p = request(100 + i, { chat: i % 2 === 0, stream: i % 3 === 0, maxTokens: 4 });
        const sentAt = Date.now() - t0;
        if (sentAt > past) sentPast++;
        probes.push({ p, sentAt, answer: send(server.url, p).then((r) => {
          if (r.status === 503) refused++;
          return r;
        }) });
        await new Promise((r) => setTimeout(r, 100));
      }
      const stopping = await fetch(`${server.url}/health`);
      assert.deepEqual([stopping.status, (await stopping.json()).status], [503, "stopping"]);

      let during = 0;
      for (const { p, sentAt, answer } of probes) {
        const r = await answer;
        const what = `a request sent ${sentAt} ms after SIGTERM (readiness 503 at ${tReady} ms)`;
        if (r.status === 200) checkWhole(p, r);
        if (sentAt < GRACE_MS - MARGIN_MS) {
          assert.equal(r.status, 200, `${what} was refused during the grace: ${r.text}`);
          during++;
        } else if (sentAt > past) {  // three or more: the probing loop saw to it
          assert.equal(r.status, 503, `${what} was accepted after the grace`);
          assert.equal(JSON.parse(r.text).error.code, "shutting_down");
        } else {
          assert.ok(r.status === 200 || r.status === 503, `${what}: ${r.status} ${r.text}`);
        }
      }
      assert.ok(during >= 10, `only ${during} requests were sent during the grace`);
      for (const [i, r] of (await Promise.all(answers)).entries()) checkWhole(inFlight[i], r);
      const { code, signal } = await server.exited;
      assert.deepEqual({ code, signal }, { code: 0, signal: null });
      await assert.rejects(fetch(`${server.url}/health`), /fetch failed/);
    });
});
