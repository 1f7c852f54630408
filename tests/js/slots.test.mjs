// llama-server's slot save, restore and erase (POST /slots/{id}?action=..., --slot-save-path):
// a conversation's prefix state written by one server and read by the next one (a restart, a
// replica taking the conversation over) lets it read only the new tokens, with the answer it
// gives reading them all; erase forgets it; every wrong request gets a precise error and the
// server goes on serving. Numerics of the states themselves are engine_prefix_cache's SlotState.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { statSync, writeFileSync } from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { cliPath, startServer, tempDir } from "./server_helpers.mjs";

const json = { "Content-Type": "application/json" };

async function post(url, route, body) {
  const res = await fetch(`${url}${route}`, { method: "POST", headers: json,
    body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

// Token ids inside any vocabulary the demo model has: a prompt and its continuation.
const first = Array.from({ length: 60 }, (_, i) => 100 + ((i * 37) % 500));
const second = [...first, ...Array.from({ length: 12 }, (_, i) => 700 + i * 3)];

async function complete(url, prompt, maxTokens, extra = {}) {
  const res = await post(url, "/v1/completions",
    { prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, ...extra });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return { text: res.body.choices[0].text,
    cached: res.body.usage.prompt_tokens_details.cached_tokens };
}

describe("slot save, restore and erase", () => {
  const dir = tempDir("torchtpu-slots-");
  const args = () => ["--context", "1024", "--parallel", "2", "--threads", "1",
    "--slot-save-path", path.join(dir, "slots")];

  test("a state saved by one server and restored by the next gives the next turn its tokens " +
    "from the cache and the same answer; erase forgets it", async () => {
    let expected;
    const a = await startServer(args());  // makes the folder
    try {
      // One token: none is fed back, so the row's state is exactly the prompt. id_slot puts it
      // in slot 1 (slot 0 is the first free one); the other slot's sequence leaves its own.
      await complete(a.url, first, 1, { id_slot: 1 });
      await complete(a.url, second, 2);
      const saved = await post(a.url, "/slots/1?action=save", { filename: "conv.bin" });
      assert.equal(saved.status, 200, JSON.stringify(saved.body));
      const file = path.join(dir, "slots", "conv.bin");
      assert.deepEqual({ ...saved.body, timings: undefined }, { id_slot: 1,
        filename: "conv.bin", n_saved: first.length, n_written: statSync(file).size,
        timings: undefined });
      assert.ok(saved.body.timings.save_ms >= 0);
      // Sent again, `second` starts from the state its first pass saved at its prompt's end.
      expected = await complete(a.url, second, 8);
      assert.equal(expected.cached, second.length - 1);
    } finally {
      await a.stop();
    }

    const b = await startServer(args());
    try {
      const restored = await post(b.url, "/slots/1?action=restore", { filename: "conv.bin" });
      assert.equal(restored.status, 200, JSON.stringify(restored.body));
      assert.equal(restored.body.id_slot, 1);
      assert.equal(restored.body.n_restored, first.length);
      assert.equal(restored.body.n_read, statSync(path.join(dir, "slots", "conv.bin")).size);
      assert.ok(restored.body.timings.restore_ms >= 0);
      const metrics = await (await fetch(`${b.url}/v1/engine`)).json();
      assert.equal(metrics.prefix_cache.states, 1, JSON.stringify(metrics.prefix_cache));
      // A fresh server: only the file can have given it these tokens.
      assert.deepEqual(await complete(b.url, second, 8), { ...expected, cached: first.length });

      const erased = await post(b.url, "/slots/1?action=erase");
      assert.deepEqual(erased, { status: 200, body: { id_slot: 1, n_erased: first.length } });
      // Only the erased state shares its start with this prompt.
      assert.equal((await complete(b.url, [...first, 900, 901], 2)).cached, 0);
      const again = await post(b.url, "/slots/1?action=save", { filename: "gone.bin" });
      assert.equal(again.status, 400);
      assert.match(again.body.error.message, /^slot 1 has no state to save/);
    } finally {
      await b.stop();
    }
  });

  test("wrong requests get precise errors that name no server path, and serving goes on",
    async () => {
      const server = await startServer(args());
      try {
        writeFileSync(path.join(dir, "slots", "junk.bin"), "not a safetensors file at all");
        for (const [route, body, status, message, param] of [
          ["/slots/0?action=load", { filename: "x.bin" }, 400,
            "action must be save, restore or erase, got \"load\"", "action"],
          ["/slots/0", { filename: "x.bin" }, 400,
            "action must be save, restore or erase, got \"\"", "action"],
          ["/slots/x?action=save", { filename: "x.bin" }, 400,
            "the slot id must be a whole number from 0, got \"x\"", null],
          ["/slots/-1?action=erase", undefined, 400,
            "the slot id must be a whole number from 0, got \"-1\"", null],
          ["/slots/2?action=erase", undefined, 400,
            "slot 2 does not exist: the slots are 0 to 1", null],
          ["/slots/0?action=save", {}, 400,
            "the body must be an object with a string \"filename\"", "filename"],
          ["/slots/0?action=save", { filename: 7 }, 400,
            "the body must be an object with a string \"filename\"", "filename"],
          ["/slots/0?action=save", { filename: "../escape.bin" }, 400,
            "invalid slot filename \"../escape.bin\": it starts with a dot", "filename"],
          ["/slots/0?action=save", { filename: "a/b.bin" }, 400,
            "invalid slot filename \"a/b.bin\": it holds '/'", "filename"],
          ["/slots/0?action=save", { filename: "" }, 400,
            "invalid slot filename \"\": it is empty", "filename"],
          ["/slots/0?action=save", { filename: "tab\there" }, 400,
            "invalid slot filename \"tab\there\": it holds a control character", "filename"],
          ["/slots/0?action=restore", { filename: "missing.bin" }, 404,
            "no slot file \"missing.bin\" in this server's slot save path", "filename"],
          ["/slots/0?action=save", { filename: "x.bin" }, 400,
            "slot 0 has no state to save: no sequence has finished in it, and none was " +
            "restored into it, since the prefix cache was made", null],
        ]) {
          const res = await post(server.url, route, body);
          assert.equal(res.status, status, `${route} ${JSON.stringify(body)}`);
          assert.equal(res.body.error.message, message);
          assert.equal(res.body.error.param, param);
        }
        const junk = await post(server.url, "/slots/0?action=restore", { filename: "junk.bin" });
        assert.equal(junk.status, 400);
        assert.match(junk.body.error.message, /^junk\.bin: /);
        assert.ok(!junk.body.error.message.includes(dir), junk.body.error.message);
        // llama-server's id_slot on a generation request.
        for (const [extra, message, param] of [
          [{ id_slot: 2 }, "'id_slot' 2 does not exist: the slots are 0 to 1 (--parallel)",
            "id_slot"],
          [{ id_slot: -2 }, "'id_slot' must be -1 (any free slot) or a slot's id, got -2",
            "id_slot"],
          [{ id_slot: 0, n: 2 }, "'id_slot' runs one sequence in one slot: 'n' must be 1 with " +
            "it, got 2", "n"],
        ]) {
          const res = await post(server.url, "/v1/completions",
            { prompt: first, max_tokens: 1, ...extra });
          assert.equal(res.status, 400, JSON.stringify(extra));
          assert.equal(res.body.error.message, message);
          assert.equal(res.body.error.param, param);
        }
        assert.equal((await fetch(`${server.url}/health`)).status, 200);
        assert.equal((await complete(server.url, first, 2)).cached, 0);
      } finally {
        await server.stop();
      }
    });

  test("are 501 without --slot-save-path or a prefix cache", async () => {
    for (const [extra, message, code] of [
      [[], "slot save, restore and erase are off on this server: start it with " +
        "--slot-save-path DIR", "slot_save_disabled"],
      [["--slot-save-path", path.join(dir, "slots"), "--cache-mb", "0"], "slots keep no state " +
        "on this server: its prefix cache is off (--cache-mb 0, or --read-every above 1)",
      "prefix_cache_disabled"],
    ]) {
      const server = await startServer(["--context", "512", "--threads", "1", ...extra]);
      try {
        const res = await post(server.url, "/slots/0?action=erase");
        assert.equal(res.status, 501);
        assert.deepEqual(res.body.error, { message, type: "not_supported_error", param: null,
          code });
      } finally {
        await server.stop();
      }
    }
  });

  test("a --slot-save-path the server cannot make is refused at start", async () => {
    const file = path.join(dir, "a-file");
    writeFileSync(file, "");
    const child = spawn(cliPath(), ["serve", "--port", "0", "--slot-save-path",
      path.join(file, "slots")], { stdio: "pipe" });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const code = await new Promise((resolve) => child.on("exit", resolve));
    assert.equal(code, 2, stderr);
    assert.match(stderr.trim(), new RegExp(`^error: --slot-save-path ${file}/slots is not a ` +
      "folder this server can make: Not a directory$"));
  });
});
