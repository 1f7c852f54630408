// Issue #19: images and audio in requests, through the official `openai` SDK (chat/completions and
// the Responses API) and fetch (Anthropic's Messages shape). The demo checkpoint is text-only, so
// every valid image or clip gets the 400 naming what the checkpoint lacks, and every malformed one
// the 400 naming its field; /v1/models says which modalities the checkpoint reads. A second server
// reads a tiny checkpoint with both towers that transformers' save_pretrained writes
// (make_multimodal.py), where corrupt files are 400s and valid ones are answered (Ollama's images,
// through the official `ollama` client, as chat's image parts are). The PNG and the
// WAV are server_helpers.mjs's. Speech to text (/v1/audio/transcriptions and translations, through
// the SDK's audio API) answers as the chat route answers the clip after vLLM's instruction.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import { after, before, describe, test } from "node:test";
import { Ollama } from "ollama";
import OpenAI, { toFile } from "openai";
import { PNG, makeMultimodalCheckpoint, startServer, wav, wavBuffer } from "./server_helpers.mjs";

const MODEL = "torchtpu-demo-random-weights";
const PNG_URL = `data:image/png;base64,${PNG}`;

let server;
let client;

before(async () => {
  server = await startServer(["--max-media", "2"]);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: "unused", maxRetries: 0 });
});

after(async () => {
  await server?.stop();
});

// The SDK's APIError for a chat request whose user message holds `parts` after a text part.
async function chatError(...parts) {
  return chatErrorFrom(client, MODEL, ...parts);
}

async function chatErrorFrom(client, model, ...parts) {
  const err = await client.chat.completions
    .create({
      model,
      messages: [{ role: "user", content: [{ type: "text", text: "What is this?" }, ...parts] }],
    })
    .then(
      () => assert.fail("expected an error"),
      (e) => e,
    );
  assert.ok(err instanceof OpenAI.APIError, String(err));
  return err;
}

describe("media", () => {
  test("/v1/models lists the checkpoint's modalities", async () => {
    const models = await client.models.list();
    assert.deepEqual(models.data[0].modalities, ["text"]);
    const engine = await (await fetch(`${server.url}/v1/engine`)).json();
    assert.deepEqual(engine.modalities, ["text"]);
  });

  test("an image sent to a checkpoint without a vision encoder is a 400 naming the part", async () => {
    const err = await chatError({ type: "image_url", image_url: { url: PNG_URL, detail: "low" } });
    assert.equal(err.status, 400);
    assert.equal(err.param, "messages[0].content[1].image_url.url");
    assert.equal(err.code, "unsupported_modality");
    assert.equal(
      err.message,
      "400 'messages[0].content[1].image_url.url' is an image, and this checkpoint has no vision " +
        "encoder (its config.json has no vision_config)",
    );
  });

  test("a WAV clip sent to a checkpoint without an audio encoder is a 400", async () => {
    const err = await chatError({ type: "input_audio", input_audio: { data: wav(), format: "wav" } });
    assert.equal(err.status, 400);
    assert.equal(err.param, "messages[0].content[1].input_audio.data");
    assert.match(err.message, /is audio, and this checkpoint has no audio encoder/);
  });

  test("malformed parts are 400s naming the field", async () => {
    const cases = [
      [
        { type: "image_url", image_url: { url: "data:image/png;base64,iVBO!!==" } },
        "messages[0].content[1].image_url.url",
        "'messages[0].content[1].image_url.url' is not valid base64",
      ],
      [
        { type: "image_url", image_url: { url: "data:;base64,AAAA" } },
        "messages[0].content[1].image_url.url",
        "'messages[0].content[1].image_url.url' is a data: URL without a media type " +
          "(data:image/png;base64,...)",
      ],
      [
        { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
        "messages[0].content[1].image_url.url",
        "'messages[0].content[1].image_url.url' is an http(s) URL, which this server does not " +
          "fetch; send the image as a data: URL, or start the server with --allow-media-urls",
      ],
      [
        { type: "image_url", image_url: { url: "data:image/gif;base64,AAAA" } },
        "messages[0].content[1].image_url.url",
        "'messages[0].content[1].image_url.url' names the media type \"image/gif\"; this server " +
          "reads image/png, image/jpeg or image/webp",
      ],
      [
        { type: "input_audio", input_audio: { data: wav(), format: "flac" } },
        "messages[0].content[1].input_audio.format",
        "'messages[0].content[1].input_audio.format' is \"flac\": this server reads \"wav\" and \"mp3\" audio",
      ],
      [
        { type: "image_url", image_url: { url: PNG_URL, detail: "medium" } },
        "messages[0].content[1].image_url.detail",
        "'messages[0].content[1].image_url.detail' must be \"auto\", \"low\" or \"high\", got \"medium\"",
      ],
    ];
    for (const [part, param, message] of cases) {
      const err = await chatError(part);
      assert.equal(err.status, 400, message);
      assert.equal(err.param, param);
      assert.equal(err.message, `400 ${message}`);
    }
  });

  test("more items than --max-media is a 400", async () => {
    const image = { type: "image_url", image_url: { url: PNG_URL } };
    const err = await chatError(image, image, image);
    assert.equal(err.status, 400);
    assert.equal(err.param, "messages[0].content[3].image_url.url");
    assert.equal(
      err.message,
      "400 the request holds 3 images and audio clips, more than this server's --max-media 2",
    );
  });

  test("the Responses API's input_image is named by its own field", async () => {
    const err = await client.responses
      .create({
        model: MODEL,
        input: [
          {
            role: "user",
            content: [
              { type: "input_text", text: "What is this?" },
              { type: "input_image", image_url: PNG_URL, detail: "auto" },
            ],
          },
        ],
      })
      .then(
        () => assert.fail("expected an error"),
        (e) => e,
      );
    assert.equal(err.status, 400);
    assert.equal(err.param, "input[0].content[1].image_url");
    assert.match(err.message, /'input\[0\]\.content\[1\]\.image_url' is an image, and this checkpoint has no vision encoder/);
  });

  test("Anthropic image blocks are named by their source", async () => {
    const res = await fetch(`${server.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        max_tokens: 8,
        messages: [
          {
            role: "user",
            content: [
              { type: "image", source: { type: "base64", media_type: "image/png", data: PNG } },
              { type: "text", text: "What is this?" },
            ],
          },
        ],
      }),
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.type, "error");
    assert.equal(body.error.type, "invalid_request_error");
    assert.equal(
      body.error.message,
      "'messages.0.content.0.source.data' is an image, and this checkpoint has no vision encoder " +
        "(its config.json has no vision_config)",
    );
  });

  test("speech to text on a checkpoint without an audio encoder is a 400 naming the file", async () => {
    const err = await client.audio.transcriptions
      .create({ model: MODEL, file: await toFile(Buffer.from(wav(), "base64"), "clip.wav") })
      .then(() => assert.fail("expected an error"), (e) => e);
    assert.equal(err.status, 400);
    assert.equal(err.param, "file");
    assert.match(err.message, /'file' is audio, and this checkpoint has no audio encoder/);
  });

  test("/v1/completions takes a prompt string, not content parts", async () => {
    const err = await client.completions
      .create({ model: MODEL, prompt: [{ type: "image_url", image_url: { url: PNG_URL } }] })
      .then(
        () => assert.fail("expected an error"),
        (e) => e,
      );
    assert.equal(err.status, 400);
  });
});

describe("media on a checkpoint with vision and audio encoders", () => {
  let dir;
  let mm;
  let mmClient;
  let images;  // a local HTTP server for --allow-media-urls
  let imagesUrl;
  const asked = [];  // the paths it was asked for
  const hanging = [];  // responses it never answers

  before(async () => {
    // The demo checkpoint the first server wrote lends its text model, tokenizer and template.
    dir = makeMultimodalCheckpoint();
    images = http.createServer((req, res) => {
      asked.push(req.url);
      const port = images.address().port;
      if (req.url === "/to-file.png") {
        res.writeHead(302, { location: "file:///etc/hostname" }).end();
      } else if (req.url === "/to-gopher.png") {
        // What a gopher request would send to this server: a GET it would log.
        res.writeHead(302, {
          location: `gopher://127.0.0.1:${port}/_GET%20/gopher-was-here%20HTTP/1.0%0d%0a%0d%0a`,
        }).end();
      } else if (req.url === "/hang.png") {
        hanging.push(res);  // accepted, never answered
      } else if (req.url === "/dot.png") {
        res.writeHead(200, { "content-type": "image/png" }).end(Buffer.from(PNG, "base64"));
      } else if (req.url === "/page.html") {
        res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end("<p>hi</p>");
      } else if (req.url === "/huge.png") {
        res.writeHead(200, { "content-type": "image/png" }).end(Buffer.alloc(9 << 20));
      } else {
        res.writeHead(404).end();
      }
    });
    await new Promise((resolve) => images.listen(0, "127.0.0.1", resolve));
    imagesUrl = `http://127.0.0.1:${images.address().port}`;
    mm = await startServer(["--model", dir, "--model-id", "tiny-multimodal", "--allow-media-urls",
      "--media-url-timeout", "3"]);
    mmClient = new OpenAI({ baseURL: mm.baseURL, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    await mm?.stop();
    for (const res of hanging) res.destroy();
    images?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  test("/v1/models lists text, image and audio", async () => {
    const models = await mmClient.models.list();
    assert.deepEqual(models.data[0].modalities, ["text", "image", "audio"]);
  });

  test("a corrupt PNG or WAV is a 400 before anything is queued", async () => {
    const png = await chatErrorFrom(mmClient, "tiny-multimodal", {
      type: "image_url",
      image_url: { url: `data:image/png;base64,${PNG.slice(0, 40)}` },
    });
    assert.equal(png.status, 400);
    assert.equal(png.code, "invalid_image");
    assert.equal(png.param, "messages[0].content[1].image_url.url");
    assert.match(png.message, /^400 'messages\[0\]\.content\[1\]\.image_url\.url' is not a readable image: /);
    const clip = await chatErrorFrom(mmClient, "tiny-multimodal", {
      type: "input_audio",
      input_audio: { data: Buffer.from("RIFF....WAVEjunk").toString("base64"), format: "wav" },
    });
    assert.equal(clip.status, 400);
    assert.equal(clip.code, "invalid_audio");
    assert.match(clip.message, /^400 'messages\[0\]\.content\[1\]\.input_audio\.data' is not a readable WAV or MP3 file: /);
  });

  test("a float WAV with a NaN or infinite sample is a 400 naming the sample, on chat and speech to text", async () => {
    // 1 s of IEEE float32 mono at 16 kHz, silent but for `bad` at sample 4321.
    const floatWav = (bad) => {
      const b = wavBuffer(16000, { float: true });
      b.writeFloatLE(bad, 44 + 4321 * 4);
      return b;
    };
    for (const [bad, shown] of [[NaN, "NaN"], [Infinity, "+Inf"]]) {
      const clip = await chatErrorFrom(mmClient, "tiny-multimodal", {
        type: "input_audio",
        input_audio: { data: floatWav(bad).toString("base64"), format: "wav" },
      });
      assert.equal(clip.status, 400);
      assert.equal(clip.code, "invalid_audio");
      assert.equal(clip.param, "messages[0].content[1].input_audio.data");
      assert.equal(clip.message, "400 'messages[0].content[1].input_audio.data' is not a readable " +
        `WAV or MP3 file: WAV sample 4321 is not finite (${shown})`);
      const body = new FormData();
      body.append("model", "tiny-multimodal");
      body.append("file", new Blob([floatWav(bad)]), "clip.wav");
      const res = await fetch(`${mm.url}/v1/audio/transcriptions`, { method: "POST", body });
      assert.equal(res.status, 400);
      const { error } = await res.json();
      assert.equal(error.code, "invalid_audio");
      assert.equal(error.param, "file");
      assert.equal(error.message,
        `'file' is not a readable WAV or MP3 file: WAV sample 4321 is not finite (${shown})`);
    }
    // Loud but finite samples are read and answered.
    const loud = await mmClient.chat.completions.create({
      model: "tiny-multimodal",
      max_tokens: 2,
      messages: [{ role: "user", content: [{ type: "input_audio",
        input_audio: { data: floatWav(1e30).toString("base64"), format: "wav" } }] }],
    });
    assert.equal(loud.usage.completion_tokens, 2);
  });

  test("a valid PNG and WAV are answered; the same pair again is read from the prefix cache", async () => {
    const ask = (...parts) =>
      mmClient.chat.completions.create({
        model: "tiny-multimodal",
        max_tokens: 8,
        messages: [{ role: "user", content: [{ type: "text", text: "What is this?" }, ...parts] }],
      });
    const textOnly = await ask();
    const media = [
      { type: "image_url", image_url: { url: PNG_URL } },
      { type: "input_audio", input_audio: { data: wav(), format: "wav" } },
    ];
    const first = await ask(...media);
    assert.equal(first.choices[0].finish_reason, "length");
    assert.equal(first.usage.completion_tokens, 8);
    // Each item's one placeholder became its begin token, one or more soft tokens and its end.
    assert.ok(first.usage.prompt_tokens >= textOnly.usage.prompt_tokens + 2 * 2,
      `${first.usage.prompt_tokens} prompt tokens with media, ${textOnly.usage.prompt_tokens} without`);
    const again = await ask(...media);
    assert.equal(again.choices[0].message.content, first.choices[0].message.content);
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > textOnly.usage.prompt_tokens,
      `${again.usage.prompt_tokens_details.cached_tokens} cached`);
  });

  // The clip as a file, and the chat route's answer to it after `instruction` (greedy, 8 tokens).
  const clip = () => toFile(Buffer.from(wav(), "base64"), "clip.wav", { type: "audio/wav" });
  async function chatAnswer(instruction) {
    const r = await mmClient.chat.completions.create({
      model: "tiny-multimodal", max_tokens: 8, temperature: 0,
      chat_template_kwargs: { enable_thinking: false },
      messages: [{ role: "user", content: [{ type: "text", text: instruction },
        { type: "input_audio", input_audio: { data: wav(), format: "wav" } }] }],
    });
    return { text: r.choices[0].message.content, usage: r.usage };
  }

  test("speech to text answers as chat does with vLLM's instruction, whole, as text or streamed",
    async () => {
      const model = "tiny-multimodal";
      const french = await chatAnswer("Transcribe this audio into French:");
      const got = await mmClient.audio.transcriptions.create(
        { model, file: await clip(), language: "fr", temperature: 0, max_tokens: 8 });
      assert.equal(got.text, french.text);
      assert.deepEqual(got.usage, { type: "tokens", input_tokens: french.usage.prompt_tokens,
        output_tokens: 8, total_tokens: french.usage.prompt_tokens + 8 });
      const plain = await chatAnswer("Transcribe this audio:");
      assert.notEqual(plain.text, french.text, "the language reaches the instruction");
      const text = await mmClient.audio.transcriptions.create(
        { model, file: await clip(), response_format: "text", max_tokens: 8 });
      assert.equal(text, plain.text);
      const english = await chatAnswer("Translate this audio into English:");
      const translated = await mmClient.audio.translations.create(
        { model, file: await clip(), max_tokens: 8 });
      assert.equal(translated.text, english.text);
      const events = [];
      const stream = await mmClient.audio.transcriptions.create(
        { model, file: await clip(), stream: true, max_tokens: 8 });
      for await (const event of stream) events.push(event);
      const deltas = events.filter((e) => e.type === "transcript.text.delta");
      assert.ok(deltas.length >= 1);
      assert.deepEqual(events.at(-1), { type: "transcript.text.done", text: plain.text,
        usage: { type: "tokens", input_tokens: plain.usage.prompt_tokens, output_tokens: 8,
          total_tokens: plain.usage.prompt_tokens + 8 } });
      assert.equal(deltas.map((e) => e.delta).join(""), plain.text);
    });

  test("a clip longer than 30 s is transcribed in pieces, one text, whole or streamed", async () => {
    const long = () => toFile(Buffer.from(wav(16000 * 62), "base64"), "long.wav");
    const model = "tiny-multimodal";
    const whole = await mmClient.audio.transcriptions.create(
      { model, file: await long(), max_tokens: 8 });
    // Each piece (at most 30 s: 3 or more of them) answers with its 8 tokens.
    const pieces = whole.usage.output_tokens / 8;
    assert.ok(Number.isInteger(pieces) && pieces >= 3, JSON.stringify(whole.usage));
    const one = await chatAnswer("Transcribe this audio:");
    assert.ok(whole.usage.input_tokens > pieces * (one.usage.prompt_tokens - 4),
      "each piece's clip is in its prompt");
    const events = [];
    for await (const event of await mmClient.audio.transcriptions.create(
      { model, file: await long(), max_tokens: 8, stream: true })) {
      events.push(event);
    }
    assert.equal(events.at(-1).type, "transcript.text.done");
    assert.deepEqual(events.at(-1).usage, whole.usage);
    assert.equal(events.at(-1).text, whole.text);
    assert.equal(events.slice(0, -1).map((e) => e.delta).join(""), whole.text);
  });

  test("malformed speech to text requests are 400s naming the form field", async () => {
    const form = async (fields, file = Buffer.from(wav(), "base64")) => {
      const body = new FormData();
      if (file) body.append("file", new Blob([file]), "clip.wav");
      for (const [k, v] of Object.entries(fields)) body.append(k, v);
      const res = await fetch(`${mm.url}/v1/audio/transcriptions`, { method: "POST", body });
      return { status: res.status, error: (await res.json()).error };
    };
    const cases = [
      [{}, null, "file", "'file' is required"],
      [{}, Buffer.from(PNG, "base64"), "file", "'file' (clip.wav) is neither a WAV nor an MP3"],
      [{}, Buffer.from("RIFF....WAVEjunk"), "file", "'file' is not a readable WAV or MP3 file"],
      [{ response_format: "srt" }, undefined, "response_format", "needs segment timestamps"],
      [{ response_format: "xml" }, undefined, "response_format", "must be \"json\" or \"text\""],
      [{ language: "xx" }, undefined, "language", "must be an ISO-639-1 code this server names"],
      [{ "timestamp_granularities[]": "word" }, undefined, "timestamp_granularities[]",
        "needs segment or word timestamps"],
      [{ temperature: "warm" }, undefined, "temperature", "'temperature' must be a number"],
      [{ temperature: "3" }, undefined, "temperature", "temperature"],
      [{ stream: "yes" }, undefined, "stream", "'stream' must be true or false"],
      [{ model: "whisper-1" }, undefined, "model", "the model 'whisper-1' does not exist"],
    ];
    for (const [fields, file, param, words] of cases) {
      const r = await form({ model: "tiny-multimodal", ...fields }, file);
      assert.equal(r.status, fields.model === "whisper-1" ? 404 : 400, JSON.stringify(fields));
      assert.equal(r.error.param, param, JSON.stringify(r.error));
      assert.ok(r.error.message.includes(words), r.error.message);
    }
    const json = await fetch(`${mm.url}/v1/audio/transcriptions`, { method: "POST",
      headers: { "content-type": "application/json" }, body: JSON.stringify({ file: "x" }) });
    assert.equal(json.status, 400);
    assert.match((await json.json()).error.message, /must be multipart\/form-data/);
    assert.equal((await chatAnswer("Transcribe this audio:")).usage.completion_tokens, 8);
  });

  test("an image with more patches than the tower's position tables is a 400, and the server goes on", async () => {
    // detail "high" asks for 1,120 soft tokens: 66 x 66 patches on this square image, beyond the
    // tiny tower's position_embedding_size of 64.
    const err = await chatErrorFrom(mmClient, "tiny-multimodal", {
      type: "image_url",
      image_url: { url: PNG_URL, detail: "high" },
    });
    assert.equal(err.status, 400);
    assert.match(err.message, /^400 media item 0: image patch positions must lie in \[0, position_embedding_size = 64\)/);
    const ok = await mmClient.chat.completions.create({
      model: "tiny-multimodal",
      max_tokens: 2,
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: PNG_URL, detail: "low" } }] }],
    });
    assert.equal(ok.usage.completion_tokens, 2);
  });

  test("Ollama's images (the official client): the prompt and answer of chat's image part",
    async () => {
      const ollama = new Ollama({ host: mm.url });
      const show = await ollama.show({ model: "tiny-multimodal" });
      assert.deepEqual(show.capabilities, ["completion", "tools", "thinking", "vision", "audio"]);
      const options = { temperature: 0, num_predict: 8 };
      const theirs = await ollama.chat({
        model: "tiny-multimodal", stream: false, options,
        messages: [{ role: "user", content: "What is this?", images: [Buffer.from(PNG, "base64")] }],
      });
      // Ollama's templates put a message's images before its text.
      const ours = await mmClient.chat.completions.create({
        model: "tiny-multimodal", max_tokens: 8, temperature: 0,
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: PNG_URL } },
          { type: "text", text: "What is this?" }] }],
      });
      assert.equal(theirs.prompt_eval_count, ours.usage.prompt_tokens);
      assert.equal(theirs.message.content, ours.choices[0].message.content);
      const generated = await ollama.generate({
        model: "tiny-multimodal", prompt: "What is this?", images: [PNG], stream: false, options,
      });
      assert.equal(generated.response, theirs.message.content);
      const corrupt = await ollama
        .chat({ model: "tiny-multimodal", stream: false,
          messages: [{ role: "user", content: "What is this?", images: [PNG.slice(0, 40)] }] })
        .then(() => assert.fail("expected an error"), (e) => e);
      assert.equal(corrupt.status_code, 400);
      assert.match(corrupt.error, /^'messages\[0\]\.images\[0\]' is not a readable image: /);
    });

  test("Anthropic's count_tokens counts an image as the soft tokens the model reads", async () => {
    const post = async (route, content) => {
      const res = await fetch(`${mm.url}/v1/messages${route}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "tiny-multimodal",
          max_tokens: 4,
          messages: [{ role: "user", content }],
        }),
      });
      const body = await res.json();
      assert.equal(res.status, 200, JSON.stringify(body));
      return body;
    };
    const text = { type: "text", text: "What is this?" };
    const image = { type: "image", source: { type: "base64", media_type: "image/png", data: PNG } };
    const plain = await post("/count_tokens", [text]);
    const counted = await post("/count_tokens", [image, text]);
    const answered = await post("", [image, text]);
    // Anthropic counts the prompt's cache reads apart from its input tokens.
    assert.equal(counted.input_tokens,
      answered.usage.input_tokens + answered.usage.cache_read_input_tokens);
    // The placeholder became its begin token, one or more soft tokens and its end token.
    assert.ok(counted.input_tokens >= plain.input_tokens + 2,
      `${counted.input_tokens} tokens with the image, ${plain.input_tokens} without`);
    const corrupt = await fetch(`${mm.url}/v1/messages/count_tokens`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "tiny-multimodal",
        messages: [{ role: "user", content: [{ ...image, source: { ...image.source, data: PNG.slice(0, 40) } }] }],
      }),
    });
    assert.equal(corrupt.status, 400);
    assert.match((await corrupt.json()).error.message, /^'messages\.0\.content\.0\.source\.data' is not a readable image: /);
  });

  test("image URLs (--allow-media-urls) are fetched within the limits, or refused naming the field", async () => {
    const url = (name) => ({ type: "image_url", image_url: { url: `${imagesUrl}/${name}` } });
    const ok = await mmClient.chat.completions.create({
      model: "tiny-multimodal",
      max_tokens: 2,
      messages: [{ role: "user", content: [{ type: "text", text: "What is this?" }, url("dot.png")] }],
    });
    assert.equal(ok.usage.completion_tokens, 2);
    const prefix = "400 'messages[0].content[1].image_url.url' could not be fetched: ";
    const cases = [
      ["missing.png", "the server answered HTTP 404"],
      ["page.html", 'the server answered with the Content-Type "text/html", not image/png, image/jpeg or image/webp'],
      ["huge.png", "the image is larger than --max-image-bytes 8388608"],
    ];
    for (const [name, why] of cases) {
      const err = await chatErrorFrom(mmClient, "tiny-multimodal", url(name));
      assert.equal(err.status, 400, name);
      assert.equal(err.param, "messages[0].content[1].image_url.url");
      assert.equal(err.message, prefix + why);
    }
    // A redirect off http(s) is refused before anything goes where it points.
    for (const [name, scheme] of [["to-file.png", "file:"], ["to-gopher.png", "gopher:"]]) {
      const err = await chatErrorFrom(mmClient, "tiny-multimodal", url(name));
      assert.equal(err.status, 400, name);
      assert.ok(err.message.startsWith(`${prefix}${scheme}//`), err.message);
      assert.ok(err.message.endsWith(` is not an http(s) URL (a redirect from ${imagesUrl}/${name})`),
        err.message);
    }
    assert.ok(!asked.some((p) => p.includes("gopher-was-here")), asked.join(", "));
    // A host that accepts and answers nothing is given up at --media-url-timeout, not at the
    // HTTP client's 30 s stall limit, whose message would be curl's.
    const slow = await chatErrorFrom(mmClient, "tiny-multimodal", url("hang.png"));
    assert.equal(slow.message, prefix + "it took longer than --media-url-timeout 3.0 s");
  });

  test("a message whose text writes a media marker is a 400 that says so", async () => {
    for (const [text, words] of [
      ["What is <|image|>?", "the text holds <|image|>, which marks an image part; a message " +
        "cannot write it as text (1 in the prompt, 0 image parts)"],
      ["Hear <|audio|>", "the text holds <|audio|>, which marks an audio part; a message " +
        "cannot write it as text (1 in the prompt, 0 audio parts)"],
    ]) {
      const err = await mmClient.chat.completions
        .create({ model: "tiny-multimodal", max_tokens: 2, messages: [{ role: "user", content: text }] })
        .then(() => assert.fail("expected an error"), (e) => e);
      assert.equal(err.status, 400, text);
      assert.equal(err.param, "messages");
      assert.equal(err.message, `400 ${words}`);
    }
  });

  test("a checkpoint whose eos ids leave out <turn|>: it still ends a reply, constrained or not",
    async () => {
      const ask = { model: "tiny-multimodal", messages: [{ role: "user", content: "Pick one." }] };
      for (const seed of [0, 1, 2]) {
        const picked = await mmClient.chat.completions.create({
          ...ask, max_tokens: 30, temperature: 1, seed,
          response_format: { type: "json_schema", json_schema: { name: "s", schema: { enum: ["a", "b"] } } },
        });
        assert.equal(picked.choices[0].finish_reason, "stop", `seed ${seed}`);
        assert.ok(["a", "b"].includes(JSON.parse(picked.choices[0].message.content)));
      }
      const ended = await mmClient.chat.completions.create({
        ...ask, max_tokens: 5, logit_bias: { 106: 100 },
      });
      assert.equal(ended.choices[0].finish_reason, "stop");
      assert.equal(ended.usage.completion_tokens, 0);
    });
});
