// The chat page at / of `torchtpu-cpp serve` (demo checkpoint, greedy) in Debian's Chromium,
// driven by playwright-core: a streamed reply, the conversation carried into the next prompt
// (seen in the server's prompt token counter), Stop cancelling the decode (the server's cancel
// counter), the side panel's build, and markup in a reply shown as text.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";
import { chromium } from "playwright-core";
import { eventually, metric, metrics, startServer } from "./server_helpers.mjs";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = process.env.TORCHTPU_TEST_ARTIFACTS ?? path.join(os.tmpdir(), "torchtpu-test-artifacts");
const MODEL = "torchtpu-demo-random-weights";

let server;
let context;
let page;
let userDataDir;

before(async () => {
  server = await startServer(["--context", "4096"]);
  userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "torchtpu-chromium-"));
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run",
    ],
  });
  page = context.pages()[0] ?? (await context.newPage());
  await page.goto(server.url + "/");
});

after(async () => {
  if (context) await context.close();
  if (userDataDir) fs.rmSync(userDataDir, { recursive: true, force: true });
  if (server) await server.stop();
});

const lastReply = () => page.locator(".message.assistant").last();

// Sends `text` through the composer and records the reply's text length at every change.
async function send(text, maxTokens) {
  await page.fill("#max-tokens", String(maxTokens));
  await page.evaluate(() => {
    window.__lengths = [];
    const observer = new MutationObserver(() => {
      const replies = document.querySelectorAll(".message.assistant .content");
      const last = replies[replies.length - 1];
      if (last) window.__lengths.push(last.textContent.length);
    });
    observer.observe(document.getElementById("log"), {
      childList: true, subtree: true, characterData: true,
    });
  });
  const before = await page.locator(".message.assistant").count();
  await page.fill("#input", text);
  await page.click("#send");
  await page.locator(".message.assistant").nth(before).waitFor();
}

async function waitForState(state) {
  await page.waitForFunction(
    (s) => {
      const replies = document.querySelectorAll(".message.assistant");
      return replies[replies.length - 1]?.dataset.state === s;
    },
    state,
    { timeout: 120_000 },
  );
}

async function promptTokens() {
  return metric(await metrics(server.url), "torchtpu_prompt_tokens_total");
}

async function directAnswer(messages, maxTokens) {
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({
      model: MODEL, messages, max_tokens: maxTokens, temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
    }),
  });
  assert.equal(res.status, 200);
  return (await res.json()).choices[0].message.content;
}

let firstReply;
let firstPromptTokens;

test("a reply streams in piece by piece and ends as the server's own answer", async () => {
  const question = "Tell me about the sea.";
  const tokensBefore = await promptTokens();
  await send(question, 40);
  await waitForState("done");
  firstPromptTokens = (await promptTokens()) - tokensBefore;
  firstReply = await lastReply().locator(".content").textContent();
  const lengths = await page.evaluate(() => window.__lengths);
  const distinct = [...new Set(lengths)];
  assert.ok(distinct.length >= 3, `the reply grew in ${distinct.length} steps: ${lengths}`);
  for (let i = 1; i < distinct.length; i++) assert.ok(distinct[i] > distinct[i - 1], `${distinct}`);
  // Greedy decoding: the same request answered whole gives the same text.
  assert.equal(firstReply, await directAnswer([{ role: "user", content: question }], 40));
  assert.match(await lastReply().locator(".meta").textContent(), /finish length · \d+ prompt \+ 40 completion tokens/);
});

test("the second turn's prompt carries the first turn", async () => {
  const tokensBefore = await promptTokens();
  const request = page.waitForRequest("**/v1/chat/completions");
  await send("Tell me about the sea.", 8);
  const sent = JSON.parse((await request).postData());
  await waitForState("done");
  const secondPromptTokens = (await promptTokens()) - tokensBefore;
  assert.deepEqual(sent.messages.map((m) => m.role), ["user", "assistant", "user"]);
  assert.equal(sent.messages[1].content, firstReply);
  // The same question again: the prompt grew by at least the first reply's tokens.
  const tokenized = await fetch(`${server.url}/tokenize`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ content: firstReply, add_special: false }),
  });
  const replyTokens = (await tokenized.json()).tokens.length;
  assert.ok(replyTokens > 0);
  assert.ok(
    secondPromptTokens >= firstPromptTokens + replyTokens,
    `second prompt ${secondPromptTokens} tokens, first ${firstPromptTokens}, reply ${replyTokens}`,
  );
});

test("Stop cancels the decode on the server", async () => {
  const cancelled = metric(await metrics(server.url), "torchtpu_requests_cancelled_total");
  await page.click("#clear");
  await send("Write a very long story.", 3000);
  await page.waitForFunction(() => {
    const c = document.querySelectorAll(".message.assistant .content");
    return c[c.length - 1]?.textContent.length > 0;
  });
  await page.click("#stop");
  await waitForState("stopped");
  await eventually(
    async () => metric(await metrics(server.url), "torchtpu_requests_cancelled_total") === cancelled + 1,
    "the cancel counter to move by one",
  );
  assert.equal(await page.locator("#send").isEnabled(), true);
});

test("the side panel shows the model, the build and the decode rate", async () => {
  const engine = await (await fetch(`${server.url}/v1/engine`)).json();
  await eventually(async () => (await page.textContent("#info-build")).includes(engine.build.git_revision), "the build");
  assert.match(await page.textContent("#info-model"), new RegExp(MODEL));
  assert.equal(await page.textContent("#info-torch"), engine.torch_version);
  assert.equal(await page.textContent("#info-device"), engine.device);
  assert.equal(await page.textContent("#info-dtype"), engine.dtype);
  assert.match(await page.textContent("#info-layout"), new RegExp(`context ${engine.layout.context}`));
  await eventually(async () => /tok\/s/.test(await page.textContent("#info-rate")), "a decode rate");
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, "chat_page.png"), fullPage: true });
});

test("markup in a reply is shown as text, never run", async () => {
  // The demo's random weights cannot be made to say this, so the reply is served to the page's
  // own fetch as the server would stream it.
  const evil = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>';
  const chunk = (delta, finish = null) =>
    `data: ${JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  await page.route("**/v1/chat/completions", (route) =>
    route.fulfill({
      status: 200,
      contentType: "text/event-stream",
      body: chunk({ role: "assistant", content: "" }) + chunk({ content: evil.slice(0, 20) }) +
        chunk({ content: evil.slice(20) }) + chunk({}, "stop") + "data: [DONE]\n\n",
    }),
  );
  try {
    await page.click("#clear");
    await send("Say something with markup.", 16);
    await waitForState("done");
  } finally {
    await page.unroute("**/v1/chat/completions");
  }
  const content = lastReply().locator(".content");
  assert.equal(await content.textContent(), evil);
  assert.equal(await content.evaluate((el) => el.childElementCount), 0);
  assert.equal(await page.evaluate(() => document.querySelectorAll("#log script, #log img, #log b").length), 0);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  await page.screenshot({ path: path.join(ARTIFACTS, "chat_page_markup.png") });
});

test("the JSON output switch asks for a JSON object, and the reply is one", async () => {
  await page.click("#clear");
  await page.check("#json-output");
  try {
    const request = page.waitForRequest("**/v1/chat/completions");
    await send("Describe the sea as JSON.", 24);
    const sent = JSON.parse((await request).postData());
    await waitForState("done");
    assert.deepEqual(sent.response_format, { type: "json_object" });
    // Random weights never close the first key in 24 tokens, but the grammar decides how it opens.
    assert.match(await lastReply().locator(".content").textContent(), /^\{"/);
  } finally {
    await page.uncheck("#json-output");
  }
  const request = page.waitForRequest("**/v1/chat/completions");
  await send("Again, as text.", 4);
  assert.equal(JSON.parse((await request).postData()).response_format, undefined);
  await waitForState("done");
});
