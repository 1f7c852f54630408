// What a router in front of many replicas needs from one (issue #21, docs/SCALING.md): /metrics
// readable without the API key (unless --metrics-auth) with the load gauges, under vLLM's names
// too with --metrics-compat vllm; readiness (/health) apart from liveness (/livez); the model's
// aliases (--served-model-name) accepted by every generation route; precise errors for bad
// values of the new flags; and a second signal ending the drain's grace early. The drain under
// load is in soak.test.mjs.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, statSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { cliPath, eventually, metric, startServer } from "./server_helpers.mjs";

const KEY = "sk-scale-test";
const auth = { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json" };
const NAMES = ["gemma-4-e2b", "publishers/ns/models/gemma-4-e2b", "gemma"];

// Every sample line of a Prometheus text exposition: name{labels} value, the name declared by
// the # TYPE line before it (the strict parser's rules that matter here; tests/go runs the real one).
function samples(text) {
  const out = [];
  let declared = null;
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const type = line.match(/^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$/);
    if (type) {
      declared = type[1];
      continue;
    }
    if (line.startsWith("# HELP ")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)$/);
    assert.ok(m, `not a sample line: ${line}`);
    assert.ok(declared && m[1].startsWith(declared), `${m[1]} is not declared by a # TYPE before it`);
    assert.ok(!Number.isNaN(Number(m[3])), line);
    out.push({ name: m[1], labels: m[2] ?? "", value: Number(m[3]) });
  }
  return out;
}

function sample(list, name) {
  const found = list.filter((s) => s.name === name);
  assert.equal(found.length, 1, `${name}: ${JSON.stringify(found)}`);
  return found[0];
}

async function post(url, path, body, headers = auth) {
  const res = await fetch(`${url}${path}`, { method: "POST", headers, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

// `torchtpu-cpp serve ARGS`, which must exit at once: {code, stdout, stderr}.
function refused(args) {
  return new Promise((resolve) => {
    const port = args.includes("--port") ? [] : ["--port", "0"];
    const child = spawn(cliPath(), ["serve", ...port, ...args], { stdio: "pipe" });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

describe("a replica behind a router", () => {
  let server;
  before(async () => {
    server = await startServer(["--api-key", KEY, "--context", "1024", "--parallel", "2",
      "--threads", "1", "--metrics-compat", "vllm", ...NAMES.flatMap((n) => ["--served-model-name", n])]);
  });
  after(async () => {
    if (server) await server.stop();
  });

  test("/metrics answers without the key, with the load gauges under both sets of names",
    async () => {
      const res = await fetch(`${server.url}/metrics`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
      const list = samples(await res.text());
      const model = `{model_name="${NAMES[0]}"}`;
      for (const [native, vllm] of [["torchtpu_queue_depth", "vllm:num_requests_waiting"],
        ["torchtpu_running_requests", "vllm:num_requests_running"],
        ["torchtpu_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc"],
        ["torchtpu_kv_cache_usage_ratio", "vllm:gpu_cache_usage_perc"]]) {
        assert.equal(sample(list, native).value, 0, native);
        assert.deepEqual(sample(list, vllm), { name: vllm, labels: model, value: 0 });
      }
      // A block is one position of the rings; each of the --parallel rows has --context.
      const info = '{block_size="1",num_gpu_blocks="2048"}';
      assert.deepEqual(sample(list, "torchtpu_cache_config_info"),
        { name: "torchtpu_cache_config_info", labels: info, value: 1 });
      assert.deepEqual(sample(list, "vllm:cache_config_info"),
        { name: "vllm:cache_config_info", labels: info, value: 1 });
      assert.equal(sample(list, "torchtpu_batch_rows").value, 2);
    });

  test("/props answers what clients written for llama-server read", async () => {
    assert.equal((await fetch(`${server.url}/props`)).status, 401);
    const res = await fetch(`${server.url}/props`, { headers: auth });
    assert.equal(res.status, 200);
    const props = await res.json();
    const engine = await (await fetch(`${server.url}/v1/engine`, { headers: auth })).json();
    assert.equal(props.default_generation_settings.n_ctx, 1024);
    assert.equal(props.default_generation_settings.n_ctx, engine.context);
    assert.equal(props.total_slots, 2);
    for (const route of ["slots", "props", "metrics"]) {
      assert.equal(props[`endpoint_${route}`], true, route);
      assert.equal((await fetch(`${server.url}/${route}`, { headers: auth })).status, 200, route);
    }
    assert.equal(props.model_alias, engine.model);
    assert.equal(props.model_path, engine.model_dir);
    assert.deepEqual(props.modalities, { vision: false, audio: false });
    assert.equal(props.is_sleeping, false);
    assert.equal(props.default_generation_settings.params.reasoning_budget, -1);
    assert.match(props.build_info, new RegExp(`^torchtpu-cpp ${engine.build.version} `));
    // The demo's template is Gemma 4's: it renders a system turn, tools and their calls and
    // results, and no call ids (tests/python checks every cap against transformers).
    assert.match(props.chat_template, /<\|turn>/);
    const caps = props.chat_template_caps;
    assert.equal(Object.keys(caps).length, 8);
    for (const name of ["supports_system_role", "supports_tools", "supports_tool_calls",
      "supports_tool_responses"]) assert.equal(caps[name], true, name);
    assert.equal(caps.supports_tool_call_id, false);
    const text = async (id) => (await post(server.url, "/detokenize", { tokens: [id] })).body.content;
    assert.equal(props.bos_token, await text(2));
    assert.equal(props.eos_token, await text(1));
    const wrong = await fetch(`${server.url}/props`, { method: "POST", headers: auth, body: "{}" });
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get("allow"), "GET");
  });

  test("a running request shows as running, holding its positions of the cache", async () => {
    const maxTokens = 400;
    const answer = post(server.url, "/v1/completions",
      { prompt: "Write about rain.", max_tokens: maxTokens, ignore_eos: true });
    let seen;
    await eventually(async () => {
      const list = samples(await (await fetch(`${server.url}/metrics`)).text());
      seen = {
        running: sample(list, "torchtpu_running_requests").value,
        usage: sample(list, "torchtpu_kv_cache_usage_ratio").value,
        generated: sample(list, "torchtpu_generated_tokens_total").value,
      };
      return seen.running === 1 && seen.usage > 0;
    }, "the request decoding", 60_000);
    const { status, body } = await answer;
    assert.equal(status, 200);
    const held = seen.usage * 2 * 1024;
    assert.ok(held >= body.usage.prompt_tokens && held <= body.usage.total_tokens,
      `${held} positions held, the request had ${body.usage.prompt_tokens} + ${maxTokens}`);
    // Once the answer is whole, the engine holds nothing for it.
    const list = samples(await (await fetch(`${server.url}/metrics`)).text());
    assert.equal(sample(list, "torchtpu_running_requests").value, 0);
    assert.equal(sample(list, "torchtpu_kv_cache_usage_ratio").value, 0);
    // Its times, under vLLM's names as well: the request in the latency histograms, each gap
    // between two of its tokens in the inter-token one.
    const model = `{model_name="${NAMES[0]}"}`;
    for (const name of ["e2e_request_latency", "request_queue_time", "request_prefill_time",
      "request_decode_time", "time_to_first_token", "inter_token_latency"]) {
      for (const field of ["count", "sum"]) {
        const native = sample(list, `torchtpu_${name}_seconds_${field}`);
        assert.deepEqual(sample(list, `vllm:${name}_seconds_${field}`),
          { name: `vllm:${name}_seconds_${field}`, labels: model, value: native.value });
      }
      assert.equal(sample(list, `torchtpu_${name}_seconds_count`).value,
        name === "inter_token_latency" ? maxTokens - 1 : 1, name);
    }
  });

  test("/health is readiness, /livez liveness; both answer without the key", async () => {
    for (const path of ["/health", "/livez"]) {
      const res = await fetch(`${server.url}${path}`);
      assert.equal(res.status, 200, path);
    }
    assert.deepEqual(await (await fetch(`${server.url}/livez`)).json(), { status: "alive" });
    assert.deepEqual(await (await fetch(`${server.url}/health`)).json(), { status: "ok" });
  });

  test("/v1/models lists every name, and each is a model of its own", async () => {
    const list = await (await fetch(`${server.url}/v1/models`, { headers: auth })).json();
    assert.deepEqual(list.data.map((m) => m.id), NAMES);
    for (const name of NAMES) {
      const res = await fetch(`${server.url}/v1/models/${name}`, { headers: auth });
      assert.equal(res.status, 200, name);
      assert.equal((await res.json()).id, name);
    }
    const other = await fetch(`${server.url}/v1/models/torchtpu-demo-random-weights`,
      { headers: auth });
    assert.equal(other.status, 404);
  });

  test("every generation route accepts every name and refuses others, naming them all",
    async () => {
      const routes = [
        ["/v1/chat/completions", { messages: [{ role: "user", content: "Hi." }], max_tokens: 2 }],
        ["/v1/completions", { prompt: "Hi.", max_tokens: 2 }],
        ["/v1/responses", { input: "Hi.", max_output_tokens: 2, store: false }],
        ["/v1/messages", { messages: [{ role: "user", content: "Hi." }], max_tokens: 2 }],
        ["/v1/messages/count_tokens", { messages: [{ role: "user", content: "Hi." }] }],
      ];
      for (const [path, body] of routes) {
        for (const model of NAMES) {
          const r = await post(server.url, path, { ...body, model });
          assert.equal(r.status, 200, `${path} with ${model}: ${JSON.stringify(r.body)}`);
        }
        const r = await post(server.url, path, { ...body, model: "gpt-4o" });
        assert.equal(r.status, 404, path);
        assert.equal(r.body.error.message, "the model 'gpt-4o' does not exist; this server " +
          `serves ${NAMES.map((n) => `'${n}'`).join(", ")}`, path);
      }
    });

  test("/slots shows each row busy or free; ?fail_on_no_slot is 503 while none is free",
    async () => {
      const slots = async (query = "") => {
        const res = await fetch(`${server.url}/slots${query}`, { headers: auth });
        return { status: res.status, body: await res.json() };
      };
      assert.equal((await fetch(`${server.url}/slots`)).status, 401);
      const idle = await slots("?fail_on_no_slot=1");
      assert.equal(idle.status, 200);
      assert.deepEqual(idle.body.map((s) => [s.id, s.n_ctx, s.is_processing, s.id_task,
        s.speculative]), [[0, 1024, false, -1, false], [1, 1024, false, -1, false]]);
      // Two long answers take both rows, one of them drafting (speculative).
      const maxTokens = 400;
      const answers = [0, 3].map((draft) => post(server.url, "/v1/completions",
        { prompt: "Write about rain.", max_tokens: maxTokens, ignore_eos: true,
          "speculative.n_max": draft }));
      let busy;
      await eventually(async () => {
        busy = await slots();
        return busy.body.every((s) => s.is_processing && s.next_token.n_decoded > 0);
      }, "both rows decoding", 60_000);
      for (const s of busy.body) {
        assert.equal(s.reading_prompt, false);
        assert.equal(s.n_prompt_tokens + s.next_token.n_decoded + s.next_token.n_remain,
          s.n_prompt_tokens + maxTokens, JSON.stringify(s));
        assert.equal(s.prompt, undefined, "a slot never shows its prompt");
      }
      assert.deepEqual(busy.body.map((s) => s.speculative).sort(), [false, true]);
      const full = await slots("?fail_on_no_slot=1");
      assert.equal(full.status, 503);
      assert.equal(full.body.error.message, "no slot available: all 2 rows are busy");
      for (const { status } of await Promise.all(answers)) assert.equal(status, 200);
      await eventually(async () => (await slots("?fail_on_no_slot=1")).status === 200,
        "the rows free again", 30_000);
    });
});

describe("--metrics-auth, --no-slots", () => {
  test("put /metrics behind the key again and /slots out of reach; the probes stay open",
    async () => {
      const server = await startServer(["--api-key", KEY, "--metrics-auth", "--no-slots",
        "--context", "512", "--threads", "1"]);
      try {
        assert.equal((await fetch(`${server.url}/metrics`)).status, 401);
        const res = await fetch(`${server.url}/metrics`, { headers: auth });
        assert.equal(res.status, 200);
        assert.equal(metric(await res.text(), "torchtpu_running_requests"), 0);
        // Without --metrics-compat, no vLLM names.
        assert.doesNotMatch(await (await fetch(`${server.url}/metrics`, { headers: auth })).text(),
          /vllm:/);
        assert.equal((await fetch(`${server.url}/health`)).status, 200);
        assert.equal((await fetch(`${server.url}/livez`)).status, 200);
        // llama-server's --no-slots: a 501, and /props says so.
        const slots = await fetch(`${server.url}/slots`, { headers: auth });
        assert.equal(slots.status, 501);
        assert.deepEqual((await slots.json()).error, { message: "/slots is off on this server " +
          "(--no-slots)", type: "not_supported_error", param: null, code: "slots_disabled" });
        const props = await (await fetch(`${server.url}/props`, { headers: auth })).json();
        assert.equal(props.endpoint_slots, false);
        assert.equal(props.endpoint_metrics, true);
      } finally {
        await server.stop();
      }
    });
});

describe("the drain", () => {
  test("a second signal ends the grace; /livez stays 200 while /health is 503", async () => {
    const server = await startServer(["--context", "512", "--threads", "1", "--drain-grace", "600"]);
    server.child.kill("SIGTERM");
    await eventually(async () => (await fetch(`${server.url}/health`)).status === 503,
      "readiness 503", 5000);
    assert.deepEqual(await (await fetch(`${server.url}/health`)).json(), { status: "draining" });
    assert.equal((await fetch(`${server.url}/livez`)).status, 200);
    // Still serving during the grace.
    const r = await post(server.url, "/v1/completions", { prompt: "Hi.", max_tokens: 2 },
      { "Content-Type": "application/json" });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const start = Date.now();
    server.child.kill("SIGTERM");
    const { code, signal } = await server.exited;
    assert.deepEqual({ code, signal }, { code: 0, signal: null });
    assert.ok(Date.now() - start < 30_000, "the second signal did not end the grace");
  });

  test("a stop waits for the replies being written and says so; another cancels them",
    async () => {
      const server = await startServer(["--context", "8192", "--threads", "1"]);
      try {
        await stopTwice(server);
      } finally {
        if (server.child.exitCode === null) server.child.kill("SIGKILL");
      }
    });
});

// A long stream and a long whole answer, then SIGINT twice: the line that says the server waits,
// the stream's cut and the whole answer's 503, which clients may retry elsewhere.
async function stopTwice(server) {
  const long = { prompt: "Hi.", max_tokens: 8000, ignore_eos: true };
  const res = await fetch(`${server.url}/v1/completions`, { method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...long, stream: true }) });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();
  // Read as it comes: a cut connection drops what was left unread.
  const streamed = (async () => {
    let text = "";
    try {
      for (let chunk; !(chunk = await reader.read()).done;) text += Buffer.from(chunk.value);
    } catch (error) {
      assert.equal(error.message, "terminated");
    }
    return text;
  })();
  const whole = post(server.url, "/v1/completions", long, { "Content-Type": "application/json" });
  await eventually(async () => {
    const engine = await (await fetch(`${server.url}/v1/engine`)).json();
    return engine.scheduler.running === 2;
  }, "both requests running", 10_000);
  server.child.kill("SIGINT");
  await eventually(async () => server.stderr().includes("stop again (Ctrl-C) to cancel"),
    "the stopping line", 10_000);
  assert.match(server.stderr(),
    /stopping: 2 request\(s\) still being answered; stop again \(Ctrl-C\) to cancel them/);
  server.child.kill("SIGINT");
  const cancelled = await whole;
  assert.equal(cancelled.status, 503, JSON.stringify(cancelled.body));
  assert.equal(cancelled.body.error.code, "shutting_down");
  assert.equal(cancelled.body.error.message,
    "the server is stopping: a second stop cancelled the requests still being answered");
  // The stream is cut off, as llama-server's second interrupt cuts its own.
  const text = await streamed;
  const { code, signal } = await server.exited;
  assert.deepEqual({ code, signal }, { code: 0, signal: null });
  assert.match(server.stderr(), /cancelling the requests still being answered/);
  // Cut short, not decoded to its 8000 tokens.
  const tokens = text.split("\n").filter((l) => l.startsWith("data: {")).length;
  assert.ok(tokens > 0 && tokens < 8000, `${tokens} chunks`);
}

describe("one sequence at a time (--read-every above 1)", () => {
  test("/v1/engine gives no batch options, since there is no batch", async () => {
    const server = await startServer(["--parallel", "1", "--read-every", "4", "--threads", "1"]);
    try {
      const { scheduler } = await (await fetch(`${server.url}/v1/engine`)).json();
      assert.equal(scheduler.mode, "one sequence at a time (read_every > 1)");
      assert.ok(!("step_tokens" in scheduler) && !("pass_rows" in scheduler),
        JSON.stringify(scheduler));
    } finally {
      await server.stop();
    }
  });

  test("a stop string ends the answer, its logprobs and its usage where it ends, mid-batch",
    async () => {
      const [batched, single] = await Promise.all([
        startServer(["--parallel", "1", "--read-every", "4", "--threads", "1"]),
        startServer(["--threads", "1"])]);
      try {
        const ask = (url, extra) => post(url, "/v1/completions", { prompt: "Once upon a time",
          max_tokens: 24, ignore_eos: true, logprobs: 1, ...extra },
        { "Content-Type": "application/json" });
        const full = (await ask(single.url, {})).body.choices[0].logprobs.tokens;
        // A stop string that the 6th token completes: batches of 4 after the first token end
        // after the 5th and the 9th. It must first appear where the 5th token begins.
        const stop = full[4] + full[5];
        assert.equal(full.join("").indexOf(stop), full.slice(0, 4).join("").length, stop);
        const [a, b] = await Promise.all([batched, single].map((s) => ask(s.url, { stop })));
        for (const r of [a, b]) assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(b.body.usage.completion_tokens, 6);
        assert.equal(a.body.usage.completion_tokens, 6);
        assert.equal(a.body.choices[0].text, full.slice(0, 4).join(""));
        assert.deepEqual(a.body.choices[0].logprobs.tokens, b.body.choices[0].logprobs.tokens);
        assert.equal(a.body.choices[0].finish_reason, "stop");
      } finally {
        await Promise.all([batched.stop(), single.stop()]);
      }
    });
});

describe("an idle replica sleeps (--sleep-idle-seconds)", () => {
  test("frees its weights once idle, still answers the probes, and wakes for a request, its " +
    "prefix cache kept (--sleep-preserve-cache)",
    async () => {
      const server = await startServer(["--sleep-idle-seconds", "1", "--sleep-preserve-cache",
        "--threads", "1"]);
      try {
        const rss = () => Number(readFileSync(`/proc/${server.child.pid}/status`, "utf8")
          .match(/VmRSS:\s+(\d+) kB/)[1]) * 1024;
        const gauge = async (name) => metric(await (await fetch(`${server.url}/metrics`)).text(), name);
        const ask = async (prompt = "Write about rain.") => (await post(server.url,
          "/v1/completions", { prompt, max_tokens: 8, ignore_eos: true },
          { "Content-Type": "application/json" })).body;
        const first = await ask();
        const awake = rss();
        await eventually(async () => (await gauge("torchtpu_engine_asleep")) === 1,
          "the engine asleep", 30_000);
        // The demo's weights (bf16, as stored) are what sleep gives back, most of them at least.
        const engine = await (await fetch(`${server.url}/v1/engine`)).json();
        const weights = statSync(`${engine.model_dir}/model.safetensors`).size;
        assert.ok(awake - rss() > weights / 2, `${awake} -> ${rss()} bytes, weights ${weights}`);
        assert.equal(engine.scheduler.asleep, true);
        assert.equal(engine.scheduler.sleep_idle_seconds, 1);
        assert.equal(engine.scheduler.sleep_preserve_cache, true);
        // Probes neither wake it nor report it unready.
        assert.equal((await fetch(`${server.url}/health`)).status, 200);
        assert.equal((await (await fetch(`${server.url}/props`)).json()).is_sleeping, true);
        assert.equal(await gauge("torchtpu_engine_asleep"), 1);
        // The prefix cache stays: a request that goes on from the first prompt wakes the engine
        // and reads only what is new (the first prompt's tokens come from the cache, with the BOS
        // before them).
        const held = await gauge("torchtpu_prefix_cache_bytes");
        assert.ok(held > 0, `the prefix cache holds ${held} bytes asleep`);
        const more = await ask("Write about rain. Then write about snow.");
        const prompt = (await (await fetch(`${server.url}/tokenize`, {
          method: "POST", body: JSON.stringify({ content: "Write about rain." }),
        })).json()).tokens;
        assert.equal(more.usage.prompt_tokens_details.cached_tokens, prompt.length + 1);
        // Awake again, the first request gets the answer it got before.
        const second = await ask();
        assert.equal(second.choices[0].text, first.choices[0].text);
        assert.equal(await gauge("torchtpu_engine_asleep"), 0);
        assert.equal(await gauge("torchtpu_engine_sleeps_total"), 1);
        const woken = await (await fetch(`${server.url}/v1/engine`)).json();
        assert.ok(woken.scheduler.last_wake_seconds > 0);
      } finally {
        await server.stop();
      }
    });
});

describe("vLLM's sleep mode routes", () => {
  test("/sleep frees the weights once idle, /wake_up loads them, /is_sleeping says which",
    async () => {
      const server = await startServer(["--threads", "1"]);
      try {
        const call = (method, path) => fetch(`${server.url}${path}`, { method });
        const sleeping = async () => (await (await call("GET", "/is_sleeping")).json()).is_sleeping;
        const ask = async () => (await post(server.url, "/v1/completions",
          { prompt: "Write about rain.", max_tokens: 8, ignore_eos: true },
          { "Content-Type": "application/json" })).body.choices[0].text;
        const first = await ask();
        assert.equal(await sleeping(), false);
        const slept = await call("POST", "/sleep?level=1");
        assert.equal(slept.status, 200);
        assert.equal(await slept.text(), "");
        await eventually(sleeping, "the engine asleep");
        const engine = await (await fetch(`${server.url}/v1/engine`)).json();
        assert.deepEqual([engine.scheduler.asleep, engine.scheduler.sleeps], [true, 1]);
        // Answered once the weights are back.
        assert.equal((await call("POST", "/wake_up?tags=weights&tags=kv_cache")).status, 200);
        assert.equal(await sleeping(), false);
        assert.equal(await ask(), first);
        // A request wakes a sleeping engine too.
        assert.equal((await call("POST", "/sleep?level=2")).status, 200);
        await eventually(sleeping, "the engine asleep again");
        assert.equal(await ask(), first);
        for (const [path, param, message] of [
          ["/sleep?level=3", "level", "'level' must be 1 or 2, got '3'"],
          ["/wake_up?tags=cuda_graphs", "tags", "'tags' must be \"weights\" or \"kv_cache\", got 'cuda_graphs'"],
        ]) {
          const res = await call("POST", path);
          assert.equal(res.status, 400, path);
          const { error } = await res.json();
          assert.deepEqual([error.param, error.message], [param, message]);
        }
        assert.equal((await call("GET", "/sleep")).status, 405);
      } finally {
        await server.stop();
      }
    });
});

describe("bad values of the new flags", () => {
  test("are refused at start with a message naming the flag", async () => {
    for (const [args, message] of [
      [["--drain-grace", "-1"], "error: --drain-grace must be between 0 and 3600 seconds, got -1"],
      [["--drain-grace", "7200"], "error: --drain-grace must be between 0 and 3600 seconds, got 7200"],
      [["--metrics-compat", "sglang"], "error: --metrics-compat must be none or vllm, got 'sglang'"],
      [["--served-model-name", ""], "error: --served-model-name must not be empty"],
      // 70000 would bind 70000 - 65536 = 4464.
      [["--port", "70000"], "error: --port must be between 0 (any free port) and 65535, got 70000"],
      [["--port", "-5"], "error: --port must be between 0 (any free port) and 65535, got -5"],
      // Both used to print the serving line first (the engine refused the context as it loaded).
      [["--context", "-5"], "error: --context must be at least 2, the warm-up's prompt, got -5"],
      // The warm-up's prompt (BOS and "Hello") did not fit, after the serving line.
      [["--context", "1"], "error: --context must be at least 2, the warm-up's prompt, got 1"],
      [["--max-body-bytes", "0"], "error: --max-body-bytes must be at least 1024, got 0: below " +
        "that even a short request's body is refused"],
      [["--parallel", "0"], "error: --parallel must be between 1 and 256, got 0"],
      [["--parallel", "257"], "error: --parallel must be between 1 and 256, got 257"],
      [["--cache-mb", "-1"], "error: --cache-mb must be between 0 and 2^30, got -1"],
      [["--step-tokens", "4"],
        "error: --step-tokens must exceed --parallel (4) and be at most 2^20, or be 0 for the " +
        "default, got 4"],
      [["--parallel", "2", "--step-tokens", "2000000"],
        "error: --step-tokens must exceed --parallel (2) and be at most 2^20, or be 0 for the " +
        "default, got 2000000"],
      [["--pass-rows", "-1"], "error: --pass-rows must be at least 0, got -1"],
      [["--max-queue", "-1"], "error: --max-queue must be at least 0, got -1"],
      [["--reasoning-budget", "-3"],
        "error: --reasoning-budget must be -1 (no limit) or at least 0, got -3"],
      [["--sleep-idle-seconds", "-2"],
        "error: --sleep-idle-seconds must be -1 (never) or between 0 and 1e6, got -2"],
      [["--reasoning-budget-message", "Enough.<channel|>"],
        "error: --reasoning-budget-message must not hold the thinking block's <channel|> marker"],
      [["--draft-max", "-1"], "error: draft_max must be at least 0, got -1"],
      [["--draft-max", "4", "--draft-ngram-max", "1"],
        "error: draft_ngram_min must be at least 1 and draft_ngram_max at least draft_ngram_min, " +
        "got 2 and 1"],
      // Without --draft-max too: a request's speculative.n_max would draft with them.
      [["--draft-ngram-min", "0"],
        "error: draft_ngram_min must be at least 1 and draft_ngram_max at least draft_ngram_min, " +
        "got 0 and 4"],
    ]) {
      const { code, stdout, stderr } = await refused(args);
      assert.equal(code, 2, `${args.join(" ")}: ${stderr}`);
      assert.equal(stderr.trim(), message, args.join(" "));
      // The budget message is read with the tokenizer, once the model loads behind the listener.
      if (!args.includes("--reasoning-budget-message")) assert.equal(stdout, "", args.join(" "));
    }
  });

  test("a checkpoint directory that is not there is named before the serving line", async () => {
    const missing = "/nonexistent/checkpoint";
    for (const flag of ["--model", "--emb4", "--draft-model"]) {
      const { code, stdout, stderr } = await refused([flag, missing]);
      assert.equal(code, 1, `${flag}: ${stderr}`);
      assert.equal(stderr.trim(), `error: checkpoint directory ${missing} does not exist`, flag);
      assert.equal(stdout, "", flag);
    }
  });
});
