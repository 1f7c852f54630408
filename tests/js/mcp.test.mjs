// The MCP tools of torchtpu-cpp through the official @modelcontextprotocol/sdk client, over stdio
// (`torchtpu-cpp mcp --url`) and over Streamable HTTP (/mcp on the server), against the demo
// checkpoint (greedy, so the tools' answers must equal the server's own /v1 answers). ask and
// stream's `images` and `audio` file paths: read over stdio, refused over HTTP unless the server
// names a directory with --mcp-media-dir (then only inside it), and answered on a tiny checkpoint
// with both towers exactly as the server answers the same parts sent to it directly.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import Ajv from "ajv";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import {
  PNG, cliPath, eventually, makeMultimodalCheckpoint, metric, metrics, pathProxy, startServer,
  tempDir, wav,
} from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const TOOLS = ["ask", "endpoint_status", "engine_info", "serving_metrics", "stream"];
const PROMPT = "Name three colours.";

// The files ask and stream are given: `media` is the directory a server may read from
// (--mcp-media-dir), `outside` lies beside it, and link.png in `media` leads out to it.
const tmp = fs.realpathSync(tempDir("torchtpu-mcp-media-"));
const media = path.join(tmp, "media");
const outside = path.join(tmp, "outside");
const file = (name) => path.join(media, name);
fs.mkdirSync(media);
fs.mkdirSync(outside);
fs.mkdirSync(file("sub"));
fs.writeFileSync(file("dot.png"), Buffer.from(PNG, "base64"));
fs.writeFileSync(file("clip.wav"), Buffer.from(wav(), "base64"));
fs.writeFileSync(file("notes.txt"), "not an image\n");
// A PNG signature, then 5,000 bytes no decoder reads: over any limit of 4,096 bytes.
fs.writeFileSync(file("big.png"), Buffer.concat([Buffer.from(PNG, "base64").subarray(0, 8), Buffer.alloc(5000)]));
fs.writeFileSync(path.join(outside, "secret.png"), Buffer.from(PNG, "base64"));
fs.symlinkSync(path.join(outside, "secret.png"), file("link.png"));
fs.symlinkSync(outside, file("sub/out"));

// The tool error's text, failing if the call succeeded.
async function toolError(client, args, name = "ask") {
  const result = await client.callTool({ name, arguments: { prompt: PROMPT, max_tokens: 4, ...args } });
  assert.equal(result.isError, true, JSON.stringify(result));
  return result.content[0].text;
}

let server;
let expected;  // the server's own answer to PROMPT with max_tokens 12

before(async () => {
  // float32: every tool's answer is compared with this one, and a bf16 answer may change in its
  // last bits when the prefix cache or other requests in the batch change how the prompt is read.
  server = await startServer(["--context", "2048", "--dtype", "float32"]);
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: PROMPT }], max_tokens: 12 }),
  });
  expected = (await res.json()).choices[0].message.content;
});

const proxies = [];  // pathProxy()s the transports made
after(async () => {
  await Promise.all(proxies.map((proxy) => proxy.close()));
  if (server) await server.stop();
});

const transports = {
  stdio: () => new StdioClientTransport({ command: cliPath(), args: ["mcp", "--url", `${server.url}/v1`], stderr: "pipe" }),
  // Behind a reverse proxy at /llm: every request the tools send goes under it.
  "stdio, the server under a path": async () => {
    const proxy = await pathProxy(server.url, "/llm");
    proxies.push(proxy);
    return new StdioClientTransport({ command: cliPath(), args: ["mcp", "--url", `${proxy.url}/v1`],
      stderr: "pipe" });
  },
  "streamable HTTP": () => new StreamableHTTPClientTransport(new URL(`${server.url}/mcp`)),
};

const FOOTER = new RegExp(
  `^${MODEL} · finish \`length\` · \\d+ prompt \\+ 12 completion tokens · prompt read [\\d.]+ s · ` +
    `decode [\\d.]+ tok/s · [\\d.]+ s round trip$`,
);

for (const [name, makeTransport] of Object.entries(transports)) {
  describe(`MCP over ${name}`, () => {
    let client;
    // Every message the transport delivers, in arrival order: the Protocol calls a transport's
    // own onmessage synchronously before its dispatch, which defers notifications by a microtask.
    const wire = [];
    before(async () => {
      client = new Client({ name: "torchtpu-test", version: "1.0.0" });
      const transport = await makeTransport();
      transport.onmessage = (message) => wire.push(message);
      await client.connect(transport);
    });
    after(async () => {
      if (client) await client.close();
    });

    test("the server names itself and lists the five tools", async () => {
      assert.equal(client.getServerVersion().name, "torchtpu-cpp");
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
      const ask = tools.find((t) => t.name === "ask");
      assert.deepEqual(ask.inputSchema.required, ["prompt"]);
    });

    test("ask answers as the server does, with the footer", async () => {
      const result = await client.callTool({ name: "ask", arguments: { prompt: PROMPT, max_tokens: 12 } });
      assert.equal(result.isError, false);
      const [answer, footer] = result.content[0].text.split("\n---\n");
      assert.equal(answer, expected);
      assert.match(footer, FOOTER);
      assert.equal(result.structuredContent.completion_tokens, 12);
    });

    test("stream sends one progress notification per chunk, then the same answer", async () => {
      const pieces = [];
      const first = wire.length;
      const result = await client.callTool(
        { name: "stream", arguments: { prompt: PROMPT, max_tokens: 12 } },
        undefined,
        { onprogress: (p) => pieces.push(p) },
      );
      assert.equal(result.isError, false);
      const [answer, footer] = result.content[0].text.split("\n---\n");
      assert.equal(answer, expected);
      assert.match(footer, FOOTER);
      // On the wire: every chunk's notification, in order, and all of them before the result.
      const seen = wire.slice(first);
      const last = seen.findIndex((m) => "result" in m);
      const progress = seen.filter((m) => m.method === "notifications/progress");
      assert.ok(progress.length >= 2, `${progress.length} progress notifications`);
      assert.equal(seen.slice(0, last).filter((m) => m.method === "notifications/progress").length,
                   progress.length, "a progress notification came after the result");
      assert.equal(progress.map((m) => m.params.message).join(""), expected);
      assert.deepEqual(progress.map((m) => m.params.progress), progress.map((_, i) => i + 1));
      // The SDK hands them to onprogress in that order, but may drop the last ones when they arrive
      // in one read with the result (typescript-sdk issue #2580): its response handler retires the
      // token before the deferred notifications are dispatched.
      assert.ok(pieces.length >= 1 && pieces.length <= progress.length, `${pieces.length} delivered`);
      assert.deepEqual(pieces, progress.slice(0, pieces.length).map(({ params }) => {
        const { progressToken, ...rest } = params;
        return rest;
      }));
    });

    test("ask with a schema answers JSON valid for it; a schema it cannot enforce is a tool error", async () => {
      // Only bounded values: random weights end them without help (issue #18's structured output).
      const schema = {
        type: "object",
        properties: {
          ok: { type: "boolean" },
          level: { enum: ["low", "mid", "high"] },
          n: { type: "integer", minimum: 0, maximum: 9 },
        },
        required: ["ok", "level", "n"],
        additionalProperties: false,
      };
      const validate = new Ajv().compile(schema);
      for (const seed of [1, 2, 3]) {
        const result = await client.callTool({
          name: "ask", arguments: { prompt: PROMPT, max_tokens: 64, temperature: 1, seed, schema },
        });
        assert.equal(result.isError, false);
        assert.equal(result.structuredContent.finish_reason, "stop");
        const answer = JSON.parse(result.structuredContent.answer);
        assert.ok(validate(answer), JSON.stringify(answer));
      }
      const unenforceable = await client.callTool({
        name: "ask", arguments: { prompt: PROMPT, schema: { type: "array", uniqueItems: true } },
      });
      assert.equal(unenforceable.isError, true);
      assert.match(unenforceable.content[0].text, /HTTP 400.*uniqueItems/);
      const notObject = await client.callTool({ name: "ask", arguments: { prompt: PROMPT, schema: "json" } });
      assert.equal(notObject.isError, true);
      assert.match(notObject.content[0].text, /'schema' must be a JSON Schema object/);
    });

    test("engine_info, endpoint_status and serving_metrics report the server", async () => {
      const engine = await (await fetch(`${server.url}/v1/engine`)).json();
      const info = await client.callTool({ name: "engine_info", arguments: {} });
      assert.equal(info.isError, false);
      assert.equal(info.structuredContent.build.git_revision, engine.build.git_revision);
      assert.equal(JSON.parse(info.content[0].text).model, MODEL);

      const status = await client.callTool({ name: "endpoint_status", arguments: {} });
      assert.equal(status.isError, false);
      assert.match(status.content[0].text, /\/health: 200/);
      assert.equal(status.structuredContent.health_status, 200);

      const m = await client.callTool({ name: "serving_metrics", arguments: {} });
      assert.equal(m.isError, false);
      assert.ok(m.structuredContent.samples.torchtpu_prompt_tokens_total > 0);
      assert.ok("torchtpu_requests_cancelled_total" in m.structuredContent.samples);
    });

    test("a bad call is a tool error; an unknown tool a protocol error", async () => {
      const noPrompt = await client.callTool({ name: "ask", arguments: { max_tokens: 4 } });
      assert.equal(noPrompt.isError, true);
      assert.match(noPrompt.content[0].text, /'prompt' is required/);
      // A prompt longer than the server's context: the server's 400, passed on as a tool error.
      const tooLong = await client.callTool({ name: "ask", arguments: { prompt: "sea ".repeat(3000), max_tokens: 4 } });
      assert.equal(tooLong.isError, true);
      assert.match(tooLong.content[0].text, /HTTP 400/);
      await assert.rejects(
        client.callTool({ name: "no_such_tool", arguments: {} }),
        (e) => e instanceof McpError && e.code === -32602,
      );
    });

    test("a cancelled ask or stream stops its decode: the row is freed, the request counted cancelled", async () => {
      const decoding = async () => (await (await fetch(`${server.url}/slots`)).json())
        .some((slot) => slot.is_processing && slot.next_token.n_decoded > 0);
      for (const tool of ["ask", "stream"]) {
        const cancelled = async () => metric(await metrics(server.url), "torchtpu_requests_cancelled_total");
        const before = await cancelled();
        const controller = new AbortController();
        // The SDK sends notifications/cancelled when the signal aborts; over HTTP its POST stays
        // open, so only the notification can stop the call.
        const call = client.callTool({ name: tool, arguments: { prompt: PROMPT, max_tokens: 1500 } },
          undefined, { signal: controller.signal, ...(tool === "stream" ? { onprogress: () => {} } : {}) });
        await eventually(decoding, `${tool}'s decode`);
        controller.abort();
        await assert.rejects(call);
        await eventually(async () => (await cancelled()) === before + 1, `${tool}'s cancellation`);
        await eventually(async () => !(await decoding()), "the row freed");
      }
    });

    test("images and audio must be arrays of file paths", async () => {
      const { tools } = await client.listTools();
      for (const tool of tools.filter((t) => t.name === "ask" || t.name === "stream")) {
        for (const key of ["images", "audio"]) {
          assert.deepEqual(tool.inputSchema.properties[key].type, "array");
          assert.deepEqual(tool.inputSchema.properties[key].items, { type: "string" });
        }
      }
      const cases = [
        [{ images: file("dot.png") }, "'images' must be an array of file paths (strings), got a string"],
        [{ audio: { path: file("clip.wav") } }, "'audio' must be an array of file paths (strings), got an object"],
        [{ images: [file("dot.png"), 7] }, "'images[1]' must be a file path (a string), got an integer"],
        [{ audio: [null] }, "'audio[0]' must be a file path (a string), got null"],
        [{ images: [""] }, "'images[0]' is empty; name a file"],
        [{ audio: ["clip.wav\u0000../../x"] }, "'audio[0]' holds a NUL character, which no file path has"],
      ];
      for (const tool of ["ask", "stream"]) {
        for (const [args, message] of cases) assert.equal(await toolError(client, args, tool), message);
      }
    });
  });
}

describe("MCP media files on the text-only demo checkpoint", () => {
  test("over stdio the files are read, and an image gets the server's 'no vision encoder', named by its argument", async () => {
    const client = new Client({ name: "torchtpu-test", version: "1.0.0" });
    await client.connect(transports.stdio());
    try {
      const { tools } = await client.listTools();
      assert.match(tools.find((t) => t.name === "ask").inputSchema.properties.images.description,
        /caller's own process/);
      const url = `${server.url}/v1/chat/completions`;
      assert.equal(
        await toolError(client, { images: [file("dot.png")] }),
        `${url} answered HTTP 400: 'images[0]' (${file("dot.png")}) is an image, and this checkpoint has no ` +
          "vision encoder (its config.json has no vision_config)",
      );
      assert.equal(
        await toolError(client, { audio: [file("clip.wav")] }, "stream"),
        `${url} answered HTTP 400: 'audio[0]' (${file("clip.wav")}) is audio, and this checkpoint has no ` +
          "audio encoder (its config.json has no audio_config)",
      );
      // The file's own faults, found before anything is sent.
      const cases = [
        [{ images: [file("missing.png")] }, `'images[0]' (${file("missing.png")}): no such file`],
        [{ images: [path.join(file("notes.txt"), "x.png")] }, `'images[0]' (${file("notes.txt")}/x.png): no such file`],
        [{ images: [file("notes.txt")] }, `'images[0]' (${file("notes.txt")}) is not a PNG, JPEG or WebP image`],
        [{ audio: [file("dot.png")] }, `'audio[0]' (${file("dot.png")}) is not a WAV or MP3 file`],
        [{ images: [file("sub")] }, `'images[0]' (${file("sub")}) is a directory, not a file`],
        [{ images: [file("dot.png"), "/dev/null"] }, "'images[1]' (/dev/null) is not a regular file"],
        [{ images: Array(9).fill(file("dot.png")) }, "'images' and 'audio' name 9 files together, more than --max-media 8"],
      ];
      for (const [args, message] of cases) assert.equal(await toolError(client, args), message);
      if (process.getuid?.() !== 0) {
        const locked = path.join(tmp, "locked.png");
        fs.writeFileSync(locked, Buffer.from(PNG, "base64"), { mode: 0o000 });
        assert.equal(await toolError(client, { images: [locked] }), `'images[0]' (${locked}) cannot be read: Permission denied`);
      }
    } finally {
      await client.close();
    }
  });

  test("over stdio the mcp command's own --max-image-bytes bounds what it reads", async () => {
    const client = new Client({ name: "torchtpu-test", version: "1.0.0" });
    await client.connect(new StdioClientTransport({
      command: cliPath(),
      args: ["mcp", "--url", server.url, "--max-image-bytes", "4096", "--max-audio-bytes", "100"],
      stderr: "pipe",
    }));
    try {
      assert.equal(await toolError(client, { images: [file("big.png")] }),
        `'images[0]' (${file("big.png")}) is 5008 bytes, more than --max-image-bytes 4096`);
      const size = fs.statSync(file("clip.wav")).size;
      assert.equal(await toolError(client, { audio: [file("clip.wav")] }),
        `'audio[0]' (${file("clip.wav")}) is ${size} bytes, more than --max-audio-bytes 100`);
    } finally {
      await client.close();
    }
  });

  test("over HTTP without --mcp-media-dir every path is refused before the file system is touched", async () => {
    const client = new Client({ name: "torchtpu-test", version: "1.0.0" });
    await client.connect(transports["streamable HTTP"]());
    try {
      const { tools } = await client.listTools();
      assert.match(tools.find((t) => t.name === "ask").inputSchema.properties.images.description,
        /reads no files .*--mcp-media-dir.*any path is refused/);
      const refusal =
        "names a file, and this MCP server is reached over HTTP and reads no files unless " +
        "`torchtpu-cpp serve` was started with --mcp-media-dir DIR (then only files inside DIR); over " +
        "stdio (`torchtpu-cpp mcp`) the tools read the caller's own files";
      for (const [args, arg] of [
        [{ images: [file("dot.png")] }, "images[0]"],
        [{ images: ["/etc/passwd"] }, "images[0]"],
        [{ audio: [file("missing.wav")] }, "audio[0]"],
      ]) {
        assert.equal(await toolError(client, args), `'${arg}' ${refusal}`);
        assert.equal(await toolError(client, args, "stream"), `'${arg}' ${refusal}`);
      }
    } finally {
      await client.close();
    }
  });

  test("a server whose --mcp-media-dir is no directory stops at start, naming the flag", async () => {
    for (const [dir, message] of [
      [path.join(tmp, "nope"), `error: --mcp-media-dir ${path.join(tmp, "nope")}: No such file or directory`],
      [file("dot.png"), `error: --mcp-media-dir ${file("dot.png")} is not a directory`],
    ]) {
      const failed = await startServer(["--mcp-media-dir", dir]).then(
        () => assert.fail("the server started"),
        (e) => e,
      );
      assert.match(failed.message, /server exited with 2 before listening/);
      assert.ok(failed.message.includes(message), failed.message);
    }
  });
});

describe("MCP media files on a checkpoint with vision and audio encoders", () => {
  let mm;
  let dir;
  // The server's own answer to PROMPT with these content parts before it.
  async function direct(parts) {
    const content = parts.length ? [...parts, { type: "text", text: PROMPT }] : PROMPT;
    const res = await fetch(`${mm.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: 6 }),
    });
    assert.equal(res.status, 200);
    const body = await res.json();
    return { answer: body.choices[0].message.content, prompt_tokens: body.usage.prompt_tokens };
  }
  const IMAGE = { type: "image_url", image_url: { url: `data:image/png;base64,${PNG}` } };
  const AUDIO = { type: "input_audio", input_audio: { data: wav(), format: "wav" } };
  const clients = {};

  before(async () => {
    dir = makeMultimodalCheckpoint();
    mm = await startServer([
      "--model", dir, "--model-id", "tiny-multimodal", "--dtype", "float32",
      "--context", "2048", "--mcp-media-dir", media, "--max-media", "2", "--max-image-bytes", "4096",
    ]);
    for (const [name, make] of Object.entries({
      stdio: () => new StdioClientTransport({ command: cliPath(), args: ["mcp", "--url", mm.url], stderr: "pipe" }),
      http: () => new StreamableHTTPClientTransport(new URL(`${mm.url}/mcp`)),
    })) {
      clients[name] = new Client({ name: "torchtpu-test", version: "1.0.0" });
      await clients[name].connect(make());
    }
  });

  after(async () => {
    for (const client of Object.values(clients)) await client.close();
    await mm?.stop();
  });

  test("an image and a clip reach the model: the answer and prompt tokens of the same parts sent directly", async () => {
    const textOnly = await direct([]);
    const image = await direct([IMAGE]);
    const both = await direct([IMAGE, AUDIO]);
    // Each item is its begin token, its soft tokens and its end token: the observable that fails
    // if the tool drops a file.
    assert.ok(image.prompt_tokens >= textOnly.prompt_tokens + 3, `${image.prompt_tokens} vs ${textOnly.prompt_tokens}`);
    assert.ok(both.prompt_tokens >= image.prompt_tokens + 3, `${both.prompt_tokens} vs ${image.prompt_tokens}`);
    const calls = [
      // Over stdio: absolute paths, read by the mcp command.
      ["stdio", "ask", { images: [file("dot.png")] }, image],
      ["stdio", "stream", { images: [file("dot.png")], audio: [file("clip.wav")] }, both],
      // Over HTTP, inside --mcp-media-dir: relative to it, absolute, through a subdirectory.
      ["http", "ask", { images: ["dot.png"] }, image],
      ["http", "ask", { images: [file("dot.png")], audio: ["sub/../clip.wav"] }, both],
      ["http", "stream", { images: ["./dot.png"] }, image],
      ["stdio", "ask", {}, textOnly],
    ];
    for (const [transport, tool, args, want] of calls) {
      const result = await clients[transport].callTool({ name: tool, arguments: { prompt: PROMPT, max_tokens: 6, ...args } });
      assert.equal(result.isError, false, `${transport} ${tool} ${JSON.stringify(args)}: ${result.content[0].text}`);
      assert.equal(result.structuredContent.prompt_tokens, want.prompt_tokens, `${transport} ${tool} ${JSON.stringify(args)}`);
      assert.equal(result.structuredContent.answer, want.answer, `${transport} ${tool} ${JSON.stringify(args)}`);
    }
  });

  test("over HTTP a path outside --mcp-media-dir is refused, a symbolic link out of it too", async () => {
    const { tools } = await clients.http.listTools();
    assert.match(tools.find((t) => t.name === "ask").inputSchema.properties.images.description,
      /inside the server's media directory \(--mcp-media-dir\); relative paths are read from it/);
    const out = (p) =>
      `'images[0]' (${p}) is outside --mcp-media-dir, the one directory this server's MCP tools ` +
      "read files from (relative paths are read from it)";
    const linked = (p) =>
      `'images[0]' (${p}) leads out of --mcp-media-dir through a symbolic link; this server's MCP ` +
      "tools read only files inside it";
    const cases = [
      ["../outside/secret.png", out("../outside/secret.png")],
      [path.join(outside, "secret.png"), out(path.join(outside, "secret.png"))],
      // Not there either: refused as outside, so a caller learns nothing of what exists there.
      ["../outside/nothing.png", out("../outside/nothing.png")],
      ["sub/../../outside/secret.png", out("sub/../../outside/secret.png")],
      ["/etc/passwd", out("/etc/passwd")],
      ["link.png", linked("link.png")],
      ["sub/out/secret.png", linked("sub/out/secret.png")],
      ["missing.png", "'images[0]' (missing.png): no such file in --mcp-media-dir"],
      ["notes.txt", "'images[0]' (notes.txt) is not a PNG, JPEG or WebP image"],
      ["big.png", "'images[0]' (big.png) is 5008 bytes, more than --max-image-bytes 4096"],
    ];
    for (const tool of ["ask", "stream"]) {
      for (const [p, message] of cases) assert.equal(await toolError(clients.http, { images: [p] }, tool), message);
    }
    assert.equal(await toolError(clients.http, { images: ["dot.png", "dot.png"], audio: ["clip.wav"] }),
      "'images' and 'audio' name 3 files together, more than --max-media 2");
    // Over stdio the same link is the user's own file, read; the server's limits still hold, and
    // its errors name the argument the part came from.
    const url = `${mm.url}/v1/chat/completions`;
    // The server reckons the size from the base64, padding included: 5,010 bytes.
    assert.equal(await toolError(clients.stdio, { images: [file("big.png")] }),
      `${url} answered HTTP 400: 'images[0]' (${file("big.png")}) holds an image of about 5010 bytes, ` +
        "more than --max-image-bytes 4096");
    assert.equal(await toolError(clients.stdio, { images: [file("dot.png")], audio: [file("clip.wav"), file("clip.wav")] }),
      `${url} answered HTTP 400: the request holds 3 images and audio clips, more than this server's --max-media 2`);
    const linkedOk = await clients.stdio.callTool({ name: "ask", arguments: { prompt: PROMPT, max_tokens: 6, images: [file("link.png")] } });
    assert.equal(linkedOk.isError, false, linkedOk.content[0].text);
  });
});

describe("Streamable HTTP details", () => {
  const post = (body, headers = {}) =>
    fetch(`${server.url}/mcp`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream", ...headers },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const init = (version) => ({
    jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: version, capabilities: {}, clientInfo: { name: "t", version: "0" } },
  });

  test("initialize agrees on 2025-06-18 or 2025-11-25 and offers 2025-11-25 otherwise", async () => {
    for (const [asked, agreed] of [["2025-06-18", "2025-06-18"], ["2025-11-25", "2025-11-25"], ["2024-01-01", "2025-11-25"]]) {
      const res = await post(init(asked));
      assert.equal(res.status, 200);
      const body = await res.json();
      assert.equal(body.result.protocolVersion, agreed);
      assert.deepEqual(body.result.capabilities.tools, { listChanged: false });
    }
  });

  test("notifications get 202, protocol errors JSON-RPC errors", async () => {
    assert.equal((await post({ jsonrpc: "2.0", method: "notifications/initialized" })).status, 202);
    const unknown = await (await post({ jsonrpc: "2.0", id: 2, method: "no/such" })).json();
    assert.equal(unknown.error.code, -32601);
    const parse = await post("{not json");
    assert.equal(parse.status, 400);
    assert.equal((await parse.json()).error.code, -32700);
    const version = await post({ jsonrpc: "2.0", id: 3, method: "ping" }, { "MCP-Protocol-Version": "1999-01-01" });
    assert.equal(version.status, 400);
    assert.equal((await fetch(`${server.url}/mcp`)).status, 405);
    const origin = await post({ jsonrpc: "2.0", id: 4, method: "ping" }, { Origin: "http://evil.example" });
    assert.equal(origin.status, 403);
    // Neither a request nor a response: answered, or its sender would wait for id 5 for ever.
    const neither = await (await post({ jsonrpc: "2.0", id: 5 })).json();
    assert.deepEqual([neither.id, neither.error.code], [5, -32600]);
    const objectId = await (await post({ jsonrpc: "2.0", id: { a: 1 }, method: "ping" })).json();
    assert.equal(objectId.error.code, -32600);
    assert.match(objectId.error.message, /id must be a string or an integer, got an object/);
  });

  test("a max_tokens or seed past int64 is refused as sent, not wrapped", async () => {
    const res = await post('{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"ask",' +
      '"arguments":{"prompt":"hi","max_tokens":9223372036854775808}}}');
    const { result } = await res.json();
    assert.equal(result.isError, true);
    assert.match(result.content[0].text,
      /'max_tokens' must be at most 9223372036854775807, got 9223372036854775808/);
    const seed = await (await post('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' +
      '{"name":"ask","arguments":{"prompt":"hi","seed":18446744073709551616}}}')).json();
    assert.equal(seed.result.isError, true);
    assert.match(seed.result.content[0].text,
      /'seed' must be at most 9223372036854775807, got 1.8446744073709552e\+19/);
  });
});
