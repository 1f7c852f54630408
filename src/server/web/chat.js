// The chat page of torchtpu-cpp: streams replies from /v1/chat/completions, keeps the
// conversation, cancels with Stop (aborting the fetch closes the connection, and the server stops
// the decode), and shows the engine's build and decode rate. A question that gets no reply text
// (an error, or Stop before any) leaves the conversation: the log marks it unsent, and it goes
// back to an empty composer, attachments and all. Model and server text only ever reaches the
// page through textContent: nothing it says is parsed as markup.
//
// When /v1/models says the model reads images or audio, the composer attaches PNG, JPEG and WebP
// images, WAV and MP3 files and microphone recordings (turned into 16 kHz mono 16-bit WAV here:
// the server reads WAV and MP3). They go as OpenAI content parts, images, then audio, then the text, and stay in
// the conversation that every request carries; the log shows them as <img> and <audio> of their
// data: URLs (the page's Content-Security-Policy allows data: for img-src and media-src).
//
// When the server serves LoRA adapters (/v1/models lists them with a `parent`), the panel offers
// them, and a reply under one names it as the request's model (vLLM's way).
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];  // {role, content} turns sent with every request
let controller = null;    // aborts the reply being streamed

// Per item: as base64 in the request it counts 4/3 of this against the server's --max-body-bytes
// (8 MiB by default), with room left for the conversation.
const MAX_FILE_BYTES = 4 << 20;
const MAX_AUDIO_SECONDS = 30;  // the longest clip the server reads
const WAV_RATE = 16000;        // what Gemma 4's audio encoder reads (the server resamples others)
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp"];
// What the next message carries: {kind: "image" | "audio", name, label, mime, data (base64)}.
const attachments = [];
let recording = null;  // {recorder, started, timer, ticker} while the microphone records

function requestHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function scrollToEnd() {
  const log = $("log");
  log.scrollTop = log.scrollHeight;
}

// Whether the log shows its end: a streamed reply is followed only then, so a reader who scrolled
// up stays where they are.
function atEnd() {
  const log = $("log");
  return log.scrollHeight - log.scrollTop - log.clientHeight < 32;
}

const dataUrl = (item) => `data:${item.mime};base64,${item.data}`;

// An <img> or <audio controls> of an attachment's data: URL.
function mediaElement(item) {
  if (item.kind === "image") {
    const img = document.createElement("img");
    img.src = dataUrl(item);
    img.alt = item.name;
    img.title = item.label;
    return img;
  }
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.preload = "metadata";
  audio.src = dataUrl(item);
  audio.title = item.label;
  return audio;
}

// One message in the log, its images and audio above its text; `show(delta)` adds a streamed
// delta to it.
function addMessage(role, text = "", media = []) {
  const el = document.createElement("div");
  el.className = `message ${role}`;
  if (media.length) {
    const row = document.createElement("div");
    row.className = "media";
    row.append(...media.map(mediaElement));
    el.append(row);
  }
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  thinking.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const thought = document.createElement("pre");
  thinking.append(summary, thought);
  const body = document.createElement("div");
  body.className = "content";
  const meta = document.createElement("div");
  meta.className = "meta";
  el.append(thinking, body, meta);
  $("log").append(el);
  const view = { el, body, meta, content: "", reasoning: "" };
  view.show = (delta) => {
    const follow = atEnd();
    if (delta.reasoning_content) {
      view.reasoning += delta.reasoning_content;
      thinking.hidden = false;
      thought.textContent = view.reasoning;
    }
    if (delta.content) {
      view.content += delta.content;
      body.textContent = view.content;
    }
    if (follow) scrollToEnd();
  };
  view.show({ content: text });
  scrollToEnd();
  return view;
}

// The JSON payloads of a server-sent event stream, up to [DONE].
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("clear").disabled = busy;
}

// A user turn's content: the text alone, or OpenAI content parts, the media (in the order given)
// and then the text.
function userContent(text, media) {
  if (!media.length) return text;
  const parts = media.map((item) =>
    item.kind === "image"
      ? { type: "image_url", image_url: { url: dataUrl(item) } }
      : { type: "input_audio",
          input_audio: { data: item.data, format: item.mime === "audio/mpeg" ? "mp3" : "wav" } });
  if (text) parts.push({ type: "text", text });
  return parts;
}

async function send(text, media = []) {
  // Images, then audio, then the text: the order the CLI uses (generate --image … --audio …).
  media = [...media.filter((m) => m.kind === "image"), ...media.filter((m) => m.kind === "audio")];
  conversation.push({ role: "user", content: userContent(text, media) });
  const question = addMessage("user", text, media);
  const view = addMessage("assistant");
  view.el.dataset.state = "streaming";
  const system = $("system").value.trim();
  const body = {
    messages: system ? [{ role: "system", content: system }, ...conversation] : [...conversation],
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    chat_template_kwargs: { enable_thinking: $("thinking").checked },
  };
  // The server enforces it while decoding: the reply is one JSON object.
  if ($("json-output").checked) body.response_format = { type: "json_object" };
  if ($("adapter").value) body.model = $("adapter").value;
  const maxTokens = Number($("max-tokens").value);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null;
  let chunks = 0;
  let finish = null;
  let timings = null;
  let usage = null;
  let follow = false;  // whether the log showed its end when the reply ended
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      const error = new Error(body?.error?.message ?? `HTTP ${response.status}`);
      error.code = body?.error?.code;
      throw error;
    }
    for await (const event of events(response)) {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) usage = event.usage;
      const choice = event.choices?.[0];
      if (!choice) continue;
      if (choice.delta && (choice.delta.content || choice.delta.reasoning_content)) {
        view.show(choice.delta);
        chunks += 1;
        firstAt ??= performance.now();
        const seconds = (performance.now() - firstAt) / 1000;
        if (seconds > 0) $("info-rate").textContent = `${(chunks / seconds).toFixed(1)} chunks/s (live)`;
      }
      if (choice.finish_reason) {
        finish = choice.finish_reason;
        timings = event.timings ?? null;
      }
    }
    follow = atEnd();
    const parts = [`finish ${finish ?? "?"}`];
    if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
    if (timings?.decode_tokens_per_second) {
      parts.push(`decode ${timings.decode_tokens_per_second.toFixed(1)} tok/s`);
    }
    parts.push(`${((performance.now() - started) / 1000).toFixed(2)} s`);
    view.meta.textContent = parts.join(" · ");
    view.el.dataset.state = "done";
  } catch (error) {
    follow = atEnd();
    if (error.name === "AbortError") {
      view.meta.textContent = "stopped";
      view.el.dataset.state = "stopped";
    } else {
      view.meta.textContent = `error: ${error.message}`;
      if (error.code === "context_length_exceeded") {
        view.meta.textContent += " — the conversation no longer fits the model's context: " +
          "New chat starts an empty one";
      }
      view.el.classList.add("error");
      view.el.dataset.state = "error";
      // The server may have restarted with other settings (a context of another size).
      loadEngine();
    }
  } finally {
    controller = null;
    setBusy(false);
    // A reply that ended keeps its turn even when empty (its thinking took every token), so the
    // log and the history agree.
    if (view.content || view.el.dataset.state === "done") {
      conversation.push({ role: "assistant", content: view.content });
    } else {
      // Failed or stopped before any text: the question leaves the conversation, so turns keep
      // alternating, and the log says so.
      conversation.pop();
      unanswered(question, text, media);
    }
    // The lines added at the end (the meta, the note) are shown to a reader who was following.
    if (follow) scrollToEnd();
    refreshMetrics();
  }
}

// Marks a question that got no reply as outside the conversation, and puts it back in the
// composer to edit and send again, unless something new is being written there.
function unanswered(question, text, media) {
  question.el.dataset.state = "unsent";
  question.meta.textContent = "not answered, so not in the conversation";
  if ($("input").value.trim() || attachments.length) return;
  $("input").value = text;
  attachments.push(...media);
  renderAttachments();
  question.meta.textContent += "; it is back in the message box";
}

// --- Attachments --------------------------------------------------------------------------------

function attachError(message) {
  $("attach-error").textContent = message;
}

const ascii = (bytes, from, to) => String.fromCharCode(...bytes.subarray(from, to));

function base64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

const mib = (n) => `${(n / (1 << 20)).toFixed(1)} MiB`;
const size = (n) => (n < 1 << 20 ? `${Math.ceil(n / 1024)} KiB` : mib(n));
const clock = (s) => `${Math.floor(s / 60)}:${String(Math.floor(s % 60)).padStart(2, "0")}`;

// The image type the bytes start with: PNG, JPEG or WebP's signature, else null.
function imageType(bytes) {
  const png = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (bytes.length >= 8 && png.every((b, i) => bytes[i] === b)) return "image/png";
  if (bytes.length >= 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "image/jpeg";
  if (bytes.length >= 12 && ascii(bytes, 0, 4) === "RIFF" && ascii(bytes, 8, 12) === "WEBP") {
    return "image/webp";
  }
  return null;
}

// A RIFF/WAVE file's length in seconds (its data chunk over the fmt chunk's byte rate), else null.
function wavSeconds(bytes) {
  if (bytes.length < 12 || ascii(bytes, 0, 4) !== "RIFF" || ascii(bytes, 8, 12) !== "WAVE") return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let byteRate = 0;
  for (let at = 12; at + 8 <= bytes.length;) {
    const id = ascii(bytes, at, at + 4);
    const length = view.getUint32(at + 4, true);
    if (id === "fmt " && length >= 16 && at + 24 <= bytes.length) byteRate = view.getUint32(at + 16, true);
    if (id === "data") return byteRate ? Math.min(length, bytes.length - at - 8) / byteRate : null;
    at += 8 + length + (length & 1);
  }
  return null;
}

// 16-bit PCM mono WAV of samples in [-1, 1].
function encodeWav(samples, rate) {
  const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const tag = (at, text) => [...text].forEach((c, i) => view.setUint8(at + i, c.charCodeAt(0)));
  tag(0, "RIFF");
  view.setUint32(4, 36 + samples.length * 2, true);
  tag(8, "WAVE");
  tag(12, "fmt ");
  view.setUint32(16, 16, true);        // the fmt chunk's size
  view.setUint16(20, 1, true);         // PCM
  view.setUint16(22, 1, true);         // one channel
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true);  // bytes per second
  view.setUint16(32, 2, true);         // bytes per frame
  view.setUint16(34, 16, true);        // bits per sample
  tag(36, "data");
  view.setUint32(40, samples.length * 2, true);
  samples.forEach((x, i) => {
    const s = Math.max(-1, Math.min(1, x));
    view.setInt16(44 + i * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  });
  return new Uint8Array(view.buffer);
}

// MP3 as the server tells it: an ID3 tag or an MPEG frame sync first.
function isMp3(bytes) {
  return (bytes.length >= 3 && ascii(bytes, 0, 3) === "ID3") ||
    (bytes.length >= 2 && bytes[0] === 0xFF && (bytes[1] & 0xE0) === 0xE0);
}

// A clip's length as the browser decodes it, else null.
async function decodedSeconds(bytes) {
  try {
    return (await new OfflineAudioContext(1, 1, WAV_RATE).decodeAudioData(bytes.slice().buffer))
      .duration;
  } catch {
    return null;
  }
}

// A recording (whatever MediaRecorder wrote: WebM/Opus in Chromium) as 16 kHz mono WAV: decoding
// in a 16 kHz context resamples it, and the channels are averaged. At most 30 s of it: the
// recorder stops itself then, a few milliseconds late.
async function recordingToWav(blob) {
  const context = new OfflineAudioContext(1, 1, WAV_RATE);
  const decoded = await context.decodeAudioData(await blob.arrayBuffer());
  const mono = new Float32Array(Math.min(decoded.length, MAX_AUDIO_SECONDS * WAV_RATE));
  for (let c = 0; c < decoded.numberOfChannels; c++) {
    const channel = decoded.getChannelData(c);
    for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / decoded.numberOfChannels;
  }
  return encodeWav(mono, WAV_RATE);
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren(
    ...attachments.map((item) => {
      const chip = document.createElement("div");
      chip.className = `chip ${item.kind}`;
      const label = document.createElement("span");
      label.textContent = item.label;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.title = `Remove ${item.name}`;
      remove.setAttribute("aria-label", remove.title);
      remove.addEventListener("click", () => {
        attachments.splice(attachments.indexOf(item), 1);
        renderAttachments();
      });
      chip.append(mediaElement(item), label, remove);
      return chip;
    }),
  );
  box.hidden = attachments.length === 0;
}

function attach(kind, name, label, mime, bytes) {
  attachments.push({ kind, name, label: `${name} (${label})`, mime, data: base64(bytes) });
}

// Checks a picked file in the page (its type from its bytes, its size, a clip's length) and adds
// it, or says why not.
async function attachFile(file, kind) {
  if (file.size > MAX_FILE_BYTES) {
    throw new Error(
      `"${file.name}" is ${mib(file.size)}, more than the ${mib(MAX_FILE_BYTES)} the page sends`);
  }
  const bytes = new Uint8Array(await file.arrayBuffer());
  if (kind === "image") {
    const mime = imageType(bytes);
    if (!mime) {
      throw new Error(`"${file.name}" is not a PNG, JPEG or WebP image` +
        (file.type && !IMAGE_TYPES.includes(file.type) ? ` (it is ${file.type})` : ""));
    }
    attach(kind, file.name, size(bytes.length), mime, bytes);
  } else {
    const mp3 = isMp3(bytes);
    const seconds = mp3 ? await decodedSeconds(bytes) : wavSeconds(bytes);
    if (seconds === null) {
      throw new Error(mp3 ? `"${file.name}" is not a readable MP3 file`
        : `"${file.name}" is not a WAV or MP3 file; the server reads those`);
    }
    if (seconds > MAX_AUDIO_SECONDS) {
      throw new Error(`"${file.name}" is ${seconds.toFixed(1)} s long, ` +
        `more than the ${MAX_AUDIO_SECONDS} s the server reads`);
    }
    attach(kind, file.name, clock(seconds), mp3 ? "audio/mpeg" : "audio/wav", bytes);
  }
}

async function attachFiles(input, kind) {
  attachError("");
  const problems = [];
  for (const file of input.files) {
    try {
      await attachFile(file, kind);
    } catch (error) {
      problems.push(error.message);
    }
  }
  input.value = "";  // picking the same file again fires change again
  attachError(problems.join("; "));
  renderAttachments();
}

function canRecord() {
  return Boolean(navigator.mediaDevices?.getUserMedia) && typeof MediaRecorder !== "undefined";
}

async function startRecording() {
  attachError("");
  let stream;
  $("record").disabled = true;  // while the browser asks for the microphone
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (error) {
    attachError(`the microphone: ${error.message || error.name}`);
    return;
  } finally {
    $("record").disabled = false;
  }
  const recorder = new MediaRecorder(stream);
  const chunks = [];
  recorder.addEventListener("dataavailable", (event) => {
    if (event.data.size) chunks.push(event.data);
  });
  recorder.addEventListener("stop", async () => {
    clearTimeout(recording.timer);
    clearInterval(recording.ticker);
    stream.getTracks().forEach((track) => track.stop());
    recording = null;
    $("record").textContent = "Record";
    $("record").classList.remove("recording");
    try {
      const wav = await recordingToWav(new Blob(chunks, { type: recorder.mimeType }));
      const seconds = (wav.length - 44) / 2 / WAV_RATE;
      const n = attachments.filter((a) => a.name.startsWith("recording")).length + 1;
      attach("audio", `recording ${n}`, clock(seconds), "audio/wav", wav);
      renderAttachments();
    } catch (error) {
      attachError(`the recording could not be read: ${error.message}`);
    }
  });
  recorder.start();
  recording = {
    recorder,
    started: performance.now(),
    // The server reads clips up to 30 s.
    timer: setTimeout(() => recorder.stop(), MAX_AUDIO_SECONDS * 1000),
    ticker: setInterval(() => {
      const seconds = (performance.now() - recording.started) / 1000;
      $("record").textContent = `Stop recording (${clock(seconds)})`;
    }, 250),
  };
  $("record").textContent = "Stop recording (0:00)";
  $("record").classList.add("recording");
}

// Shows the attach controls the model's modalities call for; attachments it cannot read leave.
function applyModalities(list) {
  const image = list.includes("image");
  const audio = list.includes("audio");
  document.body.dataset.modalities = list.join(" ");
  $("attach-image").hidden = !image;
  $("attach-audio").hidden = !audio;
  $("record").hidden = !audio;
  $("media-tools").hidden = !image && !audio;
  if (audio && !canRecord()) {
    $("record").disabled = true;
    $("record").title = "Recording needs a secure page: https, or http on localhost or 127.0.0.1";
  }
  for (let i = attachments.length - 1; i >= 0; i--) {
    if (!list.includes(attachments[i].kind)) attachments.splice(i, 1);
  }
  renderAttachments();
}

// The adapter picker's options: none, then each adapter /v1/models lists; the choice stays while
// its adapter does (adapters come and go on a server with --runtime-lora).
function applyAdapters(models) {
  const select = $("adapter");
  const chosen = select.value;
  const names = models.filter((m) => m.parent).map((m) => m.id);
  const shown = [...select.options].slice(1).map((o) => o.value);
  if (names.join("\n") === shown.join("\n")) return;
  while (select.options.length > 1) select.remove(1);
  for (const name of names) select.add(new Option(name, name));
  select.value = names.includes(chosen) ? chosen : "";
  $("adapter-setting").hidden = names.length === 0;
}

async function loadModels() {
  try {
    const response = await fetch("/v1/models", { headers: requestHeaders() });
    if (!response.ok) return;
    const models = (await response.json()).data ?? [];
    const list = models[0]?.modalities;
    applyModalities(Array.isArray(list) ? list : ["text"]);
    applyAdapters(models);
  } catch {
    // Text only, no adapters, until the next load.
  }
}

function prometheus(text) {
  const values = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$/);
    if (m) values[m[1]] = Number(m[2]);
  }
  return values;
}

async function refreshMetrics() {
  try {
    const response = await fetch("/metrics", { headers: requestHeaders() });
    if (!response.ok) return;
    const m = prometheus(await response.text());
    const count = m.torchtpu_decode_tokens_per_second_count;
    if (!controller) {
      $("info-rate").textContent = count
        ? `${(m.torchtpu_decode_tokens_per_second_sum / count).toFixed(1)} tok/s (mean of ${count})`
        : "no requests yet";
    }
    $("info-served").textContent =
      `${m.torchtpu_generated_tokens_total ?? 0} tokens, ` +
      `${m.torchtpu_requests_cancelled_total ?? 0} cancelled, queue ${m.torchtpu_queue_depth ?? 0}`;
  } catch {
    // The next refresh tries again.
  }
}

async function loadEngine() {
  try {
    const response = await fetch("/v1/engine", { headers: requestHeaders() });
    if (response.status === 503) {
      $("status").textContent = "the model is loading…";
      setTimeout(loadEngine, 1000);
      return;
    }
    if (!response.ok) {
      $("status").textContent = `/v1/engine: HTTP ${response.status}`;
      return;
    }
    const e = await response.json();
    $("status").textContent = "";
    $("info-model").textContent = e.random_weights ? `${e.model} (random weights)` : e.model;
    $("info-build").textContent = `${e.build?.version ?? "?"} (${e.build?.git_revision ?? "?"})`;
    $("info-torch").textContent = e.torch_version ?? e.build?.torch_version ?? "?";
    $("info-device").textContent = e.device ?? "?";
    $("info-dtype").textContent = e.dtype ?? "?";
    const l = e.layout ?? {};
    $("info-layout").textContent =
      `${l.full_rings} full + ${l.sliding_rings} sliding rings, ` +
      `${l.shared_layers} shared layers, context ${l.context}`;
    loadModels();
  } catch (error) {
    $("status").textContent = `/v1/engine: ${error.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if ((!text && !attachments.length) || controller) return;
    if (recording) {
      attachError("Stop the recording first: it is attached when it ends");
      return;
    }
    $("input").value = "";
    attachError("");
    const media = attachments.splice(0);
    renderAttachments();
    send(text, media);
  });
  $("input").addEventListener("keydown", (event) => {
    // Enter also ends an input method's composition (Japanese, Chinese, Korean): that one is not
    // a send.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("clear").addEventListener("click", () => {
    conversation.length = 0;
    $("log").replaceChildren();
  });
  $("attach-image").addEventListener("click", () => $("image-file").click());
  $("attach-audio").addEventListener("click", () => $("audio-file").click());
  $("image-file").addEventListener("change", () => attachFiles($("image-file"), "image"));
  $("audio-file").addEventListener("change", () => attachFiles($("audio-file"), "audio"));
  $("record").addEventListener("click", () => {
    if (recording) recording.recorder.stop();
    else startRecording();
  });
  $("temperature").addEventListener("input", () => {
    $("temperature-value").textContent = $("temperature").value;
  });
  // Adapters loaded or unloaded since the page loaded show when the picker is opened.
  $("adapter").addEventListener("focus", loadModels);
  $("api-key").addEventListener("change", () => {
    loadEngine();
    refreshMetrics();
  });
  loadEngine();
  refreshMetrics();
  setInterval(refreshMetrics, 2000);
});
