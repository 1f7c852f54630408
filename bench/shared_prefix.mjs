// Time to a first token for prompts that part from an earlier one at a turn (issue #17's prefix
// cache): another conversation after the same system prompt, and a conversation's last message
// edited. Each is set against the round's first request, which read its prompt from scratch, in
// the same run.
//
// Usage: node bench/shared_prefix.mjs [--url http://HOST:PORT] [--system-words 150] [--rounds 3]
//                                     [-- serve arguments, e.g. --model DIR --emb4 DIR]
// Without --url it starts a server (bench/driver_server.mjs) and stops it afterwards. Each round
// has a system prompt of its own, so no round reuses another's. A request is greedy with
// max_tokens 1: its time is the time to its first token.
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { driverArgs } from "./driver_server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const { default: OpenAI } = await import(join(here, "../tests/js/node_modules/openai/index.mjs"));

// E2B's first load maps gigabytes: more than the tests' four minutes on a slow disk.
const { option, start } = driverArgs(process.argv.slice(2), { readyTimeoutMs: 900_000 });
const systemWords = Number(option("--system-words", 150));
const rounds = Number(option("--rounds", 3));
const { url, server } = await start();
const client = new OpenAI({ apiKey: process.env.TORCHTPU_API_KEY ?? "none", baseURL: `${url}/v1`,
  maxRetries: 0, timeout: 900_000 });
const model = (await client.models.list()).data[0].id;
const engine = await (await fetch(`${url}/v1/engine`)).json();
console.log(`model ${model} on ${engine.device} (${engine.dtype}), torchtpu-cpp ` +
  `${engine.build?.git_revision}, prefix cache block ${engine.prefix_cache?.block ?? "?"}`);

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// One greedy request for one token: {s, prompt, cached}.
async function first(messages) {
  const start = performance.now();
  const r = await client.chat.completions.create({ model, messages, max_tokens: 1, temperature: 0 });
  return { s: (performance.now() - start) / 1000, prompt: r.usage.prompt_tokens,
    cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

const words = ["river", "stone", "light", "harbor", "garden", "winter", "signal", "meadow"];
const rows = [];
for (let round = 0; round < rounds; round++) {
  const text = Array.from({ length: systemWords }, (_, i) => words[(i * 7 + round) % words.length]);
  const system = { role: "system", content: `Round ${round}. You know these words: ${text.join(" ")}.` };
  const a = await first([system, { role: "user", content: "Name a river." }]);
  const b = await first([system, { role: "user", content: "Name a bird." }]);
  const history = [system, { role: "user", content: "Name a river." },
    { role: "assistant", content: "The Danube." }, { role: "user", content: "And a lake?" }];
  const h = await first(history);
  const e = await first([...history.slice(0, -1), { role: "user", content: "And a sea?" }]);
  rows.push({ a, b, h, e });
  const show = (x) => `${x.s.toFixed(3)} s (${x.cached}/${x.prompt} cached)`;
  console.log(`round ${round + 1}: A ${show(a)}, B ${show(b)}, B/A ${(b.s / a.s).toFixed(3)}; ` +
    `next turn ${show(h)}, its last message edited ${show(e)}, edited/A ${(e.s / a.s).toFixed(3)}`);
}
console.log(`median: another conversation ${median(rows.map((r) => r.b.s / r.a.s)).toFixed(3)}x ` +
  `the first's time to its first token; an edited last message ` +
  `${median(rows.map((r) => r.e.s / r.a.s)).toFixed(3)}x`);
if (server) await server.stop();
