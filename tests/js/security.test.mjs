// The claims of docs/RELIABILITY.md, "Security review", that concern the server and the proxy:
// loopback by default, --api-key on every route that generates or reveals anything, the proxy's
// own key, and the chat page's Content-Security-Policy.
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import zlib from "node:zlib";
import { after, before, describe, test } from "node:test";
import { closedPort, startProxy, startServer } from "./server_helpers.mjs";

const KEY = "sk-server-key";
let server;

before(async () => {
  // No --host: the default is what is under test.
  server = await startServer(["--api-key", KEY, "--context", "512", "--threads", "1"]);
});

after(async () => {
  if (server) await server.stop();
});

// Every route that generates, reveals or changes anything, with a body that it would otherwise
// accept (or a status it answers with the key: the runtime LoRA routes are off on this server).
const chat = { messages: [{ role: "user", content: "Hi." }], max_tokens: 2 };
// /metrics is not among them: routers scrape it without credentials (--metrics-auth guards it,
// scale.test.mjs).
const guarded = [
  ["GET", "/v1/models"],
  ["GET", "/v1/models/torchtpu-demo-random-weights"],
  ["GET", "/v1/engine"],
  ["POST", "/v1/chat/completions", chat],
  ["POST", "/v1/completions", { prompt: "Hi.", max_tokens: 2 }],
  ["POST", "/tokenize", { content: "Hi." }],
  ["POST", "/detokenize", { tokens: [2] }],
  ["POST", "/mcp", { jsonrpc: "2.0", id: 1, method: "tools/list" }],
  ["POST", "/v1/responses", { input: "Hi.", max_output_tokens: 2, store: false }],
  ["POST", "/v1/messages", { max_tokens: 2, messages: [{ role: "user", content: "Hi." }] }],
  ["POST", "/v1/messages/count_tokens", { messages: [{ role: "user", content: "Hi." }] }],
  ["GET", "/lora-adapters"],
  ["POST", "/lora-adapters", []],
  ["POST", "/v1/load_lora_adapter", { lora_name: "x", lora_path: "/tmp" }, 403],
  ["POST", "/v1/unload_lora_adapter", { lora_name: "x" }, 403],
  ["POST", "/api/chat", { model: "torchtpu-demo-random-weights", stream: false, ...chat }],
  ["POST", "/api/generate", { model: "torchtpu-demo-random-weights", prompt: "Hi.", stream: false,
    options: { num_predict: 2 } }],
  ["GET", "/api/tags"],
  ["POST", "/api/show", { model: "torchtpu-demo-random-weights" }],
  ["GET", "/api/ps"],
  ["GET", "/api/version"],
  ["GET", "/is_sleeping"],
  ["POST", "/sleep"],
  ["POST", "/wake_up"],
  // The key is checked before the body: this one wants a multipart upload.
  ["POST", "/v1/audio/transcriptions", { file: "x" }, 400],
  // An unknown route does not tell a client without the key whether it exists.
  ["GET", "/no/such/route"],
];

// node:http, which (unlike fetch) sends the Host and Origin it is given, as a rebinding or
// cross-site page's browser would. Resolves to {status, body}.
function rawCall(url, method, path, headers, body) {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${path}`, { method, headers, agent: false }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers,
        body: text ? JSON.parse(text) : null }));
    });
    req.on("error", reject);
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

// A browser's preflights to `url`: a development UI on another local port is allowed without the
// key (no preflight carries one), another site's page is the 403 its request would get.
async function checkPreflights(url) {
  const preflight = (origin) => rawCall(url, "OPTIONS", "/v1/chat/completions", {
    Origin: origin, "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
  });
  const local = await preflight("http://localhost:3000");
  assert.equal(local.status, 204);
  assert.equal(local.headers["access-control-allow-origin"], "http://localhost:3000");
  assert.equal(local.headers["access-control-allow-headers"], "authorization, content-type");
  assert.match(local.headers["access-control-allow-methods"], /\bPOST\b/);
  const evil = await preflight("http://evil.example");
  assert.equal(evil.status, 403);
  assert.match(evil.body.error.message, /Origin 'http:\/\/evil.example' is another site's/);
  assert.equal(evil.headers["access-control-allow-origin"], undefined);
}

async function call(url, [method, path, body], headers = {}) {
  return fetch(`${url}${path}`, {
    method,
    headers: {
      ...(body ? { "Content-Type": "application/json" } : {}),
      Accept: "application/json, text/event-stream",
      ...headers,
    },
    body: body ? JSON.stringify(body) : undefined,
  });
}

// A non-loopback IPv4 address of this machine, if it has one.
function outsideAddress() {
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  }
  return null;
}

describe("the server", () => {
  test("binds 127.0.0.1 unless told otherwise", async (t) => {
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const address = outsideAddress();
    if (!address) {
      t.diagnostic("no non-loopback IPv4 address on this machine: the refusal is not tried");
      return;
    }
    const port = Number(new URL(server.url).port);
    const refused = await new Promise((resolve) => {
      const socket = net.connect(port, address);
      socket.on("connect", () => {
        socket.destroy();
        resolve(false);
      });
      socket.on("error", (e) => resolve(e.code === "ECONNREFUSED"));
    });
    assert.ok(refused, `${address}:${port} accepted a connection`);
  });

  test("--api-key guards every route that generates or reveals anything", async () => {
    for (const route of guarded) {
      for (const headers of [{}, { Authorization: "Bearer sk-wrong" }, { Authorization: KEY }]) {
        const res = await call(server.url, route, headers);
        assert.equal(res.status, 401, `${route[0]} ${route[1]} with ${JSON.stringify(headers)}`);
        assert.equal(res.headers.get("www-authenticate"), "Bearer");
        // Anthropic's routes answer in Anthropic's error shape, which has a type and no code;
        // Ollama's in Ollama's, a message alone.
        const { error } = await res.json();
        if (route[1].startsWith("/v1/messages")) {
          assert.equal(error.type, "authentication_error");
        } else if (route[1].startsWith("/api/")) {
          assert.match(error, /API key/);
        } else {
          assert.equal(error.code, "invalid_api_key");
        }
      }
      const res = await call(server.url, route, { Authorization: `Bearer ${KEY}` });
      const expected = route[3] ?? (route[1] === "/no/such/route" ? 404 : 200);
      assert.equal(res.status, expected, `${route[1]} with the key: ${await res.text()}`);
    }
  });

  test("on loopback, a Host other than localhost's is refused (DNS rebinding)", async () => {
    const port = new URL(server.url).port;
    const auth = { Authorization: `Bearer ${KEY}` };
    for (const host of [`evil.example:${port}`, "evil.example", `127.0.0.1.evil.example:${port}`]) {
      const r = await rawCall(server.url, "GET", "/v1/models", { ...auth, Host: host });
      assert.equal(r.status, 403, host);
      assert.equal(r.body.error.code, "forbidden");
      assert.match(r.body.error.message, /is not this server's/);
    }
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, "localhost"]) {
      assert.equal((await rawCall(server.url, "GET", "/v1/models", { ...auth, Host: host })).status,
        200, host);
    }
  });

  test("a page of another site cannot make it generate", async () => {
    const port = new URL(server.url).port;
    const headers = { Authorization: `Bearer ${KEY}`, "Content-Type": "text/plain" };
    const evil = await rawCall(server.url, "POST", "/v1/chat/completions",
      { ...headers, Origin: "http://evil.example" }, chat);
    assert.equal(evil.status, 403);
    assert.match(evil.body.error.message, /Origin 'http:\/\/evil.example' is another site's/);
    const own = await rawCall(server.url, "POST", "/v1/chat/completions",
      { ...headers, Origin: `http://127.0.0.1:${port}` }, chat);
    assert.equal(own.status, 200);
    assert.equal(evil.headers["access-control-allow-origin"], undefined);
  });

  test("pages it lets call it may read the answers too (CORS); another site's may not", async () => {
    await checkPreflights(server.url);
    for (const [method, path, body, status] of [["POST", "/v1/chat/completions", chat, 200],
      ["GET", "/v1/models", undefined, 200], ["POST", "/v1/nothing", chat, 404]]) {
      const r = await rawCall(server.url, method, path, { Authorization: `Bearer ${KEY}`,
        "Content-Type": "application/json", Origin: "http://localhost:3000" }, body);
      assert.equal(r.status, status, path);
      assert.equal(r.headers["access-control-allow-origin"], "http://localhost:3000", path);
      assert.equal(r.headers.vary, "Origin", path);
    }
  });

  test("a compressed body is refused unread: a gzip bomb inflates nothing", async () => {
    // 64 MiB of one letter in 64 KB of gzip: past --max-body-bytes (8 MiB) once inflated, which
    // the library does with no bound on what it inflates to.
    const bomb = zlib.gzipSync(Buffer.alloc(64 << 20, "a"));
    const refusal = (coding) =>
      `the request body is sent with Content-Encoding '${coding}': this server reads request ` +
      "bodies uncompressed only";
    const openai = (b) => b.error.message;
    // Every method that carries a body, on routes that take it and on routes that do not: the
    // library inflated whatever it read before any route saw the request.
    const cases = [
      ["POST", "/v1/chat/completions", "gzip", openai],
      ["POST", "/v1/messages", "gzip", (b) => b.type === "error" && b.error.type ===
        "invalid_request_error" && b.error.message],
      ["POST", "/api/chat", "deflate", (b) => b.error],
      ["POST", "/mcp", "br", openai],
      ["POST", "/v1/responses/resp_none/cancel", "gzip", openai],
      ["DELETE", "/v1/responses/resp_none", "gzip", openai],
      ["DELETE", "/api/delete", "gzip", (b) => b.error],
      ["DELETE", "/mcp", "gzip", openai],
      ["PUT", "/v1/chat/completions", "gzip", openai],
      ["PATCH", "/v1/models", "gzip", openai],
      ["POST", "/no/such/route", "gzip", openai],
    ];
    for (const [method, path, coding, message] of cases) {
      const res = await fetch(`${server.url}${path}`, {
        method, body: bomb,
        headers: { "Content-Type": "application/json", "Content-Encoding": coding,
          Authorization: `Bearer ${KEY}` },
      });
      assert.equal(res.status, 415, `${method} ${path}`);
      assert.equal(message(await res.json()), refusal(coding), `${method} ${path}`);
    }
    const plain = await call(server.url, ["POST", "/v1/chat/completions", chat],
      { Authorization: `Bearer ${KEY}`, "Content-Encoding": "identity" });
    assert.equal(plain.status, 200);
  });

  test("a Range of many parts gets the whole answer once; one part is served", async () => {
    const whole = await (await fetch(`${server.url}/web/chat.js`)).text();
    // As many parts as one header line holds (8 KiB): each was the whole script again.
    const many = await fetch(`${server.url}/web/chat.js`,
      { headers: { Range: `bytes=${Array(2700).fill("0-").join(",")}` } });
    assert.equal(many.status, 200);
    assert.equal(await many.text(), whole);
    const one = await fetch(`${server.url}/web/chat.js`, { headers: { Range: "bytes=0-9" } });
    assert.equal(one.status, 206);
    assert.equal(await one.text(), whole.slice(0, 10));
  });

  test("only the probes, /metrics and the chat page (no secrets) answer without the key", async () => {
    for (const path of ["/health", "/livez", "/metrics", "/", "/web/chat.js", "/web/chat.css"]) {
      assert.equal((await fetch(`${server.url}${path}`)).status, 200, path);
    }
  });

  test("the chat page runs only its own script, under a Content-Security-Policy", async () => {
    for (const path of ["/", "/web/chat.js", "/web/chat.css"]) {
      const res = await fetch(`${server.url}${path}`);
      const csp = res.headers.get("content-security-policy") ?? "";
      assert.match(csp, /(^|; )default-src 'self'(;|$)/, path);
      assert.match(csp, /(^|; )script-src 'self'(;|$)/, path);
      // Attached images and audio show as <img> and <audio> of data: URLs, and nothing else.
      assert.match(csp, /(^|; )img-src 'self' data:(;|$)/, path);
      assert.match(csp, /(^|; )media-src 'self' data:(;|$)/, path);
      assert.match(csp, /(^|; )object-src 'none'(;|$)/, path);
      assert.match(csp, /(^|; )frame-ancestors 'none'(;|$)/, path);
      assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/, path);
      assert.equal(res.headers.get("x-content-type-options"), "nosniff", path);
    }
    // So the policy needs no 'unsafe-inline': no inline script or handler on the page, and the
    // script writes model text with textContent only.
    const page = await (await fetch(`${server.url}/`)).text();
    assert.doesNotMatch(page, /<script(?![^>]*\bsrc=)[^>]*>/);
    assert.doesNotMatch(page, /\son[a-z]+\s*=/i);
    const script = await (await fetch(`${server.url}/web/chat.js`)).text();
    assert.doesNotMatch(script, /innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(/);
  });
});

describe("the proxy", () => {
  // A stand-in upstream that answers every request with the Authorization header it received (and
  // the x-api-key and Origin headers, and any of the names cpp-httplib gives a request's
  // addresses among its headers, when it received them), letting any page read its answers.
  let upstream;
  let upstreamUrl;
  const started = [];
  before(async () => {
    upstream = http.createServer((req, res) => {
      // A part of a 20-byte answer, for the Range a client sent.
      if (req.url === "/part") {
        res.writeHead(206, { "Content-Type": "text/plain", "Content-Range": "bytes 5-9/20",
          "X-Range-Asked": req.headers.range ?? "none" });
        return res.end("56789");
      }
      res.setHeader("Content-Type", "application/json");
      res.setHeader("Access-Control-Allow-Origin", "*");
      const { "x-api-key": apiKey, origin } = req.headers;
      const addresses = ["remote_addr", "remote_port", "local_addr", "local_port"]
        .filter((name) => name in req.headers);
      res.end(JSON.stringify({ authorization: req.headers.authorization ?? null,
        ...(apiKey ? { apiKey } : {}), ...(origin ? { origin } : {}),
        ...(addresses.length ? { addresses } : {}) }));
    });
    await new Promise((resolve) => upstream.listen(0, "127.0.0.1", resolve));
    upstreamUrl = `http://127.0.0.1:${upstream.address().port}`;
  });
  after(async () => {
    for (const p of started) {
      if (p.child.exitCode === null) p.child.kill("SIGTERM");
      await p.exited;
    }
    upstream?.close();
  });
  async function proxy(args) {
    const p = startProxy(["--upstream", upstreamUrl, ...args]);
    started.push(p);
    return p.url;
  }

  test("checks a key of its own and sends the upstream's in its place", async () => {
    const url = await proxy(["--api-key", "sk-proxy", "--upstream-api-key", KEY]);
    const routes = [["GET", "/v1/models"], ["POST", "/v1/chat/completions", chat],
      ["POST", "/mcp", { jsonrpc: "2.0", id: 1, method: "tools/list" }], ["GET", "/proxy/status"]];
    for (const route of routes) {
      for (const headers of [{}, { Authorization: `Bearer ${KEY}` }]) {
        const res = await call(url, route, headers);
        assert.equal(res.status, 401, `${route[1]} with ${JSON.stringify(headers)}`);
        assert.equal((await res.json()).error.type, "authentication_error");
      }
    }
    const res = await call(url, ["GET", "/v1/models"], { Authorization: "Bearer sk-proxy" });
    assert.deepEqual(await res.json(), { authorization: `Bearer ${KEY}` });
    assert.equal((await fetch(`${url}/`)).status, 200);
    assert.equal((await fetch(`${url}/health`)).status, 200);
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const rebound = await rawCall(url, "GET", "/v1/models",
      { Authorization: "Bearer sk-proxy", Host: "evil.example" });
    assert.equal(rebound.status, 403);
  });

  test("does not pass its own key upstream", async () => {
    const url = await proxy(["--api-key", "sk-proxy"]);
    const res = await call(url, ["GET", "/v1/models"], { Authorization: "Bearer sk-proxy" });
    assert.deepEqual(await res.json(), { authorization: null });
  });

  test("takes its key as x-api-key too (Anthropic clients), and passes it upstream in no header", async () => {
    const url = await proxy(["--api-key", "sk-proxy", "--upstream-api-key", KEY]);
    const messages = ["POST", "/v1/messages", { max_tokens: 5, messages: [{ role: "user", content: "hi" }] }];
    const res = await call(url, messages, { "x-api-key": "sk-proxy" });
    assert.deepEqual(await res.json(), { authorization: `Bearer ${KEY}` });
    const own = await proxy(["--api-key", "sk-proxy"]);
    const alone = await call(own, ["GET", "/v1/models"], { "x-api-key": "sk-proxy" });
    assert.deepEqual(await alone.json(), { authorization: null });
    const wrong = await call(url, messages, { "x-api-key": "sk-wrong" });
    assert.equal(wrong.status, 401);
    // Without a key of its own, the proxy is not the one checking: the client's header goes on.
    const open = await proxy([]);
    const passed = await call(open, ["GET", "/v1/models"], { "x-api-key": KEY });
    assert.deepEqual(await passed.json(), { authorization: null, apiKey: KEY });
  });

  test("answers pages' preflights itself and judges their Origin, which goes no further", async () => {
    const url = await proxy(["--api-key", "sk-proxy", "--upstream-api-key", KEY]);
    // Answered by the proxy: not the upstream's 401, nor the proxy's own.
    await checkPreflights(url);
    // The answer names the page once, by the proxy's rule, not the upstream's "*".
    const res = await rawCall(url, "POST", "/v1/chat/completions", { Authorization: "Bearer sk-proxy",
      "Content-Type": "application/json", Origin: "http://localhost:3000" }, chat);
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, { authorization: `Bearer ${KEY}` });
    assert.equal(res.headers["access-control-allow-origin"], "http://localhost:3000");
    assert.equal(res.headers.vary, "Origin");
  });

  test("a page of the proxy's own host calls through it to a server at another address", async () => {
    // Bound beyond loopback, the proxy is reached by a name of its own; the server, asked at its
    // own address, would take that page's Origin for another site's (a 403).
    const p = startProxy(["--upstream", server.url, "--host", "0.0.0.0", "--api-key", "sk-proxy",
      "--upstream-api-key", KEY]);
    started.push(p);
    const port = new URL((await p.url).replace("0.0.0.0", "127.0.0.1")).port;
    const page = `http://gemma.lan:${port}`;
    const res = await rawCall(`http://127.0.0.1:${port}`, "POST", "/v1/chat/completions", {
      Host: `gemma.lan:${port}`, Origin: page, Authorization: "Bearer sk-proxy",
      "Content-Type": "application/json" }, chat);
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(res.body.object, "chat.completion");
    assert.equal(res.headers["access-control-allow-origin"], page);
  });

  test("passes on the upstream's part of a Range, uncut", async () => {
    const url = await proxy([]);
    const res = await fetch(`${url}/part`, { headers: { Range: "bytes=5-9" } });
    assert.equal(res.status, 206);
    assert.equal(res.headers.get("x-range-asked"), "bytes=5-9");
    assert.equal(res.headers.get("content-range"), "bytes 5-9/20");
    assert.equal(await res.text(), "56789");
  });

  test("refuses a compressed body unread, as the server does", async () => {
    const url = await proxy([]);
    const bomb = zlib.gzipSync(Buffer.alloc(16 << 20, "a"));
    for (const method of ["POST", "PUT", "PATCH", "DELETE"]) {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method, body: bomb,
        headers: { "Content-Type": "application/json", "Content-Encoding": "gzip" },
      });
      assert.equal(res.status, 415, method);
      assert.equal((await res.json()).error.message, "the request body is sent with " +
        "Content-Encoding 'gzip': this server reads request bodies uncompressed only", method);
    }
  });

  test("holds no body past its --max-body-bytes, chunked or not, and refuses a limit too small",
    async () => {
      const url = await proxy(["--max-body-bytes", "4096"]);
      const post = (body, init = {}) => fetch(`${url}/v1/chat/completions`,
        { method: "POST", body, headers: { "Content-Type": "application/json" }, ...init });
      // A stream of unknown length goes out chunked; the proxy held such a body whole, at any size.
      const chunked = (bytes) => new ReadableStream({
        start(controller) {
          for (let sent = 0; sent < bytes; sent += 1024) controller.enqueue(new Uint8Array(1024));
          controller.close();
        },
      });
      for (const res of [await post("a".repeat(8192)),
        await post(chunked(1 << 20), { duplex: "half" })]) {
        assert.equal(res.status, 413);
        assert.deepEqual((await res.json()).error, { message: "the request body is larger than " +
          "the server's limit of 4096 bytes", type: "invalid_request_error", param: null,
        code: "request_too_large" });
      }
      const within = await post(chunked(2048), { duplex: "half" });
      assert.equal(within.status, 200);
      assert.deepEqual(await within.json(), { authorization: null });

      const p = startProxy(["--upstream", upstreamUrl, "--max-body-bytes", "100"]);
      const neverListens = assert.rejects(p.url, /proxy exited/);
      assert.equal(await p.exited, 2);
      assert.match(p.stderr(), /--max-body-bytes must be at least 1024, got 100/);
      await neverListens;
    });

  test("an upstream nothing listens on is a 502 that says so in words", async () => {
    const gone = `http://127.0.0.1:${await closedPort()}`;
    const p = startProxy(["--upstream", gone]);
    started.push(p);
    const res = await fetch(`${await p.url}/v1/models`);
    assert.equal(res.status, 502);
    assert.equal((await res.json()).error.message,
      `the upstream ${gone} did not answer: connection refused or unreachable`);
  });

  test("refuses a port past 65535, which would wrap to another", async () => {
    const p = startProxy(["--upstream", upstreamUrl, "--port", "83957"]);
    const neverListens = assert.rejects(p.url, /proxy exited/);
    assert.equal(await p.exited, 2);
    assert.match(p.stderr(), /--port must be between 0 \(any free port\) and 65535, got 83957/);
    await neverListens;
  });

  test("refuses an --upstream that is no http:// URL with a host", async () => {
    for (const upstream of ["ftp://127.0.0.1:1", "http://", "http://a b"]) {
      const p = startProxy(["--upstream", upstream]);
      const neverListens = assert.rejects(p.url, /proxy exited/);
      assert.equal(await p.exited, 2, upstream);
      assert.ok(p.stderr().includes(`--upstream must be an http:// URL, got '${upstream}'`),
        p.stderr());
      await neverListens;
    }
  });

  test("refuses an upstream key without a key of its own", async () => {
    const p = startProxy(["--upstream", upstreamUrl, "--upstream-api-key", KEY]);
    const neverListens = assert.rejects(p.url, /proxy exited/);
    assert.notEqual(await p.exited, 0);
    assert.match(p.stderr(), /--upstream-api-key needs --api-key/);
    await neverListens;
  });
});
