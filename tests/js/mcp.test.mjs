// The MCP tools of torchtpu-cpp through the official @modelcontextprotocol/sdk client, over stdio
// (`torchtpu-cpp mcp --url`) and over Streamable HTTP (/mcp on the server), against the demo
// checkpoint (greedy, so the tools' answers must equal the server's own /v1 answers).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import Ajv from "ajv";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { cliPath, startServer } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const TOOLS = ["ask", "endpoint_status", "engine_info", "serving_metrics", "stream"];
const PROMPT = "Name three colours.";

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

after(async () => {
  if (server) await server.stop();
});

const transports = {
  stdio: () => new StdioClientTransport({ command: cliPath(), args: ["mcp", "--url", `${server.url}/v1`], stderr: "pipe" }),
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
      const transport = makeTransport();
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
  });
}

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
  });
});
