// Decode rate as a client sees it vs the engine's own timer, through `torchtpu-cpp serve` and the
// official `openai` SDK (or `ollama`'s, on Ollama's /api/chat): the seed's five requests of "Write
// a short paragraph about the ocean." at max_tokens 100, one at a time, streamed, greedy
// (temperature 0) as the seeds decoded.
//
// Usage: node bench/serve_bench.mjs [--url http://HOST:PORT] [--requests 5] [--max-tokens 100]
//                                   [--concurrency 1,2,4,8] [--api openai|ollama|both]
//                                   [-- serve arguments, e.g. --model DIR --dtype bfloat16]
// Without --url it starts `$TORCHTPU_CLI serve --port 0 <serve arguments>` (default
// build/torchtpu-cpp; no --model: the demo checkpoint) and stops it afterwards.
// The client rate counts the tokens after the first over the time from the first content chunk
// to the last; the engine rate is the same count over the engine's decode seconds.
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { driverArgs } from "./driver_server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const { default: OpenAI } = await import(join(here, "../tests/js/node_modules/openai/index.mjs"));
const { Ollama } = await import(join(here, "../tests/js/node_modules/ollama/dist/index.mjs"));

const { option, start } = driverArgs(process.argv.slice(2));
const requests = Number(option("--requests", 5));
const api = option("--api", "openai");
if (!["openai", "ollama", "both"].includes(api)) throw new Error(`--api openai|ollama|both, got ${api}`);
const maxTokens = Number(option("--max-tokens", 100));
const prompt = "Write a short paragraph about the ocean.";

const { url, server } = await start();
const apiKey = process.env.TORCHTPU_API_KEY ?? "none";
const client = new OpenAI({ apiKey, baseURL: `${url}/v1`, maxRetries: 0 });
const ollama = new Ollama({ host: url, headers: { Authorization: `Bearer ${apiKey}` } });
const model = (await client.models.list()).data[0].id;
const engine = await (await fetch(`${url}/v1/engine`, { headers: { Authorization: `Bearer ${apiKey}` } })).json();
console.log(`model ${model} on ${engine.device} (${engine.dtype}), torchtpu-cpp ${engine.build?.git_revision}`);

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// One streamed, greedy request; its client-side times (ms since `performance` began) and the
// engine's timings and usage.
async function streamOnce(ignoreEos = false) {
  const start = performance.now();
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
    ...(ignoreEos ? { ignore_eos: true } : {}),
  });
  const r = { start, first: null, last: null, finish: null, timings: null, usage: null };
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice?.delta?.content) {
      r.last = performance.now();
      r.first ??= r.last;
    }
    if (choice?.finish_reason) {
      r.finish = choice.finish_reason;
      r.timings = chunk.timings;
    }
    if (chunk.usage) r.usage = chunk.usage;
  }
  r.end = performance.now();
  r.n = r.usage.completion_tokens;
  return rates(r, r.timings.read_s, r.timings.decode_s);
}

// The client's rate, counted as for chat, and the engine's from its read and decode seconds.
function rates(r, readS, decodeS) {
  r.clientRate = r.n > 1 && r.last > r.first ? (r.n - 1) / ((r.last - r.first) / 1000) : NaN;
  r.engineRate = r.n > 1 && decodeS > 0 ? (r.n - 1) / decodeS : NaN;
  r.readS = readS;
  r.decodeS = decodeS;
  return r;
}

// The same request on Ollama's /api/chat: its done line's eval_count and prompt_eval_duration /
// eval_duration (nanoseconds) are the engine's count and timer.
async function streamOllama() {
  const start = performance.now();
  const r = { start, first: null, last: null, finish: null };
  let done = null;
  for await (const part of await ollama.chat({
    model, messages: [{ role: "user", content: prompt }], stream: true,
    options: { temperature: 0, num_predict: maxTokens },
  })) {
    if (part.message.content) {
      r.last = performance.now();
      r.first ??= r.last;
    }
    if (part.done) done = part;
  }
  r.end = performance.now();
  r.finish = done.done_reason;
  r.n = done.eval_count;
  return rates(r, done.prompt_eval_duration / 1e9, done.eval_duration / 1e9);
}

for (const which of api === "both" ? ["openai", "ollama"] : [api]) {
  const clientRates = [];
  const engineRates = [];
  for (let i = 1; i <= requests; ++i) {
    const r = which === "openai" ? await streamOnce() : await streamOllama();
    clientRates.push(r.clientRate);
    engineRates.push(r.engineRate);
    console.log(
      `${which} request ${i}: ${r.n} tokens, finish ${r.finish}, read ${r.readS.toFixed(3)} s, ` +
        `decode ${r.decodeS.toFixed(3)} s, engine ${r.engineRate.toFixed(2)} tok/s, ` +
        `client ${r.clientRate.toFixed(2)} tok/s, first token ${((r.first - r.start) / 1000).toFixed(3)} s, ` +
        `round trip ${((r.end - r.start) / 1000).toFixed(2)} s`,
    );
  }
  const c = median(clientRates);
  const e = median(engineRates);
  console.log(`${which}: median engine ${e.toFixed(2)} tok/s, client ${c.toFixed(2)} tok/s, ` +
    `client/engine ${(c / e).toFixed(3)}`);
}

// --concurrency 1,2,4,8: that many streams at once (max_tokens each, end of turn ignored), for
// the server's batching: aggregate tokens over the wall time until the last ends, each stream's
// own rate and its time to first token.
const sweep = option("--concurrency", "");
for (const streams of sweep ? sweep.split(",").map(Number) : []) {
  const start = performance.now();
  const rs = await Promise.all(Array.from({ length: streams }, () => streamOnce(true)));
  const wall = (performance.now() - start) / 1000;
  const tokens = rs.reduce((sum, r) => sum + r.n, 0);
  console.log(
    `${streams} streams: aggregate ${(tokens / wall).toFixed(2)} tok/s (${tokens} tokens in ` +
      `${wall.toFixed(2)} s), per stream median ${median(rs.map((r) => r.clientRate)).toFixed(2)} ` +
      `tok/s, first token median ${(median(rs.map((r) => r.first - r.start)) / 1000).toFixed(3)} s`,
  );
}
if (server) await server.stop();
