// Starts `torchtpu-cpp serve` (or `proxy`) on a free port and stops it; shared by the server test
// files and bench/serve_bench.mjs.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "../..");

export function cliPath() {
  const cli = process.env.TORCHTPU_CLI;
  if (!cli) throw new Error("set TORCHTPU_CLI to the torchtpu-cpp binary (ctest does)");
  return cli;
}

// A new directory under the system's temporary one, removed with everything in it when this
// process exits (node --test runs each test file in a process of its own), so that test runs
// leave nothing behind.
const tempDirs = [];
process.on("exit", () => {
  for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
});
export function tempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.push(dir);
  return dir;
}

// The cache directory startServer gives the servers (XDG_CACHE_HOME), where the demo checkpoint is
// written the first time a server starts without --model.
export function cacheDir() {
  return process.env.XDG_CACHE_HOME ?? path.join(os.tmpdir(), "torchtpu-js-cache");
}

// The widely used 1x1 PNG placeholder, base64.
export const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

// A WAV file written from the RIFF/WAVE specification: mono at 16 kHz, `samples` samples of
// silence (0.1 s by default), PCM 16-bit or, with `float`, IEEE float32; the samples from byte 44.
export function wavBuffer(samples = 1600, { float = false } = {}) {
  const width = float ? 4 : 2;
  const b = Buffer.alloc(44 + samples * width);
  b.write("RIFF", 0);
  b.writeUInt32LE(36 + samples * width, 4);
  b.write("WAVEfmt ", 8);
  b.writeUInt32LE(16, 16);
  b.writeUInt16LE(float ? 3 : 1, 20);
  b.writeUInt16LE(1, 22);
  b.writeUInt32LE(16000, 24);
  b.writeUInt32LE(16000 * width, 28);
  b.writeUInt16LE(width, 32);
  b.writeUInt16LE(8 * width, 34);
  b.write("data", 36);
  b.writeUInt32LE(samples * width, 40);
  return b;
}

// wavBuffer's PCM 16-bit file, base64.
export function wav(samples = 1600) {
  return wavBuffer(samples).toString("base64");
}

// What a script of this folder writes from the demo checkpoint (`script DEMO_DIR OUT_DIR`, with
// $TORCHTPU_PYTHON: the project's, which has transformers) into a new temporary directory, whose
// path it returns. The demo checkpoint is written by the first server started without --model
// (startServer), so one must have started first.
function fromDemo(script, prefix) {
  const demo = path.join(cacheDir(), "torchtpu-cpp", "demo-v1");
  if (!fs.existsSync(path.join(demo, "config.json"))) {
    throw new Error(`${demo} has no checkpoint: start a server without --model first`);
  }
  const dir = tempDir(prefix);
  execFileSync(process.env.TORCHTPU_PYTHON ?? "python3", [path.join(here, script), demo, dir]);
  return dir;
}

// A tiny Gemma 4 checkpoint with a vision and an audio encoder (random weights, make_multimodal.py)
// that borrows the demo checkpoint's text model, tokenizer and template.
export function makeMultimodalCheckpoint() {
  return fromDemo("make_multimodal.py", "torchtpu-multimodal-");
}

// A random Gemma 4 assistant that fits the demo checkpoint (make_assistant.py): --draft-model.
export function makeAssistantCheckpoint() {
  return fromDemo("make_assistant.py", "torchtpu-assistant-");
}

// Two LoRA adapters for the demo checkpoint, written with PEFT (make_lora.py), and the tokens PEFT
// decodes with the first: {first, second, expected: {prompt, tokens, base_tokens}}.
export function makeLoraAdapters() {
  const dir = fromDemo("make_lora.py", "torchtpu-lora-");
  const expected = JSON.parse(fs.readFileSync(path.join(dir, "expected.json"), "utf8"));
  return { first: path.join(dir, "first"), second: path.join(dir, "second"), expected };
}

// Why the CLI could not be started (missing, not executable, being linked): a child that never
// started emits "error" and never "exit", and a test waiting on its exit alone would end with
// "Promise resolution is still pending" and no reason.
function cannotRun(error) {
  return `cannot run ${cliPath()}: ${error.message}`;
}

// Resolves to {url, baseURL, child, stop()} once the server answers /health with 200.
export async function startServer(args = [], { env = {}, readyTimeoutMs = 240_000 } = {}) {
  const child = spawn(cliPath(), ["serve", "--port", "0", ...args], {
    env: {
      // One intra-op thread: the demo model is tiny, and extra threads only contend with the
      // other test processes on small CI machines.
      OMP_NUM_THREADS: "1",
      ...process.env,
      XDG_CACHE_HOME: cacheDir(),
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((resolve) => {
    child.on("exit", (code, signal) => resolve({ code, signal }));
    child.on("error", (error) => resolve({ code: null, signal: null, error }));
  });
  const url = await new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/serving \S+ on (http:\/\/\S+)/);
      if (m) resolve(m[1]);
    });
    exited.then(({ code, error }) => reject(new Error(error ? cannotRun(error)
      : `server exited with ${code} before listening:\n${stderr}`)));
  });
  const deadline = Date.now() + readyTimeoutMs;
  for (;;) {
    const res = await fetch(`${url}/health`).catch(() => null);
    if (res?.status === 200) break;
    if (Date.now() > deadline) throw new Error(`server not healthy in time:\n${stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    baseURL: `${url}/v1`,
    child,
    exited,
    stderr: () => stderr,
    // SIGTERM, then the exit status.
    async stop() {
      if (child.exitCode === null) child.kill("SIGTERM");
      return exited;
    },
  };
}

// A port nothing listens on: bound, then closed.
export async function closedPort() {
  const s = net.createServer();
  await new Promise((resolve) => s.listen(0, "127.0.0.1", resolve));
  const { port } = s.address();
  await new Promise((resolve) => s.close(resolve));
  return port;
}

// A reverse proxy that serves `target` (http://host:port) under `prefix` ("/llm"), as one in front
// of a server at https://host/llm does: resolves to {url (with the prefix), close()}.
export async function pathProxy(target, prefix) {
  const { hostname, port } = new URL(target);
  const server = http.createServer((req, res) => {
    if (!req.url.startsWith(`${prefix}/`)) {
      res.writeHead(404).end();
      return;
    }
    const up = http.request({ hostname, port, path: req.url.slice(prefix.length), method: req.method,
      headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    });
    // A client that leaves closes the upstream request too, as nginx's proxy does by default.
    res.on("close", () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}${prefix}`,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

// `torchtpu-cpp proxy --port 0 ARGS`: {child, url (a promise), exited (its code), stderr()}.
export function startProxy(args) {
  const port = args.includes("--port") ? [] : ["--port", "0"];
  const child = spawn(cliPath(), ["proxy", ...port, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  let error = null;
  const exited = new Promise((resolve) => {
    child.on("exit", (code) => resolve(code));
    child.on("error", (e) => {
      error = e;
      resolve(null);
    });
  });
  const url = new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/proxy on (http:\/\/\S+) for/);
      if (m) resolve(m[1]);
    });
    exited.then((code) => reject(new Error(error ? cannotRun(error)
      : `proxy exited with ${code}:\n${stderr}`)));
  });
  return { child, url, exited, stderr: () => stderr };
}

// The value of a Prometheus sample, e.g. metric(text, "torchtpu_requests_cancelled_total").
export function metric(text, name) {
  for (const line of text.split("\n")) {
    if (line.startsWith(name + " ")) return Number(line.slice(name.length + 1));
  }
  return undefined;
}

// A histogram of a Prometheus text without labels of its own: {count, sum, le: {bound: count}},
// the bucket counts cumulative as the text gives them.
export function histogram(text, name) {
  const le = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^(\S+)_bucket\{le="([^"]+)"\} (\S+)$/);
    if (m && m[1] === name) le[m[2]] = Number(m[3]);
  }
  return { count: metric(text, `${name}_count`), sum: metric(text, `${name}_sum`), le };
}

export async function metrics(url, headers = {}) {
  const res = await fetch(`${url}/metrics`, { headers });
  return res.text();
}

// Polls until `predicate()` resolves truthy; fails after `ms`.
export async function eventually(predicate, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await predicate()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
