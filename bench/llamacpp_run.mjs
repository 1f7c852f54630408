// llama.cpp as the peer, through node-llama-cpp's prebuilt binaries: feeds token ids (never text)
// and decodes greedily. Prints one JSON object.
//
// One greedy run (the agreement test; --probabilities adds each step's log-probabilities over the
// whole vocabulary, for small models):
//   node bench/llamacpp_run.mjs --model M.gguf --ids 2,17,9 --new 32 [--kv-type F32] [--threads 1]
//       [--lora ADAPTER.gguf [--lora-scale 1]]
// The benchmark (the same measurements and prompts as `torchtpu-cpp bench`):
//   node bench/llamacpp_run.mjs --model M.gguf --bench --vocab 262144
//       [--prompt-tokens 19,512,4096] [--new 64] [--repeats 3] [--seed 0] [--context 8192]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";
import {createRequire} from "node:module";
import {dirname, join} from "node:path";
import {parseArgs} from "node:util";

const {values: args} = parseArgs({
  options: {
    model: {type: "string"},
    ids: {type: "string"},
    bench: {type: "boolean", default: false},
    vocab: {type: "string"},
    "prompt-tokens": {type: "string", default: "19,512,4096"},
    new: {type: "string", default: "64"},
    repeats: {type: "string", default: "3"},
    seed: {type: "string", default: "0"},
    context: {type: "string", default: "8192"},
    batch: {type: "string"},
    threads: {type: "string", default: "2"},
    "kv-type": {type: "string"},
    "flash-attention": {type: "string", default: "auto"},
    probabilities: {type: "boolean", default: false},
    lora: {type: "string"},
    "lora-scale": {type: "string", default: "1"},
    verbose: {type: "boolean", default: false},
  },
});
if (!args.model) throw new Error("give --model FILE.gguf");
if (!args.ids && !args.bench) throw new Error("give --ids 1,2,3 or --bench");

// The same ids as torchtpu-cpp bench (src/cli/bench_command.cpp, bench_prompt): SplitMix64 seeded
// with seed * 2^32 + length, each id the output modulo the vocabulary size.
export function benchPrompt(seed, length, vocab) {
  const mask = (1n << 64n) - 1n;
  let state = ((BigInt(seed) << 32n) + BigInt(length)) & mask;
  const ids = [];
  for (let i = 0; i < length; i++) {
    state = (state + 0x9e3779b97f4a7c15n) & mask;
    let z = state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & mask;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & mask;
    z ^= z >> 31n;
    ids.push(Number(z % BigInt(vocab)));
  }
  return ids;
}

function packageVersion(name) {
  const main = createRequire(import.meta.url).resolve(name);
  let dir = dirname(main);
  while (!dir.endsWith(join("node_modules", name))) dir = dirname(dir);
  return JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).version;
}

// VmHWM of this process. Not getrusage's maxRSS: that survives fork + exec, so a child of a big
// parent would report the parent's peak.
function peakResidentBytes() {
  const line = readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith("VmHWM:"));
  return Number(line.split(/\s+/)[1]) * 1024;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};
const rates = (tokS) => ({
  tok_s: tokS,
  median_tok_s: median(tokS),
  min_tok_s: Math.min(...tokS),
  max_tok_s: Math.max(...tokS),
});
const now = () => Number(process.hrtime.bigint()) / 1e9;

const threads = Number(args.threads);
const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: threads,
  logLevel: args.verbose ? LlamaLogLevel.info : LlamaLogLevel.error,
});
let start = now();
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: true});
const contextOptions = {
  contextSize: Number(args.context),
  threads,
  flashAttention: args["flash-attention"] === "auto" ? "auto" : args["flash-attention"] === "true",
};
if (args.batch) contextOptions.batchSize = Number(args.batch);
if (args["kv-type"]) {
  contextOptions.experimentalKvCacheKeyType = args["kv-type"];
  contextOptions.experimentalKvCacheValueType = args["kv-type"];
}
// A LoRA adapter's GGUF (bench/gguf_export.py --lora) applied at --lora-scale.
if (args.lora) {
  contextOptions.lora = {adapters: [{filePath: args.lora, scale: Number(args["lora-scale"])}]};
}
const context = await model.createContext(contextOptions);
const loadS = now() - start;
const sequence = context.getSequence();

// Reads `prompt` into a cleared sequence and decodes `count` tokens greedily (EOS does not stop
// it). read_s runs until the first token is known, decode_s over the other count - 1.
async function decode(prompt, count, probabilities = false) {
  await sequence.clearHistory();
  const tokens = [];
  const logprobs = [];
  const begin = now();
  let firstAt = 0;
  const steps = probabilities
    ? sequence.evaluateWithMetadata(prompt, {probabilities: true}, {temperature: 0})
    : sequence.evaluate(prompt, {temperature: 0});
  for await (const step of steps) {
    if (probabilities) {
      const row = new Array(step.probabilities.size).fill(null);
      for (const [token, p] of step.probabilities) row[token] = Math.log(p);
      logprobs.push(row);
      tokens.push(step.token);
    } else {
      tokens.push(step);
    }
    if (tokens.length === 1) firstAt = now();
    if (tokens.length >= count) break;
  }
  const result = {tokens, read_s: firstAt - begin, decode_s: now() - firstAt};
  if (probabilities) result.logprobs = logprobs;
  return result;
}

const out = {
  peer: "llama.cpp",
  node_llama_cpp: packageVersion("node-llama-cpp"),
  llama_cpp_release: llama.llamaCppRelease,
  model: args.model,
  threads,
  context: context.contextSize,
  batch: context.batchSize,
  flash_attention: context.flashAttention,
  kv_type: args["kv-type"] ?? "F16 (default)",
  load_s: loadS,
};

if (args.ids) {
  const ids = args.ids.split(",").map(Number);
  const result = await decode(ids, Number(args.new), args.probabilities);
  Object.assign(out, result, {prompt_tokens: ids.length});
} else {
  if (!args.vocab) throw new Error("--bench needs --vocab (the prompts are random ids below it)");
  const vocab = Number(args.vocab);
  const seed = Number(args.seed);
  const lengths = args["prompt-tokens"].split(",").map(Number);
  const count = Number(args.new);
  const repeats = Number(args.repeats);
  const shortPrompt = benchPrompt(seed, lengths[0], vocab);

  start = now();
  const first = await decode(shortPrompt, count);
  out.first_call_s = now() - start;
  out.first_call = {read_s: first.read_s, decode_s: first.decode_s};

  out.prompt_read = [];
  for (const length of lengths) {
    const prompt = benchPrompt(seed, length, vocab);
    const readS = [];
    for (let r = 0; r < repeats; r++) readS.push((await decode(prompt, 1)).read_s);
    out.prompt_read.push({
      prompt_tokens: length,
      read_s: readS,
      first_ids: prompt.slice(0, 4),
      ...rates(readS.map((s) => length / s)),
    });
  }
  // llama.cpp keeps tokens on the host: every step is a host read, so streamed is all it has.
  const decodeS = [];
  let tokens = [];
  for (let r = 0; r < repeats; r++) {
    const result = await decode(shortPrompt, count);
    decodeS.push(result.decode_s);
    tokens = result.tokens;
  }
  out.decode = [{read_every: 1, decode_s: decodeS, ...rates(decodeS.map((s) => (count - 1) / s))}];
  out.tokens = tokens;
  out.seed = seed;
  out.repeats = repeats;
  out.new = count;
  out.decode_prompt_tokens = lengths[0];
}
out.peak_rss_bytes = peakResidentBytes();
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();
