// A stand-in for Claude Code, Codex or OpenCode (`node fake_agent.mjs AGENT ARGS...`, run through
// a script of the agent's name on PATH) for launch.test.mjs: it reads its settings the way the real
// agent does (Claude Code: the ANTHROPIC_* environment; Codex: `-c key=value` TOML settings, `-m`
// and the variable the provider's env_key names; OpenCode: the configuration in
// OPENCODE_CONFIG_CONTENT), asks the server "Say hello" through the official SDK of the API that
// agent speaks, and writes what it was given and what came back as JSON to $FAKE_AGENT_OUT.
import fs from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const [agent, ...argv] = process.argv.slice(2);
const out = { agent, argv };

async function claude() {
  out.env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith("ANTHROPIC_")));
  // Claude Code sends ANTHROPIC_AUTH_TOKEN as a bearer token, and an empty ANTHROPIC_API_KEY as none.
  const client = new Anthropic({
    baseURL: process.env.ANTHROPIC_BASE_URL,
    authToken: process.env.ANTHROPIC_AUTH_TOKEN,
    apiKey: process.env.ANTHROPIC_API_KEY || null,
    maxRetries: 0,
  });
  // The main model and the one its background tasks name.
  out.replies = {};
  for (const variable of ["ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"]) {
    const m = await client.messages.create({
      model: process.env[variable],
      max_tokens: 50,
      messages: [{ role: "user", content: "Say hello" }],
    });
    out.replies[variable] = m.content[0].text;
  }
}

async function codex() {
  // Codex's own command line: `-c key=value` (a TOML value; launch sends quoted strings, which
  // JSON reads the same), `-m model`, then the user's arguments.
  out.config = {};
  out.rest = [];
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === "-c") {
      const [key, ...value] = argv[++i].split("=");
      out.config[key] = JSON.parse(value.join("="));
    } else if (argv[i] === "-m") {
      out.model = argv[++i];
    } else {
      out.rest.push(argv[i]);
    }
  }
  const provider = `model_providers.${out.config.model_provider}`;
  if (out.config[`${provider}.wire_api`] !== "responses") throw new Error("not a Responses provider");
  const envKey = out.config[`${provider}.env_key`];
  out.apiKey = envKey ? process.env[envKey] : null;
  const client = new OpenAI({
    baseURL: out.config[`${provider}.base_url`],
    // Without env_key Codex sends no key; the SDK wants one, which a server without a key ignores.
    apiKey: out.apiKey ?? "none",
    maxRetries: 0,
  });
  const r = await client.responses.create({ model: out.model, input: "Say hello" });
  out.replies = { [out.model]: r.output_text };
}

async function opencode() {
  // "provider/model" names a model of a provider the configuration defines; a provider through
  // @ai-sdk/openai-compatible speaks Chat Completions at options.baseURL.
  out.config = JSON.parse(process.env.OPENCODE_CONFIG_CONTENT);
  out.replies = {};
  for (const field of ["model", "small_model"]) {
    const [providerId, ...model] = out.config[field].split("/");
    const provider = out.config.provider[providerId];
    if (provider.npm !== "@ai-sdk/openai-compatible") throw new Error(`${field}: not OpenAI-compatible`);
    if (!(model.join("/") in provider.models)) throw new Error(`${field}: not among the provider's models`);
    const client = new OpenAI({
      baseURL: provider.options.baseURL,
      apiKey: provider.options.apiKey ?? "none",
      maxRetries: 0,
    });
    const c = await client.chat.completions.create({
      model: model.join("/"),
      messages: [{ role: "user", content: "Say hello" }],
    });
    out.replies[field] = c.choices[0].message.content;
  }
}

const agents = { claude, codex, opencode };
try {
  await agents[agent]();
} catch (e) {
  out.error = String(e);
  process.exitCode = 3;
}
fs.writeFileSync(process.env.FAKE_AGENT_OUT, JSON.stringify(out));
