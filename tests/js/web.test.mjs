// The chat page at / of `torchtpu-cpp serve` (demo checkpoint, greedy) in Debian's Chromium,
// driven by playwright-core: a streamed reply, the conversation carried into the next prompt
// (seen in the server's prompt token counter), Stop cancelling the decode (the server's cancel
// counter), the side panel's build, markup in a reply shown as text, and a question that got no
// reply (an error, or Stop before any text) marked unsent, back in the composer and sent again
// once. Then images and audio (#19): the attach controls follow /v1/models' modalities (none for
// the text-only demo), the server's 400 for media shows as the reply's error, and on a tiny
// checkpoint with both encoders (make_multimodal.py) a canvas-drawn PNG, a recording from
// Chromium's fake microphone and a WAV file go to the server as OpenAI content parts, show in the
// conversation and are answered, and wrong files are refused in the page. Last, LoRA adapters: the panel's picker lists a server's
// adapters (loaded at start and while the page is open), and a reply under one is the server's
// answer with that adapter named as the model.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { chromium } from "playwright-core";
import {
  eventually, makeLoraAdapters, makeMultimodalCheckpoint, metric, metrics, wav, startServer,
  tempDir,
} from "./server_helpers.mjs";

const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = process.env.TORCHTPU_TEST_ARTIFACTS ?? path.join(os.tmpdir(), "torchtpu-test-artifacts");
const MODEL = "torchtpu-demo-random-weights";

let server;
let context;
let page;
let userDataDir;

before(async () => {
  server = await startServer(["--context", "4096"]);
  userDataDir = tempDir("torchtpu-chromium-");
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run",
      // A microphone that plays a beep, allowed without asking.
      "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    ],
  });
  page = context.pages()[0] ?? (await context.newPage());
  await page.goto(server.url + "/");
});

after(async () => {
  if (context) await context.close();
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

// One server-sent event of a streamed chat reply, for replies served to the page's own fetch.
const chunk = (delta, finish = null) => `data: ${JSON.stringify({
  object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }],
})}\n\n`;

const lastQuestion = () => page.locator(".message.user").last();

// The messages of the chat request that `act` makes the page send.
async function sentMessages(act) {
  const request = page.waitForRequest("**/v1/chat/completions");
  await act();
  return JSON.parse((await request).postData()).messages;
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

test("Enter that ends an input method's composition does not send", async () => {
  await page.click("#clear");
  await page.fill("#input", "日本");
  const press = (init) => page.dispatchEvent("#input", "keydown", { key: "Enter", ...init });
  // The submit handler empties the input at once: a send would show here.
  await press({ isComposing: true });
  await press({ keyCode: 229 });  // Safari's way to say the same
  assert.equal(await page.inputValue("#input"), "日本");
  assert.equal(await page.locator(".message").count(), 0);
  await page.fill("#max-tokens", "4");
  await press({});
  assert.equal(await page.inputValue("#input"), "");
  await waitForState("done");
});

test("a streamed reply is followed while the log shows its end, and not once the reader scrolls up",
  async () => {
    await page.click("#clear");
    const scroll = () => page.evaluate(() => {
      const log = document.getElementById("log");
      return { top: log.scrollTop, bottom: log.scrollHeight - log.clientHeight };
    });
    await send("Write a very long story.", 3000);
    // Followed: the log grows past its height and stays at its end.
    await page.waitForFunction(() => {
      const log = document.getElementById("log");
      return log.scrollHeight > 2 * log.clientHeight;
    }, null, { timeout: 120_000 });
    const followed = await scroll();
    assert.ok(followed.bottom - followed.top < 32, JSON.stringify(followed));
    // Scrolled up while it streams: left where the reader is.
    await page.evaluate(() => { document.getElementById("log").scrollTop = 0; });
    const grown = (await scroll()).bottom;
    await page.waitForFunction((b) => {
      const log = document.getElementById("log");
      return log.scrollHeight - log.clientHeight > b + 200;
    }, grown, { timeout: 120_000 });
    assert.equal(await lastReply().getAttribute("data-state"), "streaming");
    assert.equal((await scroll()).top, 0);
    await page.click("#stop");
    await waitForState("stopped");
    // A new message is shown: the log goes to its end.
    await send("And another.", 4);
    await waitForState("done");
    const sent = await scroll();
    assert.ok(sent.bottom - sent.top < 32, JSON.stringify(sent));
  });

test("a conversation past the context says so and points to New chat", async () => {
  await page.click("#clear");
  await send("word ".repeat(4200), 4);
  await waitForState("error");
  assert.match(await lastReply().locator(".meta").textContent(),
    /error: .*context.* — the conversation no longer fits the model's context: New chat starts an empty one/);
});

test("a question that got no reply is marked unsent and comes back to the input, to be sent once",
  async () => {
    await page.click("#clear");
    const q1 = "Tell me about the sea.";
    await send(q1, 4);
    await waitForState("done");
    const a1 = await lastReply().locator(".content").textContent();

    // The server's 400 before any reply text: the question is shown as outside the conversation,
    // and the composer holds it again.
    const long = "word ".repeat(4200).trim();
    await send(long, 4);
    await waitForState("error");
    assert.match(await lastReply().locator(".meta").textContent(), /^error: .*context/);
    assert.equal(await lastQuestion().getAttribute("data-state"), "unsent");
    assert.equal(await lastQuestion().locator(".meta").isVisible(), true);
    assert.equal(await lastQuestion().locator(".meta").textContent(),
      "not answered, so not in the conversation; it is back in the message box");
    assert.equal(await page.inputValue("#input"), long);

    // Edited and sent: the history is the first exchange and the new question.
    const q2 = "word word word";
    await page.fill("#input", q2);
    const second = await sentMessages(() => page.click("#send"));
    assert.deepEqual(second, [
      { role: "user", content: q1 }, { role: "assistant", content: a1 },
      { role: "user", content: q2 },
    ]);
    await waitForState("done");
    const a2 = await lastReply().locator(".content").textContent();

    // A network error, then Send again as it stands: the question goes once.
    const q3 = "And the sky?";
    await page.route("**/v1/chat/completions", (route) => route.abort("connectionrefused"),
      { times: 1 });
    await send(q3, 4);
    await waitForState("error");
    assert.equal(await lastQuestion().getAttribute("data-state"), "unsent");
    assert.equal(await page.inputValue("#input"), q3);
    // The log, at its end when the request went out, still shows its end: the error and the note.
    const rest = await page.evaluate(() => {
      const log = document.getElementById("log");
      return log.scrollHeight - log.scrollTop - log.clientHeight;
    });
    assert.ok(rest < 32, `${rest} px below the view`);
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, "chat_page_unsent.png") });
    const third = await sentMessages(() => page.click("#send"));
    assert.deepEqual(third,
      [...second, { role: "assistant", content: a2 }, { role: "user", content: q3 }]);
    assert.equal(await page.inputValue("#input"), "");
    await waitForState("done");
    const a3 = await lastReply().locator(".content").textContent();

    // And the next exchange alternates on from there.
    const fourth = await sentMessages(() => send("And the stars?", 4));
    assert.deepEqual(fourth, [
      ...third, { role: "assistant", content: a3 }, { role: "user", content: "And the stars?" },
    ]);
    await waitForState("done");
    const questions = await page.$$eval(".message.user", (list) =>
      list.map((el) => [el.querySelector(".content").textContent, el.dataset.state ?? null]));
    assert.deepEqual(questions, [
      [q1, null], [long, "unsent"], [q2, null], [q3, "unsent"], [q3, null],
      ["And the stars?", null],
    ]);
  });

test("a question stopped before any reply text comes back too; text typed meanwhile stays",
  async () => {
    // The page's requests get no answer until the test lets them fail.
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    await page.route("**/v1/chat/completions", async (route) => {
      await held;
      await route.abort("connectionrefused").catch(() => {});  // the page may have aborted it
    });
    try {
      await page.click("#clear");
      await send("Wait for it.", 4);
      await page.click("#stop");
      await waitForState("stopped");
      assert.equal(await lastQuestion().getAttribute("data-state"), "unsent");
      assert.equal(await page.inputValue("#input"), "Wait for it.");

      await send("Another one.", 4);
      await page.fill("#input", "Something new.");
      release();
      await waitForState("error");
      assert.equal(await lastQuestion().getAttribute("data-state"), "unsent");
      assert.equal(await lastQuestion().locator(".meta").textContent(),
        "not answered, so not in the conversation");
      assert.equal(await page.inputValue("#input"), "Something new.");
    } finally {
      release();
      await page.unroute("**/v1/chat/completions");
    }
    // Neither question is in the history.
    const sent = await sentMessages(() => page.click("#send"));
    assert.deepEqual(sent, [{ role: "user", content: "Something new." }]);
    await waitForState("done");
  });

test("a reply that ends with thinking and no text keeps its question in the conversation",
  async () => {
    await page.click("#clear");
    await page.route("**/v1/chat/completions", (route) =>
      route.fulfill({
        status: 200,
        contentType: "text/event-stream",
        body: chunk({ role: "assistant", content: "" }) + chunk({ reasoning_content: "Hmm." }) +
          chunk({}, "length") + "data: [DONE]\n\n",
      }), { times: 1 });
    await send("Think hard.", 4);
    await waitForState("done");
    assert.equal(await lastQuestion().getAttribute("data-state"), null);
    assert.equal(await page.inputValue("#input"), "");
    const sent = await sentMessages(() => send("And say it.", 4));
    assert.deepEqual(sent, [
      { role: "user", content: "Think hard." }, { role: "assistant", content: "" },
      { role: "user", content: "And say it." },
    ]);
    await waitForState("done");
  });

// A PNG drawn on a canvas in `p`: {url (data:), bytes}.
async function canvasPng(p, width, height) {
  const url = await p.evaluate(([w, h]) => {
    const canvas = document.createElement("canvas");
    canvas.width = w;
    canvas.height = h;
    const g = canvas.getContext("2d");
    g.fillStyle = "#1565c0";
    g.fillRect(0, 0, w, h);
    g.fillStyle = "#ffca28";
    g.fillRect(w / 4, h / 4, w / 2, h / 2);
    return canvas.toDataURL("image/png");
  }, [width, height]);
  return { url, bytes: Buffer.from(url.slice(url.indexOf(",") + 1), "base64") };
}

// Which of the attach controls `p` shows, once it has read the model's modalities.
async function controls(p, modalities) {
  await p.waitForSelector(`body[data-modalities="${modalities}"]`, { state: "attached" });
  const shown = [];
  for (const id of ["attach-image", "attach-audio", "record"]) {
    if (await p.locator(`#${id}`).isVisible()) shown.push(id);
  }
  return shown;
}

test("on the text-only demo checkpoint the page offers no attachments", async () => {
  assert.deepEqual(await controls(page, "text"), []);
  assert.equal(await page.locator("#media-tools").isVisible(), false);
  assert.equal(await page.locator("#attachments").isVisible(), false);
});

test("a model with one tower gets its controls only, and the server's 400 shows as an error", async () => {
  // /v1/models as a server with one tower would answer it. The demo server itself reads neither,
  // so the image the page then sends gets the server's 400, as from one started with --no-vision.
  const claim = (modalities) => page.route("**/v1/models", async (route) => {
    // A request the page stops waiting for while the route fetches (a reload; the engine panel's
    // own reload after an error) is handled already by the time it would be fulfilled.
    try {
      const models = await (await route.fetch()).json();
      models.data[0].modalities = modalities;
      await route.fulfill({ json: models });
    } catch (error) {
      if (!/already handled|closed|aborted/i.test(error.message)) throw error;
    }
  });
  try {
    await claim(["text", "audio"]);
    await page.reload();
    assert.deepEqual(await controls(page, "text audio"), ["attach-audio", "record"]);
    await page.unroute("**/v1/models");
    await claim(["text", "image"]);
    await page.reload();
    assert.deepEqual(await controls(page, "text image"), ["attach-image"]);
    const png = await canvasPng(page, 8, 8);
    await page.setInputFiles("#image-file", { name: "dot.png", mimeType: "image/png", buffer: png.bytes });
    await page.locator("#attachments .chip").waitFor();
    await send("What is this?", 4);
    await waitForState("error");
    assert.equal(
      await lastReply().locator(".meta").textContent(),
      "error: 'messages[0].content[0].image_url.url' is an image, and this checkpoint has no vision " +
        "encoder (its config.json has no vision_config)",
    );
    assert.equal(await lastReply().evaluate((el) => el.classList.contains("error")), true);
  } finally {
    await page.unroute("**/v1/models");
  }
  await page.reload();
  assert.deepEqual(await controls(page, "text"), []);
});

describe("images and audio on a checkpoint with vision and audio encoders", () => {
  const MM_MODEL = "tiny-multimodal";
  let dir;
  let mm;
  let mmPage;
  const violations = [];  // Content-Security-Policy reports from the console

  before(async () => {
    // The demo checkpoint the first server wrote lends its text model, tokenizer and template.
    dir = makeMultimodalCheckpoint();
    mm = await startServer(["--model", dir, "--model-id", MM_MODEL, "--context", "4096"]);
    await context.grantPermissions(["microphone"], { origin: mm.url });
    mmPage = await context.newPage();
    mmPage.on("console", (m) => {
      if (/Content Security Policy/i.test(m.text())) violations.push(m.text().slice(0, 200));
    });
    await mmPage.goto(mm.url + "/");
  });

  after(async () => {
    await mmPage?.close();
    await mm?.stop();
  });

  const reply = () => mmPage.locator(".message.assistant").last();
  const userTurn = () => mmPage.locator(".message.user").last();

  // A new chat, and nothing left attached by an earlier test.
  async function fresh() {
    await mmPage.click("#clear");
    const remove = mmPage.locator("#attachments .remove");
    while (await remove.count()) await remove.first().click();
  }

  // Sends what the composer holds with `text`; resolves to the request body the page sent.
  async function sendMedia(text, maxTokens = 8) {
    await mmPage.fill("#max-tokens", String(maxTokens));
    await mmPage.fill("#input", text);
    const request = mmPage.waitForRequest("**/v1/chat/completions");
    await mmPage.click("#send");
    return JSON.parse((await request).postData());
  }

  // Waits for the last reply to end, as `state`.
  async function replyEnds(state = "done") {
    const ended = await mmPage.waitForFunction(() => {
      const replies = document.querySelectorAll(".message.assistant");
      const last = replies[replies.length - 1];
      return last && last.dataset.state !== "streaming" && last.dataset.state;
    }, null, { timeout: 120_000 });
    assert.equal(await ended.jsonValue(), state, await reply().textContent());
  }

  async function answerDirectly(messages, maxTokens) {
    const res = await fetch(`${mm.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        model: MM_MODEL, messages, max_tokens: maxTokens, temperature: 0,
        chat_template_kwargs: { enable_thinking: false },
      }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    return (await res.json()).choices[0].message.content;
  }

  // The fields of a 16-bit PCM WAV file's header and its length.
  function readWav(bytes) {
    assert.equal(bytes.toString("latin1", 0, 4), "RIFF");
    assert.equal(bytes.readUInt32LE(4), bytes.length - 8);
    assert.equal(bytes.toString("latin1", 8, 16), "WAVEfmt ");
    const fmt = {
      format: bytes.readUInt16LE(20), channels: bytes.readUInt16LE(22),
      rate: bytes.readUInt32LE(24), byteRate: bytes.readUInt32LE(28),
      blockAlign: bytes.readUInt16LE(32), bits: bytes.readUInt16LE(34),
    };
    assert.equal(bytes.toString("latin1", 36, 40), "data");
    const size = bytes.readUInt32LE(40);
    assert.equal(size, bytes.length - 44);
    let peak = 0;
    for (let i = 44; i + 1 < bytes.length; i += 2) peak = Math.max(peak, Math.abs(bytes.readInt16LE(i)));
    return { ...fmt, seconds: size / fmt.byteRate, peak };
  }

  test("the page offers an image picker, a WAV picker and recording", async () => {
    assert.deepEqual(await controls(mmPage, "text image audio"), ["attach-image", "attach-audio", "record"]);
    for (const id of ["attach-image", "attach-audio", "record"]) {
      assert.equal(await mmPage.locator(`#${id}`).isEnabled(), true, id);
    }
    assert.equal(await mmPage.getAttribute("#image-file", "accept"), "image/png,image/jpeg,image/webp");
  });

  test("an attached PNG goes as an image_url part before the text, shows, and is answered", async () => {
    const png = await canvasPng(mmPage, 48, 32);
    await mmPage.setInputFiles("#image-file", { name: "squares.png", mimeType: "image/png", buffer: png.bytes });
    const chip = mmPage.locator("#attachments .chip.image");
    await chip.waitFor();
    assert.match(await chip.textContent(), /squares\.png/);
    assert.equal(await chip.locator("img").getAttribute("src"), png.url);

    const question = "What is in this picture?";
    const sent = await sendMedia(question);
    assert.deepEqual(sent.messages, [
      { role: "user", content: [{ type: "image_url", image_url: { url: png.url } }, { type: "text", text: question }] },
    ]);
    assert.equal(await mmPage.locator("#attachments").isVisible(), false);
    // The user turn shows the image (loaded: the policy allows data: images), then the text.
    const img = userTurn().locator(".media img");
    assert.equal(await img.getAttribute("src"), png.url);
    await mmPage.waitForFunction(() => document.querySelector(".message.user .media img")?.naturalWidth === 48);
    assert.equal(await userTurn().locator(".content").textContent(), question);
    await replyEnds();
    const answer = await reply().locator(".content").textContent();
    assert.match(await reply().locator(".meta").textContent(), /finish length · \d+ prompt \+ 8 completion tokens/);
    // Greedy: the server answers the request the page sent with the same text.
    assert.equal(answer, await answerDirectly(sent.messages, 8));

    // The next turn carries the image in the conversation, as content parts.
    const next = await sendMedia("And the colours?", 4);
    await replyEnds();
    assert.deepEqual(next.messages.map((m) => m.role), ["user", "assistant", "user"]);
    assert.deepEqual(next.messages[0], sent.messages[0]);
    assert.equal(next.messages[1].content, answer);
    assert.equal(next.messages[2].content, "And the colours?");
  });

  test("a recording becomes a 16 kHz WAV input_audio part after the image, plays, and is answered", async () => {
    await fresh();
    const started = Date.now();
    await mmPage.click("#record");
    await mmPage.waitForFunction(() => /Stop recording \(0:01\)/.test(document.getElementById("record").textContent));
    await mmPage.waitForTimeout(300);
    await mmPage.click("#record");
    const recorded = (Date.now() - started) / 1000;
    const clip = mmPage.locator("#attachments .chip.audio");
    await clip.waitFor();
    assert.match(await clip.textContent(), /recording 1 \(0:01\)/);
    assert.equal(await mmPage.textContent("#record"), "Record");
    // Attached after the clip, and still sent before it.
    const png = await canvasPng(mmPage, 16, 16);
    await mmPage.setInputFiles("#image-file", { name: "small.png", mimeType: "image/png", buffer: png.bytes });
    await mmPage.locator("#attachments .chip").nth(1).waitFor();

    const sent = await sendMedia("What do you hear?");
    const content = sent.messages[0].content;
    assert.deepEqual(content.map((p) => p.type), ["image_url", "input_audio", "text"]);
    assert.equal(content[0].image_url.url, png.url);
    assert.equal(content[1].input_audio.format, "wav");
    const wav = readWav(Buffer.from(content[1].input_audio.data, "base64"));
    assert.deepEqual(
      [wav.format, wav.channels, wav.rate, wav.byteRate, wav.blockAlign, wav.bits],
      [1, 1, 16000, 32000, 2, 16],
    );
    // At least the second the button counted and at most the time between the clicks: a WAV
    // whose header and samples disagree on the rate would be longer or shorter.
    assert.ok(wav.seconds >= 1 && wav.seconds <= recorded + 0.2, `${wav.seconds} s of WAV, ${recorded} s between the clicks`);
    assert.ok(wav.peak > 1000, `the fake microphone's beep peaks at ${wav.peak}`);

    // The user turn plays the clip: its <audio> loaded the data: URL (media-src allows it).
    const audio = userTurn().locator(".media audio");
    assert.equal(await audio.getAttribute("src"), `data:audio/wav;base64,${content[1].input_audio.data}`);
    assert.equal(await audio.evaluate((el) => el.controls), true);
    await mmPage.waitForFunction(() => document.querySelector(".message.user .media audio")?.readyState >= 1);
    const duration = await audio.evaluate((el) => el.duration);
    assert.ok(Math.abs(duration - wav.seconds) < 0.05, `<audio> lasts ${duration} s, the WAV ${wav.seconds} s`);
    assert.equal(await userTurn().locator(".media img").count(), 1);
    await replyEnds();
    assert.equal(await reply().locator(".content").textContent(), await answerDirectly(sent.messages, 8));
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await mmPage.screenshot({ path: path.join(ARTIFACTS, "chat_page_media.png"), fullPage: true });
  });

  test("a WAV file is sent as it is, with no text if none is typed", async () => {
    await fresh();
    const data = wav(24000);
    await mmPage.setInputFiles("#audio-file", { name: "quiet.wav", mimeType: "audio/wav", buffer: Buffer.from(data, "base64") });
    const clip = mmPage.locator("#attachments .chip.audio");
    await clip.waitFor();
    assert.match(await clip.textContent(), /quiet\.wav \(0:01\)/);
    const sent = await sendMedia("", 4);
    assert.deepEqual(sent.messages, [
      { role: "user", content: [{ type: "input_audio", input_audio: { data, format: "wav" } }] },
    ]);
    assert.equal(await userTurn().locator(".media audio").count(), 1);
    await replyEnds();
  });

  test("an MP3 file is sent as format mp3 and answered", async () => {
    await fresh();
    // One second of a tone, encoded by libsndfile (soundfile, in the project's Python).
    const mp3 = execFileSync(process.env.TORCHTPU_PYTHON ?? "python3", ["-c", [
      "import io, sys, numpy as np, soundfile as sf",
      "t = np.arange(16000) / 16000",
      "out = io.BytesIO()",
      "sf.write(out, 0.2 * np.sin(2 * np.pi * 440 * t), 16000, format='MP3')",
      "sys.stdout.buffer.write(out.getvalue())",
    ].join("\n")]);
    await mmPage.setInputFiles("#audio-file", { name: "tone.mp3", mimeType: "audio/mpeg", buffer: mp3 });
    const clip = mmPage.locator("#attachments .chip.audio");
    await clip.waitFor();
    assert.match(await clip.textContent(), /tone\.mp3 \(0:01\)/);
    const sent = await sendMedia("", 4);
    assert.deepEqual(sent.messages, [
      { role: "user", content: [{ type: "input_audio", input_audio: { data: mp3.toString("base64"), format: "mp3" } }] },
    ]);
    assert.equal(await userTurn().locator(".media audio").count(), 1);
    await replyEnds();
  });

  test("wrong files are refused in the page with a message, and a chip can be removed", async () => {
    await fresh();
    const refused = async (selector, file, message) => {
      await mmPage.setInputFiles(selector, file);
      await eventually(async () => (await mmPage.textContent("#attach-error")) !== "", "a message");
      assert.equal(await mmPage.locator("#attach-error").isVisible(), true);
      assert.match(await mmPage.textContent("#attach-error"), message);
      assert.equal(await mmPage.locator("#attachments .chip").count(), 0);
    };
    await refused("#image-file", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("not an image") },
      /^"notes\.txt" is not a PNG, JPEG or WebP image \(it is text\/plain\)$/);
    await refused("#image-file", { name: "anim.gif", mimeType: "image/gif", buffer: Buffer.from("GIF89a\x01\x00\x01\x00") },
      /^"anim\.gif" is not a PNG, JPEG or WebP image \(it is image\/gif\)$/);
    const png = await canvasPng(mmPage, 8, 8);
    const big = Buffer.concat([png.bytes, Buffer.alloc(5 << 20)]);
    await refused("#image-file", { name: "big.png", mimeType: "image/png", buffer: big },
      /^"big\.png" is 5\.0 MiB, more than the 4\.0 MiB the page sends$/);
    await refused("#audio-file", { name: "song.mp3", mimeType: "audio/mpeg", buffer: Buffer.from("ID3\x03\x00\x00\x00") },
      /^"song\.mp3" is not a readable MP3 file$/);
    await refused("#audio-file", { name: "song.ogg", mimeType: "audio/ogg", buffer: Buffer.from("OggS\x00\x02\x00\x00") },
      /^"song\.ogg" is not a WAV or MP3 file; the server reads those$/);
    await refused("#audio-file", { name: "long.wav", mimeType: "audio/wav", buffer: Buffer.from(wav(16000 * 31), "base64") },
      /^"long\.wav" is 31\.0 s long, more than the 30 s the server reads$/);

    // A good file clears the message; its chip's × takes it off again, and the message goes as text.
    await mmPage.setInputFiles("#image-file", { name: "ok.png", mimeType: "image/png", buffer: png.bytes });
    await mmPage.locator("#attachments .chip").waitFor();
    assert.equal(await mmPage.locator("#attach-error").isVisible(), false);
    await mmPage.click("#attachments .chip .remove");
    assert.equal(await mmPage.locator("#attachments").isVisible(), false);
    const sent = await sendMedia("Just text.", 2);
    assert.equal(sent.messages[0].content, "Just text.");
    await replyEnds();
  });

  test("the server's 400 for an unreadable image shows as the reply's error", async () => {
    await fresh();
    const png = await canvasPng(mmPage, 8, 8);
    // A PNG signature the page accepts, and a body the server's decoder cannot read.
    const broken = png.bytes.subarray(0, 30);
    await mmPage.setInputFiles("#image-file", { name: "broken.png", mimeType: "image/png", buffer: broken });
    await mmPage.locator("#attachments .chip").waitFor();
    await sendMedia("What is this?");
    await replyEnds("error");
    assert.match(
      await reply().locator(".meta").textContent(),
      /^error: 'messages\[0\]\.content\[0\]\.image_url\.url' is not a readable image: /,
    );
    assert.equal(await reply().evaluate((el) => el.classList.contains("error")), true);
    // The question comes back to the composer with its image, to be changed and sent again.
    assert.equal(await userTurn().getAttribute("data-state"), "unsent");
    assert.equal(await mmPage.inputValue("#input"), "What is this?");
    assert.equal(await mmPage.locator("#attachments .chip.image img").getAttribute("src"),
      `data:image/png;base64,${broken.toString("base64")}`);
    // Nothing the page showed broke its Content-Security-Policy.
    assert.deepEqual(violations, []);
  });
});

describe("the LoRA adapter picker", () => {
  let lora;
  let loraPage;
  let adapters;

  before(async () => {
    adapters = makeLoraAdapters();  // for the demo checkpoint the first server wrote
    lora = await startServer(["--context", "1024", "--lora", `first=${adapters.first}`,
      "--lora-init-without-apply", "--runtime-lora"]);
    loraPage = await context.newPage();
    await loraPage.goto(lora.url + "/");
  });

  after(async () => {
    await loraPage?.close();
    await lora?.stop();
  });

  const options = () => loraPage.$$eval("#adapter option", (list) => list.map((o) => o.value));
  const post = (route, body) => fetch(`${lora.url}${route}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });

  async function answerDirectly(model, messages) {
    const res = await post("/v1/chat/completions", {
      model, messages, max_tokens: 8, temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(res.status, 200, await res.clone().text());
    return (await res.json()).choices[0].message.content;
  }

  test("the picker lists the adapters, and a reply under one names it as the model", async () => {
    await loraPage.locator("#adapter-setting").waitFor({ state: "visible" });
    assert.deepEqual(await options(), ["", "first"]);
    assert.equal(await page.locator("#adapter-setting").isVisible(), false, "the demo has none");
    await loraPage.selectOption("#adapter", "first");
    await loraPage.fill("#max-tokens", "8");
    await loraPage.fill("#input", "Tell me about rivers.");
    const request = loraPage.waitForRequest("**/v1/chat/completions");
    await loraPage.click("#send");
    const sent = JSON.parse((await request).postData());
    assert.equal(sent.model, "first");
    const reply = loraPage.locator(".message.assistant").last();
    await loraPage.waitForFunction(
      () => document.querySelector(".message.assistant:last-child")?.dataset.state === "done",
      null, { timeout: 120_000 });
    const answer = await reply.locator(".content").textContent();
    assert.equal(answer, await answerDirectly("first", sent.messages));
    assert.notEqual(answer, await answerDirectly(MODEL, sent.messages), "the adapter's reply");
  });

  test("adapters loaded and unloaded while the page is open show when the picker is opened",
    async () => {
      const reopen = async () => {
        await loraPage.focus("#input");
        await loraPage.focus("#adapter");
      };
      assert.equal((await post("/v1/load_lora_adapter",
        { lora_name: "two", lora_path: adapters.second })).status, 200);
      await reopen();
      await eventually(async () => (await options()).includes("two"), "two in the picker");
      assert.deepEqual(await options(), ["", "first", "two"]);
      assert.equal(await loraPage.inputValue("#adapter"), "first", "the choice stays");
      assert.equal((await post("/v1/unload_lora_adapter", { lora_name: "first" })).status, 200);
      await reopen();
      await eventually(async () => !(await options()).includes("first"), "first gone");
      assert.deepEqual(await options(), ["", "two"]);
      assert.equal(await loraPage.inputValue("#adapter"), "", "back to the base model");
    });
});
