// The command line of the drivers that measure through `torchtpu-cpp serve`: their own options
// before `--`, the server's after it. Without --url a driver starts `$TORCHTPU_CLI serve --port 0
// <serve arguments>` (default build/torchtpu-cpp; no --model: the demo checkpoint) and stops it
// when it is done.
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const { startServer } = await import(join(here, "../tests/js/server_helpers.mjs"));

// {option(name, fallback), start()}: start() resolves to {url, server (null with --url)}.
export function driverArgs(argv, { readyTimeoutMs } = {}) {
  const dash = argv.indexOf("--");
  const serveArgs = dash >= 0 ? argv.slice(dash + 1) : [];
  const own = dash >= 0 ? argv.slice(0, dash) : argv;
  const option = (name, fallback) => {
    const i = own.indexOf(name);
    return i >= 0 ? own[i + 1] : fallback;
  };
  const start = async () => {
    const url = option("--url", null);
    if (url) return { url, server: null };
    process.env.TORCHTPU_CLI ??= join(here, "../build/torchtpu-cpp");
    if (!existsSync(process.env.TORCHTPU_CLI)) {
      throw new Error(`no server binary at ${process.env.TORCHTPU_CLI}; set TORCHTPU_CLI or --url`);
    }
    // The tests' helper pins the server to one intra-op thread; a benchmark keeps the caller's
    // OMP_NUM_THREADS, or "0", which the engine reads as "the physical cores".
    const threads = process.env.OMP_NUM_THREADS ?? "0";
    const server = await startServer(serveArgs, { env: { OMP_NUM_THREADS: threads },
      ...(readyTimeoutMs ? { readyTimeoutMs } : {}) });
    return { url: server.url, server };
  };
  return { option, start };
}
