// llama.cpp's side of bench/batch_decode.py (issue #17): several streams decoding at once in one
// multi-sequence context of node-llama-cpp (llama.cpp batches the sequences' tokens into one
// decode per step). Feeds the same token ids as batch_decode.py, decodes greedily, EOS ignored.
// Prints one JSON object.
//
//   node bench/llamacpp_batch.mjs --model M.gguf --vocab 262144 [--streams 1,2,4,8] [--new 32]
//       [--prompt 32] [--context 8192] [--threads 2]
//
// Each stream count gets a fresh context with that many sequences. The rate is measured as
// batch_decode.py measures ours: while every stream decodes, between the last stream's first token
// and the first stream's last, each stream's tokens over its time in that window, summed.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {parseArgs} from "node:util";

const {values: args} = parseArgs({
  options: {
    model: {type: "string"},
    vocab: {type: "string"},
    streams: {type: "string", default: "1,2,4,8"},
    new: {type: "string", default: "32"},
    prompt: {type: "string", default: "32"},
    context: {type: "string", default: "8192"},
    threads: {type: "string", default: "2"},
  },
});
if (!args.model || !args.vocab) throw new Error("give --model FILE.gguf and --vocab N");

// batch_decode.py's prompt(): BOS, then ordinary ids spread over the vocabulary.
function prompt(length, seed, vocab) {
  const ids = [2];
  for (let i = 0; i < length - 1; i++) ids.push(4 + ((seed * 7919 + i * 104729) % (vocab - 4)));
  return ids;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;
const threads = Number(args.threads);
const count = Number(args.new);
const vocab = Number(args.vocab);
const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: threads,
  logLevel: LlamaLogLevel.error,
});
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: true});

// One stream's greedy decode of `count` tokens; the arrival time of each token.
async function decode(sequence, ids) {
  const stamps = [];
  for await (const token of sequence.evaluate(ids, {temperature: 0})) {
    stamps.push(now());
    if (stamps.length >= count) break;
  }
  return stamps;
}

// batch_decode.py's all_decoding_rate, for one token per stamp; null when the streams never
// decode all at once.
function allDecodingRate(stamps) {
  const begin = Math.max(...stamps.map((st) => st[0]));
  const end = Math.min(...stamps.map((st) => st.at(-1)));
  let rate = 0;
  for (const st of stamps) {
    const inside = st.filter((t) => t >= begin && t <= end);
    if (inside.length < 2) return null;
    rate += (inside.length - 1) / (inside.at(-1) - inside[0]);
  }
  return rate;
}

const out = {
  peer: "llama.cpp",
  llama_cpp_release: llama.llamaCppRelease,
  model: args.model,
  threads,
  batches: [],
};
for (const streams of args.streams.split(",").map(Number)) {
  const context = await model.createContext({
    sequences: streams,
    contextSize: Number(args.context),
    threads,
  });
  const sequences = Array.from({length: streams}, () => context.getSequence());
  const start = now();
  const stamps = await Promise.all(
    sequences.map((sequence, s) => decode(sequence, prompt(Number(args.prompt), s, vocab))),
  );
  const end = now();
  const rate = allDecodingRate(stamps);
  out.context = context.contextSize;
  out.batch_size = context.batchSize;
  out.batches.push({
    streams,
    tokens: stamps.reduce((sum, st) => sum + st.length, 0),
    wall_s: end - start,
    aggregate_tok_s: rate,
    per_stream_tok_s: rate === null ? null : rate / streams,
  });
  console.error(JSON.stringify(out.batches.at(-1)));
  await context.dispose();
}
console.log(JSON.stringify(out));
await model.dispose();
await llama.dispose();
