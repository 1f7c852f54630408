// The coding agents themselves through `torchtpu-cpp launch`: Claude Code, Codex and OpenCode at
// the versions tests/agents pins, run non-interactively against a server with a key on the demo
// checkpoint. The forced-output test hook answers a prompt holding "Say hello" with "Hello there,
// friend.", so that text in an agent's output came from this server, through the API that agent
// speaks (Messages, Responses, Chat Completions) with the requests that agent really sends: its
// system prompt, its tools, its extra fields. Then the tool loop: the model calls the agent's
// shell tool (a Gemma 4 call the server parses into that API's call), the agent runs `ls`, sends
// the result back, and the answer forced for a prompt holding the listed file name comes out.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { RULES, startForcedServer } from "./forced_output.mjs";
import { cliPath, metric, metrics, tempDir } from "./server_helpers.mjs";

const KEY = "sk-agents-test";
const HELLO = "Hello there, friend.";
const Q = '<|"|>';
const MARKER = "MARKER-FILE-7";
const FOUND = `The folder holds ${MARKER}.`;
// Each agent's shell tool as its own name and arguments. The marker rule comes first: only the
// request that carries the tool's result holds the file's name.
const TOOL_RULES = [
  { prompt_contains: MARKER, output: FOUND },
  { prompt_contains: "List the files with Bash",
    output: `<|tool_call>call:Bash{command:${Q}ls${Q},description:${Q}List the files${Q}}<tool_call|>` },
  { prompt_contains: "List the files with exec_command",
    output: `<|tool_call>call:exec_command{cmd:${Q}ls${Q}}<tool_call|>` },
  { prompt_contains: "List the files with bash",
    output: `<|tool_call>call:bash{command:${Q}ls${Q},description:${Q}List the files${Q}}<tool_call|>` },
];
const AGENTS_BIN = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../agents/node_modules/.bin");

let server;

before(async () => {
  // Claude Code's first request is about 18,000 tokens.
  server = await startForcedServer([...TOOL_RULES, ...RULES], ["--context", "32768", "--api-key", KEY]);
});

after(async () => {
  if (server) await server.stop();
});

// `torchtpu-cpp launch AGENT --url … --api-key … -- ARGS` with the pinned agents on PATH, in a
// home of their own (no settings, sessions or keys of the machine's user) that is also the
// working directory and holds one file, MARKER; stdin closed.
function launch(agent, args) {
  const home = tempDir(`torchtpu-agent-${agent}-`);
  fs.writeFileSync(path.join(home, MARKER), "");
  // PWD too: OpenCode takes its project's directory from it, not from the process's.
  const env = { ...process.env, HOME: home, PWD: home, PATH: `${AGENTS_BIN}:${process.env.PATH}` };
  for (const name of ["XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
    "TORCHTPU_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_HOME"]) {
    delete env[name];
  }
  // Telemetry, update checks and the like: nothing but the server is reachable in CI.
  env.CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1";
  const r = spawnSync(cliPath(), ["launch", agent, "--url", server.url, "--api-key", KEY, "--", ...args], {
    env, cwd: home, encoding: "utf8", timeout: 240_000, stdio: ["ignore", "pipe", "pipe"],
  });
  return { status: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

async function promptTokens() {
  return metric(await metrics(server.url, { authorization: `Bearer ${KEY}` }), "torchtpu_prompt_tokens_total");
}

// How each agent is asked one thing non-interactively, allowed to run its shell tool (Claude Code
// asks first otherwise; Codex's sandbox is its own business, not this test's).
const AGENTS = {
  claude: { run: (prompt) => ["-p", prompt, "--allowedTools", "Bash"], shell: "Bash" },
  codex: {
    run: (prompt) => ["exec", "--skip-git-repo-check", "-s", "danger-full-access", prompt],
    shell: "exec_command",
  },
  opencode: { run: (prompt) => ["run", prompt], shell: "bash" },
};

for (const [agent, { run, shell }] of Object.entries(AGENTS)) {
  test(`${agent} answers with what the server says`, async () => {
    const before = await promptTokens();
    const r = launch(agent, run("Say hello"));
    const output = `status ${r.status} ${r.signal ?? ""}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    assert.equal(r.status, 0, output);
    assert.ok(r.stdout.includes(HELLO), output);
    assert.doesNotMatch(r.stderr, /launch: warning/);
    // The agent's own prompt went through the engine: thousands of tokens, not a probe.
    assert.ok((await promptTokens()) - before > 1000, output);
  });

  test(`${agent} runs the shell tool the model calls and answers from its result`, () => {
    const r = launch(agent, run(`List the files with ${shell}`));
    const output = `status ${r.status} ${r.signal ?? ""}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`;
    assert.equal(r.status, 0, output);
    assert.ok(r.stdout.includes(FOUND), output);
  });
}
