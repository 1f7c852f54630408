// The chat page of torchtpu-cpp: streams replies from /v1/chat/completions, keeps the
// conversation, cancels with Stop (aborting the fetch closes the connection, and the server stops
// the decode), and shows the engine's build and decode rate. Model and server text only ever
// reaches the page through textContent: nothing it says is parsed as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];  // {role, content} turns sent with every request
let controller = null;    // aborts the reply being streamed

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

// One message in the log; `show(delta)` adds a streamed delta to it.
function addMessage(role, text = "") {
  const el = document.createElement("div");
  el.className = `message ${role}`;
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
    if (delta.reasoning_content) {
      view.reasoning += delta.reasoning_content;
      thinking.hidden = false;
      thought.textContent = view.reasoning;
    }
    if (delta.content) {
      view.content += delta.content;
      body.textContent = view.content;
    }
    scrollToEnd();
  };
  view.show({ content: text });
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

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
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
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => null);
      throw new Error(error?.error?.message ?? `HTTP ${response.status}`);
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
    const parts = [`finish ${finish ?? "?"}`];
    if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
    if (timings?.decode_tokens_per_second) {
      parts.push(`decode ${timings.decode_tokens_per_second.toFixed(1)} tok/s`);
    }
    parts.push(`${((performance.now() - started) / 1000).toFixed(2)} s`);
    view.meta.textContent = parts.join(" · ");
    view.el.dataset.state = "done";
  } catch (error) {
    if (error.name === "AbortError") {
      view.meta.textContent = "stopped";
      view.el.dataset.state = "stopped";
    } else {
      view.meta.textContent = `error: ${error.message}`;
      view.el.classList.add("error");
      view.el.dataset.state = "error";
    }
  } finally {
    controller = null;
    setBusy(false);
    if (view.content) {
      conversation.push({ role: "assistant", content: view.content });
    } else {
      // Nothing came back: the question leaves the conversation, so turns keep alternating.
      conversation.pop();
    }
    refreshMetrics();
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
  } catch (error) {
    $("status").textContent = `/v1/engine: ${error.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("clear").addEventListener("click", () => {
    conversation.length = 0;
    $("log").replaceChildren();
  });
  $("temperature").addEventListener("input", () => {
    $("temperature-value").textContent = $("temperature").value;
  });
  $("api-key").addEventListener("change", () => {
    loadEngine();
    refreshMetrics();
  });
  loadEngine();
  refreshMetrics();
  setInterval(refreshMetrics, 2000);
});
