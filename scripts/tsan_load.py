"""Mixed concurrent load on a torchtpu-cpp server or proxy, for scripts/tsan.sh.

Workers send, at random: streamed chat completions (some broken off after a few lines), choices
with logprobs, echoed completions, structured output, tool calls, Responses and Messages requests,
reads of /metrics, /v1/engine, /slots and the like, /tokenize and /apply-template, slot save,
restore and erase, LoRA scales per request and for the server, and with --media images and audio,
with --mcp the MCP tools at /mcp, with --runtime-lora an adapter loaded, applied and unloaded. Quiet spells of a few seconds let --sleep-idle-seconds put the
engine to sleep, and the next request wakes it. With --term-pid the process is sent SIGTERM at
--term-at seconds, and from then on 503s and refused connections are expected.

Prints the count of each (action, status) and the unexpected ones: a 5xx, a failed MCP call, an
exception. Exits 1 if there were any.
"""

import argparse
import base64
import collections
import http.client
import json
import os
import random
import signal
import socket
import struct
import threading
import time

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def wav(samples=1600):
    """0.1 s of noise at 16 kHz, PCM 16-bit, base64."""
    b = bytearray(44 + samples * 2)
    b[0:4], b[8:16], b[36:40] = b"RIFF", b"WAVEfmt ", b"data"
    struct.pack_into("<I", b, 4, 36 + samples * 2)
    struct.pack_into("<IHHIIHH", b, 16, 16, 1, 1, 16000, 32000, 2, 16)
    struct.pack_into("<I", b, 40, samples * 2)
    for i in range(samples):
        struct.pack_into("<h", b, 44 + 2 * i, random.randint(-3000, 3000))
    return base64.b64encode(bytes(b)).decode()


class Load:
    def __init__(self, args):
        self.port = args.port
        self.model = args.model
        self.counts = collections.Counter()
        self.problems = []
        self.lock = threading.Lock()
        self.stop_at = time.time() + args.seconds
        self.quiet = threading.Event()
        self.terminated = threading.Event()
        self.actions = [self.chat_stream] * 6 + [
            self.choices, self.echo, self.structured, self.tools, self.responses, self.messages,
            self.reads, self.reads, self.tokenize, self.slots, self.lora, self.lora_scales]
        if args.media:
            self.actions += [self.media] * 4
        if args.mcp:
            self.actions += [self.mcp] * 3
        self.runtime_lora = args.runtime_lora
        if args.runtime_lora:
            self.actions += [self.lora_runtime] * 2

    def note(self, action, status, body=""):
        with self.lock:
            self.counts[(action, status)] += 1
            expected = isinstance(status, int) and status < 500
            if self.terminated.is_set():
                expected = expected or status == 503 or status in (
                    "ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected",
                    "BrokenPipeError", "IncompleteRead")
            if not expected:
                self.problems.append((action, status, str(body)[:300]))

    def request(self, method, path, body=None, cut_after=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        if cut_after is not None:  # a client that leaves mid-stream
            for _ in range(cut_after):
                if not r.fp.readline():
                    break
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            return r.status, ""
        text = r.read().decode("utf-8", "replace")
        conn.close()
        return r.status, text

    def messages_of(self, words=1):
        said = ["hello", "tell me a story", "what is 2+2", "list three colors", "json please"]
        return [{"role": "user", "content": " ".join(random.choice(said) for _ in range(words))}]

    def chat(self, **fields):
        return {"model": self.model, "messages": self.messages_of(), **fields}

    def chat_stream(self):
        body = self.chat(messages=self.messages_of(random.randint(1, 30)), stream=True,
                         max_tokens=random.randint(1, 40), seed=random.randint(0, 9),
                         temperature=random.choice([0, 0.7, 1.2]),
                         stream_options={"include_usage": True})
        return self.request("POST", "/v1/chat/completions", body,
                            cut_after=random.choice([None, None, 2, 5, 9]))

    def choices(self):
        body = self.chat(n=2, max_tokens=12, logprobs=True, top_logprobs=3, temperature=0.8)
        return self.request("POST", "/v1/chat/completions", body)

    def echo(self):
        body = {"model": self.model, "prompt": "the quick brown fox " * random.randint(1, 20),
                "max_tokens": 4, "echo": True, "logprobs": 2}
        return self.request("POST", "/v1/completions", body)

    def structured(self):
        schema = {"type": "object", "required": ["a", "b"],
                  "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
        body = self.chat(max_tokens=30, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        return self.request("POST", "/v1/chat/completions", body)

    def tools(self):
        declared = [
            {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}},
            {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]
        choice = random.choice(["required", "auto", {"type": "function", "function": {"name": "g"}}])
        body = self.chat(max_tokens=20, tools=declared, tool_choice=choice)
        return self.request("POST", "/v1/chat/completions", body)

    def responses(self):
        body = {"model": self.model, "input": "hi there", "max_output_tokens": 16,
                "stream": random.random() < 0.5}
        return self.request("POST", "/v1/responses", body)

    def messages(self):
        body = {"model": self.model, "max_tokens": 16, "stream": random.random() < 0.5,
                "messages": [{"role": "user", "content": "hey"}]}
        return self.request("POST", "/v1/messages", body)

    def reads(self):
        return self.request("GET", random.choice([
            "/metrics", "/v1/engine", "/slots", "/health", "/v1/models", "/props",
            "/lora-adapters", "/livez"]))

    def tokenize(self):
        if random.random() < 0.5:
            return self.request("POST", "/tokenize", {"content": "hello world " * 5})
        return self.request("POST", "/apply-template", {"messages": self.messages_of()})

    def slots(self):
        slot = random.randint(0, 1)
        action = random.choice(["save", "restore", "erase"])
        body = {} if action == "erase" else {"filename": f"s{slot}.bin"}
        return self.request("POST", f"/slots/{slot}?action={action}", body)

    def lora(self):
        body = self.chat(max_tokens=8, lora=[{"id": random.randint(0, 1),
                                              "scale": random.choice([0.5, 1.0])}])
        return self.request("POST", "/v1/chat/completions", body)

    def lora_scales(self):
        return self.request("POST", "/lora-adapters", [{"id": 0, "scale": random.random()},
                                                        {"id": 1, "scale": random.random()}])

    def lora_runtime(self):
        """Loads the adapter as "late", applies it or unloads it (a 4xx when it is not loaded)."""
        what = random.choice(["load", "apply", "unload"])
        if what == "apply":
            return self.request("POST", "/v1/chat/completions",
                                {"model": "late", "messages": self.messages_of(), "max_tokens": 8})
        body = {"lora_name": "late"}
        if what == "load":
            body["lora_path"] = self.runtime_lora
        return self.request("POST", f"/v1/{what}_lora_adapter", body)

    def media(self):
        parts = [{"type": "text", "text": "what is this"}]
        if random.random() < 0.6:
            parts.append({"type": "image_url",
                          "image_url": {"url": "data:image/png;base64," + PNG}})
        else:
            parts.append({"type": "input_audio", "input_audio": {"data": wav(), "format": "wav"}})
        body = {"model": self.model, "messages": [{"role": "user", "content": parts}],
                "max_tokens": 6, "stream": random.random() < 0.5}
        return self.request("POST", "/v1/chat/completions", body)

    def mcp(self):
        name = random.choice(["ask", "stream", "engine_info", "endpoint_status", "serving_metrics"])
        params = {"name": name, "arguments": {"prompt": "hi", "max_tokens": 8}
                  if name in ("ask", "stream") else {}}
        if name == "stream":
            params["_meta"] = {"progressToken": 7}
        status, text = self.request(
            "POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
            headers={"accept": "application/json, text/event-stream"})
        return (599 if '"isError":true' in text.replace(" ", "") else status), text

    def worker(self):
        while time.time() < self.stop_at:
            if self.quiet.is_set():
                time.sleep(0.1)
                continue
            action = random.choice(self.actions)
            try:
                status, text = action()
                self.note(action.__name__, status, text)
            except Exception as e:  # noqa: BLE001 - every failure is counted by its kind
                self.note(action.__name__, type(e).__name__, e)

    def quiet_spells(self):
        while time.time() < self.stop_at:
            time.sleep(random.uniform(8, 15))
            self.quiet.set()
            time.sleep(random.uniform(2.5, 4))
            self.quiet.clear()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="m")
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--media", action="store_true", help="images and audio too")
    p.add_argument("--mcp", action="store_true", help="the MCP tools at /mcp too")
    p.add_argument("--runtime-lora", metavar="DIR", help="an adapter to load and unload")
    p.add_argument("--term-pid", type=int, help="a process to send SIGTERM")
    p.add_argument("--term-at", type=float, default=0, help="seconds from the start")
    args = p.parse_args()
    load = Load(args)
    threads = [threading.Thread(target=load.worker) for _ in range(args.workers)]
    threads.append(threading.Thread(target=load.quiet_spells, daemon=True))
    if args.term_pid:
        def terminate():
            time.sleep(args.term_at)
            load.terminated.set()
            os.kill(args.term_pid, signal.SIGTERM)
        threads.append(threading.Thread(target=terminate, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        if not t.daemon:
            t.join()
    for (action, status), n in sorted(load.counts.items(), key=str):
        print(f"{action:16} {status!s:24} {n}")
    print(f"unexpected: {len(load.problems)}")
    for problem in load.problems[:30]:
        print("  ", problem)
    raise SystemExit(1 if load.problems else 0)


if __name__ == "__main__":
    main()
