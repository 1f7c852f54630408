// Starts `torchtpu-cpp serve` (or `proxy`) on a free port and stops it; shared by the server test
// files and bench/serve_bench.mjs.
import { spawn } from "node:child_process";
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

// Resolves to {url, baseURL, child, stop()} once the server answers /health with 200.
export async function startServer(args = [], { env = {}, readyTimeoutMs = 240_000 } = {}) {
  const child = spawn(cliPath(), ["serve", "--port", "0", ...args], {
    env: {
      // One intra-op thread: the demo model is tiny, and extra threads only contend with the
      // other test processes on small CI machines.
      OMP_NUM_THREADS: "1",
      ...process.env,
      XDG_CACHE_HOME: process.env.XDG_CACHE_HOME ?? path.join(os.tmpdir(), "torchtpu-js-cache"),
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const url = await new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/serving \S+ on (http:\/\/\S+)/);
      if (m) resolve(m[1]);
    });
    exited.then(({ code }) => reject(new Error(`server exited with ${code} before listening:\n${stderr}`)));
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

// `torchtpu-cpp proxy --port 0 ARGS`: {child, url (a promise), exited (its code), stderr()}.
export function startProxy(args) {
  const child = spawn(cliPath(), ["proxy", "--port", "0", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const url = new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/proxy on (http:\/\/\S+) for/);
      if (m) resolve(m[1]);
    });
    exited.then((code) => reject(new Error(`proxy exited with ${code}:\n${stderr}`)));
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
