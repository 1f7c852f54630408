// `torchtpu-cpp launch claude|codex|opencode`: a coding agent run against a running server. The
// agents are stand-ins (fake_agent.mjs behind `claude`, `codex` and `opencode` scripts on PATH) that
// read their settings as the real ones do and ask the server through the official Anthropic and
// OpenAI SDKs, so a pass means the settings launch gives reach the server and its answer comes
// back. The demo
// checkpoint has random weights: the servers run with the forced-output test hook.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { RULES, startForcedServer } from "./forced_output.mjs";
import { cliPath, closedPort, pathProxy, tempDir } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const KEY = "sk-launch-test";
const HELLO = "Hello there, friend.";

let open;  // a server without a key
let keyed;  // one started with --api-key KEY
let bin;  // the agents' stand-ins

before(async () => {
  [open, keyed] = await Promise.all([
    startForcedServer(RULES, ["--context", "32768"]),
    startForcedServer(RULES, ["--context", "2048", "--api-key", KEY]),
  ]);
  bin = tempDir("torchtpu-launch-bin-");
  const agent = path.join(path.dirname(new URL(import.meta.url).pathname), "fake_agent.mjs");
  for (const name of ["claude", "codex", "opencode"]) {
    const script = path.join(bin, name);
    fs.writeFileSync(script, `#!/bin/sh\nexec node '${agent}' ${name} "$@"\n`);
    fs.chmodSync(script, 0o755);
  }
});

after(async () => {
  await Promise.all([open, keyed].filter(Boolean).map((s) => s.stop()));
});

// Runs `torchtpu-cpp launch ARGS` with the stand-ins first on PATH (or `path`); returns its exit
// status, output, and what the agent wrote (null when no agent ran).
function launch(args, { env = {}, pathVar } = {}) {
  const { out, options } = launchSetup(env, pathVar);
  const r = spawnSync(cliPath(), ["launch", ...args], { ...options, encoding: "utf8" });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, agent: agentOutput(out) };
}

// launch() without blocking this process, for a server that lives in it.
async function launchAsync(args, { env = {}, pathVar } = {}) {
  const { out, options } = launchSetup(env, pathVar);
  const child = spawn(cliPath(), ["launch", ...args], options);
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const status = await new Promise((resolve) => child.on("exit", resolve));
  return { status, stdout, stderr, agent: agentOutput(out) };
}

function launchSetup(env, pathVar) {
  const out = path.join(tempDir("torchtpu-launch-"), "agent.json");
  const base = { ...process.env };
  delete base.TORCHTPU_API_KEY;
  return { out, options: {
    env: { ...base, PATH: pathVar ?? `${bin}:${process.env.PATH}`, FAKE_AGENT_OUT: out, ...env },
    timeout: 60_000,
  } };
}

function agentOutput(out) {
  return fs.existsSync(out) ? JSON.parse(fs.readFileSync(out, "utf8")) : null;
}

describe("claude", () => {
  test("Claude Code's settings reach the server and its answer comes back", () => {
    const r = launch(["claude", "--url", `${open.url}/v1/`, "--", "-p", "Say hello"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.error, undefined);
    assert.deepEqual(r.agent.argv, ["-p", "Say hello"]);
    assert.deepEqual(r.agent.replies, { ANTHROPIC_MODEL: HELLO, ANTHROPIC_DEFAULT_HAIKU_MODEL: HELLO });
    const env = r.agent.env;
    assert.equal(env.ANTHROPIC_BASE_URL, open.url);
    // A placeholder token (Claude Code wants one), and the user's own key kept out.
    assert.equal(env.ANTHROPIC_AUTH_TOKEN, "torchtpu-cpp");
    assert.equal(env.ANTHROPIC_API_KEY, "");
    for (const name of ["MODEL", "DEFAULT_OPUS_MODEL", "DEFAULT_SONNET_MODEL", "DEFAULT_HAIKU_MODEL",
      "SMALL_FAST_MODEL"]) {
      assert.equal(env[`ANTHROPIC_${name}`], MODEL, name);
    }
    assert.match(r.stderr, new RegExp(`launch: Claude Code with ${MODEL} at ${open.url}`));
    assert.doesNotMatch(r.stderr, /warning/);
  });

  test("a server's key from $TORCHTPU_API_KEY becomes the bearer token", () => {
    const r = launch(["claude", "--url", keyed.url], { env: { TORCHTPU_API_KEY: KEY } });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.env.ANTHROPIC_AUTH_TOKEN, KEY);
    assert.equal(r.agent.replies.ANTHROPIC_MODEL, HELLO);
    // This server's context is smaller than Claude Code's prompts: said, and the agent still runs.
    assert.match(r.stderr, new RegExp("launch: warning: the server's context holds 2048 tokens, and " +
      "Claude Code's first request alone is about 18,000 tokens, growing with the conversation: " +
      "start `torchtpu-cpp serve` with --context 32768 or more"));
  });

  test("--print shows the environment and the command and runs nothing", () => {
    const r = launch(["claude", "--url", open.url, "--print", "--", "-p", "it's"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent, null);
    const lines = r.stdout.trim().split("\n");
    assert.equal(lines[0], `export ANTHROPIC_BASE_URL='${open.url}'`);
    assert.ok(lines.includes("export ANTHROPIC_API_KEY=''"));
    assert.ok(lines.includes(`export ANTHROPIC_MODEL='${MODEL}'`));
    assert.equal(lines.at(-1), `'claude' '-p' 'it'\\''s'`);
    // What it prints is what a shell runs: the same settings through bash and the stand-in.
    const dir = tempDir("torchtpu-launch-");
    const out = path.join(dir, "agent.json");
    const sh = spawnSync("bash", ["-c", r.stdout], {
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, FAKE_AGENT_OUT: out },
      encoding: "utf8",
    });
    assert.equal(sh.status, 0, sh.stderr);
    const agent = JSON.parse(fs.readFileSync(out, "utf8"));
    assert.deepEqual(agent.argv, ["-p", "it's"]);
    assert.equal(agent.replies.ANTHROPIC_MODEL, HELLO);
  });
});

describe("codex", () => {
  test("a Responses provider for this run, with the key in the variable env_key names", () => {
    const r = launch(["codex", "--url", keyed.url, "--api-key", KEY, "--", "exec", "Say hello"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.error, undefined);
    assert.deepEqual(r.agent.config, {
      model_provider: "torchtpu",
      "model_providers.torchtpu.name": "torchtpu-cpp",
      "model_providers.torchtpu.base_url": `${keyed.url}/v1`,
      "model_providers.torchtpu.wire_api": "responses",
      "model_providers.torchtpu.env_key": "TORCHTPU_API_KEY",
    });
    assert.equal(r.agent.apiKey, KEY);
    assert.equal(r.agent.model, MODEL);
    assert.deepEqual(r.agent.rest, ["exec", "Say hello"]);
    assert.deepEqual(r.agent.replies, { [MODEL]: HELLO });
  });

  // Behind a reverse proxy at /llm: every request launch and the agent send goes under it.
  test("a server under a path, as a reverse proxy serves it", async () => {
    const proxy = await pathProxy(open.url, "/llm");
    try {
      const r = await launchAsync(["codex", "--url", `${proxy.url}/`]);
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.agent.config["model_providers.torchtpu.base_url"], `${proxy.url}/v1`);
      assert.deepEqual(r.agent.replies, { [MODEL]: HELLO });
    } finally {
      await proxy.close();
    }
  });

  test("a server without a key gets a provider without env_key", () => {
    const r = launch(["codex", "--url", open.url.replace("http://", "")]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.config["model_providers.torchtpu.env_key"], undefined);
    assert.equal(r.agent.config["model_providers.torchtpu.base_url"], `${open.url}/v1`);
    assert.deepEqual(r.agent.replies, { [MODEL]: HELLO });
  });
});

describe("opencode", () => {
  test("an OpenAI-compatible provider in OPENCODE_CONFIG_CONTENT, as its model and small model", () => {
    const r = launch(["opencode", "--url", keyed.url, "--api-key", KEY, "--", "run", "hi"]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.error, undefined);
    assert.deepEqual(r.agent.argv, ["run", "hi"]);
    assert.deepEqual(r.agent.config, {
      $schema: "https://opencode.ai/config.json",
      provider: {
        torchtpu: {
          npm: "@ai-sdk/openai-compatible",
          name: "torchtpu-cpp",
          options: { baseURL: `${keyed.url}/v1`, apiKey: KEY },
          models: { [MODEL]: { name: MODEL } },
        },
      },
      model: `torchtpu/${MODEL}`,
      small_model: `torchtpu/${MODEL}`,
    });
    assert.deepEqual(r.agent.replies, { model: HELLO, small_model: HELLO });
  });

  test("a server without a key gets a provider without apiKey", () => {
    const r = launch(["opencode", "--url", open.url]);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.agent.config.provider.torchtpu.options.apiKey, undefined);
    assert.deepEqual(r.agent.replies, { model: HELLO, small_model: HELLO });
  });
});

describe("errors name what to do, and no agent runs", () => {
  test("no server at the URL", async () => {
    const port = await closedPort();
    const r = launch(["claude", "--url", `http://127.0.0.1:${port}`]);
    assert.equal(r.status, 1);
    assert.equal(r.agent, null);
    assert.match(r.stderr, new RegExp(`error: no server answers at http://127\\.0\\.0\\.1:${port} ` +
      "\\(connection refused or unreachable\\): start one with `torchtpu-cpp serve`, or name yours with --url"));
    const tls = launch(["claude", "--url", open.url.replace("http://", "https://")]);
    assert.equal(tls.status, 1);
    assert.match(tls.stderr,
      /\(the TLS handshake failed \(an https:\/\/ URL for a server that speaks http:\/\/\?\)\)/);
  });

  test("a server that wants a key, without one or with a wrong one", () => {
    const none = launch(["codex", "--url", keyed.url]);
    assert.equal(none.status, 2);
    assert.equal(none.agent, null);
    assert.match(none.stderr, new RegExp(`error: ${keyed.url} wants an API key \\(HTTP 401 from ` +
      "/v1/models\\): pass the key it was started with as --api-key or \\$TORCHTPU_API_KEY"));
    const wrong = launch(["codex", "--url", keyed.url, "--api-key", "sk-wrong"]);
    assert.equal(wrong.status, 2);
    assert.match(wrong.stderr, new RegExp(`error: ${keyed.url} refused the API key \\(HTTP 401`));
  });

  test("a model the server does not list", () => {
    const r = launch(["claude", "--url", open.url, "--model", "gemma-4-31b"]);
    assert.equal(r.status, 2);
    assert.equal(r.agent, null);
    assert.match(r.stderr, new RegExp(`error: --model 'gemma-4-31b' is not served at ${open.url}, ` +
      `which lists '${MODEL}'`));
  });

  test("an agent that is not installed", () => {
    const empty = tempDir("torchtpu-launch-path-");
    const r = launch(["codex", "--url", open.url], { pathVar: empty });
    assert.equal(r.status, 1);
    assert.match(r.stderr, new RegExp("error: `codex` \\(Codex\\) is not on PATH: install it " +
      "\\(npm install -g @openai/codex\\), or see with --print what it would be run with"));
  });

  test("an agent launch does not know, and a URL that is not http", () => {
    const r = launch(["aider"]);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /agent: aider not in \{claude,codex,opencode\}/);
    const ftp = launch(["claude", "--url", "ftp://127.0.0.1:1"]);
    assert.equal(ftp.status, 2);
    assert.match(ftp.stderr, /error: --url ftp:\/\/127\.0\.0\.1:1 is not an http:\/\/ or https:\/\/ URL/);
  });
});
