"""`python -m torchtpu_cpp.serve` hosts the same C++ server as `torchtpu-cpp serve`: the same
requests get the same answers from both (ids, timestamps and timings aside), and SIGTERM stops the
Python-hosted one cleanly."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

REPO_DIR = pathlib.Path(__file__).resolve().parents[2]
# Fields that differ between two servers by when they started or answered.
VOLATILE = {"id", "created", "created_at", "timings"}

CHAT = {
    "messages": [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name three oceans."},
    ],
    "max_tokens": 12,
    "temperature": 0,  # greedy: the checkpoint's generation_config would sample
}
REQUESTS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", dict(CHAT, max_tokens=5, stop=["e"])),
    ("/v1/chat/completions", dict(CHAT, stream=True, stream_options={"include_usage": True})),
    ("/v1/completions", {"prompt": "The sea is", "max_tokens": 10, "temperature": 0}),
    ("/v1/completions", {"prompt": "The sea is", "max_tokens": 6, "temperature": 0, "stream": True}),
    # Sampled with a seed: the same draw from both hosts.
    ("/v1/completions", {"prompt": "The sea is", "max_tokens": 6, "temperature": 1, "seed": 7}),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),  # a 4xx, the same from both
]


@pytest.fixture(scope="module")
def checkpoint(cli, tmp_path_factory, test_tokenizer_dir):
    """Tiny random weights with the full Gemma 4 vocabulary, so the test tokenizer fits."""
    return cli.make_served_tiny(tmp_path_factory.mktemp("served"), test_tokenizer_dir, 8, "bf16")


class Server:
    def __init__(self, cmd, env=None):
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        deadline = time.time() + 300
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            match = re.search(r"serving .* on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
            if not line and self.proc.poll() is not None:
                raise AssertionError(
                    f"{cmd} exited {self.proc.returncode}: {self.proc.stderr.read()}"
                )
        else:
            raise AssertionError(f"{cmd} printed no 'serving ... on' line")
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{cmd} never became healthy")

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body):
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _normalise(value):
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def _text_only(event):
    """The choice of a chunk that carries text and nothing else, or None."""
    if not isinstance(event, dict) or len(event.get("choices", [])) != 1:
        return None
    choice = event["choices"][0]
    if choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
        return None
    if "delta" in choice:
        return choice if set(choice["delta"]) == {"content"} else None
    return choice if "text" in choice else None


def _join_text_chunks(events):
    """Consecutive text-only chunks as one. A stream sends whatever text the engine produced
    since its last write, so where the text splits into chunks depends on timing (a loaded
    machine joins pieces), not on the answer."""
    joined = []
    for event in events:
        choice, last = _text_only(event), _text_only(joined[-1]) if joined else None
        if choice is None or last is None:
            joined.append(event)
        elif "delta" in choice:
            last["delta"]["content"] += choice["delta"]["content"]
        else:
            last["text"] += choice["text"]
    return joined


def _answer(status, text):
    """JSON bodies as data, SSE streams as the list of their events, text chunks joined."""
    if text.startswith("data:"):
        events = [e[len("data:") :].strip() for e in text.split("\n\n") if e.strip()]
        events = [e if e == "[DONE]" else _normalise(json.loads(e)) for e in events]
        return status, _join_text_chunks(events)
    return status, _normalise(json.loads(text))


@pytest.fixture(scope="module")
def servers(cli, checkpoint):
    import torchtpu_cpp

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(torchtpu_cpp.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    common = ["--model", checkpoint, "--port", "0", "--context", "256"]
    native = Server([cli.path, "serve", *common])
    try:
        hosted = Server(
            [sys.executable, "-m", "torchtpu_cpp.serve", "--device", "cpu", *common], env
        )
    except BaseException:
        native.stop()
        raise
    yield native, hosted
    native.stop()
    hosted.stop()


def test_python_hosted_server_answers_like_the_native_one(servers):
    native, hosted = servers
    for path, body in REQUESTS:
        want = _answer(*native.post(path, body))
        got = _answer(*hosted.post(path, body))
        assert got == want, (path, body)
    assert _answer(*hosted.get("/v1/models")) == _answer(*native.get("/v1/models"))


def test_python_hosted_server_reports_its_host(servers):
    native, hosted = servers
    assert json.loads(hosted.get("/v1/engine")[1])["hosted_by"] == "python"
    assert json.loads(native.get("/v1/engine")[1])["hosted_by"] == "torchtpu-cpp"



def test_apply_template_and_props_are_what_transformers_and_the_template_say(servers, checkpoint):
    """POST /apply-template (llama-server's) answers the prompt transformers' apply_chat_template
    renders for the same messages, tools and kwargs; GET /props reports the checkpoint's template
    and the caps ChatTemplate.caps() finds in it; from either host."""
    import torchtpu_cpp
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(checkpoint)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Rain in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "RAINY-12C"},
    ]
    caps = torchtpu_cpp.ChatTemplate(checkpoint).caps()
    for server in servers:
        for thinking in (False, True):
            status, text = server.post(
                "/apply-template",
                {
                    "messages": messages,
                    "tools": tools,
                    "chat_template_kwargs": {"enable_thinking": thinking},
                },
            )
            assert status == 200, text
            want = reference.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
                enable_thinking=thinking,
            )
            assert json.loads(text) == {"prompt": want}
        status, text = server.post("/apply-template", {"tools": tools})
        assert status == 400 and json.loads(text)["error"]["param"] == "messages", text
        props = json.loads(server.get("/props")[1])
        assert props["chat_template"] == reference.chat_template
        assert props["chat_template_caps"] == caps
        assert props["default_generation_settings"]["n_ctx"] == 256

def test_sigterm_stops_the_python_hosted_server_cleanly(cli, checkpoint):
    import torchtpu_cpp

    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(torchtpu_cpp.__file__).parents[1]))
    server = Server(
        [sys.executable, "-m", "torchtpu_cpp.serve", "--model", checkpoint, "--port", "0"], env
    )
    assert server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200
    assert server.stop() == 0


def test_the_python_host_takes_the_router_options(cli, checkpoint):
    """Aliases, vLLM's metric names, /metrics without the key, and the drain's grace: the options
    a router deployment (deploy/helm, launcher python) gives the TPU host."""
    import torchtpu_cpp

    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(torchtpu_cpp.__file__).parents[1]))
    router_options = (
        "--model-id tiny --served-model-name alias-a --served-model-name alias-b "
        "--metrics-compat vllm --api-key k --drain-grace 3"
    ).split()
    server = Server(
        [sys.executable, "-m", "torchtpu_cpp.serve", "--model", checkpoint, "--port", "0"]
        + router_options,
        env,
    )
    try:
        status, text = server.get("/metrics")
        assert status == 200, text
        assert re.search(r'^vllm:num_requests_waiting\{model_name="tiny"\} 0$', text, re.M), text
        req = urllib.request.Request(
            server.url + "/v1/models", headers={"Authorization": "Bearer k"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            names = [m["id"] for m in json.loads(r.read())["data"]]
        assert names == ["tiny", "alias-a", "alias-b"]

        server.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 2
        while server.get("/health")[0] != 503:
            assert time.time() < deadline, "/health stayed 200 after SIGTERM"
            time.sleep(0.05)
        assert json.loads(server.get("/health")[1])["status"] == "draining"
        # Within the grace a request is still answered, under an alias.
        req = urllib.request.Request(
            server.url + "/v1/completions",
            json.dumps({"model": "alias-b", "prompt": "Hi", "max_tokens": 2}).encode(),
            {"Content-Type": "application/json", "Authorization": "Bearer k"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
        assert server.proc.wait(timeout=60) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


# Images and audio (#19) -----------------------------------------------------------------------

# A bad value of each media flag, and the line both hosts print for it (the server's own check,
# check_media_limits and mcp_media_directory, names the flag).
MEDIA_FLAG_ERRORS = [
    (["--max-media", "33"], "error: --max-media must be between 0 and 32, got 33"),
    (["--max-image-bytes", "0"], "error: --max-image-bytes must be between 1 and 2^30, got 0"),
    (
        ["--max-audio-bytes", str((1 << 30) + 1)],
        "error: --max-audio-bytes must be between 1 and 2^30, got 1073741825",
    ),
    (
        ["--image-tokens", "100"],
        "error: --image-tokens must be 70, 140, 280, 560 or 1120, got 100",
    ),
    (
        ["--media-url-timeout", "0"],
        "error: --media-url-timeout must be above 0 and at most 600 seconds, got 0.0",
    ),
    (
        ["--mcp-media-dir", "/nonexistent-torchtpu-media"],
        "error: --mcp-media-dir /nonexistent-torchtpu-media: No such file or directory",
    ),
]


def _python_host_env():
    import torchtpu_cpp

    return dict(os.environ, PYTHONPATH=str(pathlib.Path(torchtpu_cpp.__file__).parents[1]))


def _python_host(model, *flags):
    """`python -m torchtpu_cpp.serve` on `model`, on a free port, with `flags`."""
    command = [sys.executable, "-m", "torchtpu_cpp.serve", "--model", model, "--port", "0"]
    return Server([*command, *flags], _python_host_env())


# The batch's flags (#17), which the Python host passes on as it does the rest.
BATCH_FLAG_ERRORS = [
    (
        ["--step-tokens", "4"],
        "error: --step-tokens must exceed --parallel (4) and be at most 2^20, or be 0 for the "
        "default, got 4",
    ),
    (["--pass-rows", "-2"], "error: --pass-rows must be at least 0, got -2"),
]


# The engine's flags, refused before serving as the batch's are (--device too, but the Python
# host asks torch for the device first, in torch's words).
ENGINE_FLAG_ERRORS = [
    (["--int4-activation-bits", "12"], "error: --int4-activation-bits must be 16 or 8, got 12"),
    (["--dtype", "f8"], "error: unknown dtype 'f8' (expected bfloat16, float32 or float16)"),
    (
        ["--int4", "fast"],
        'error: int4 weights "fast" is not one of auto, packed, composite, dequantized',
    ),
    (["--quantize", "int8"], 'error: quantize "int8" is not one of int4, none'),
    (["--lora", "=x"], "error: a LoRA adapter is given as [NAME=]DIR, got '=x'"),
]


def _options(help_text):
    """The long options a --help lists (CLI11 and argparse both indent them by two spaces)."""
    return set(re.findall(r"^  (--[a-z0-9-]+)", help_text, re.M)) - {"--help"}


def test_the_python_host_takes_every_flag_serve_takes(cli):
    """One command line starts either host (the chart writes the same one for both launchers)."""
    native = subprocess.run(
        [cli.path, "serve", "--help"], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    hosted = subprocess.run(
        [sys.executable, "-m", "torchtpu_cpp.serve", "--help"],
        check=True,
        capture_output=True,
        text=True,
        env=_python_host_env(),
        timeout=60,
    ).stdout
    assert len(_options(native)) > 30, native
    assert _options(native) - _options(hosted) == set()


def test_the_python_host_refuses_bad_flags_as_serve_does(cli, checkpoint):
    env = _python_host_env()
    common = ["--model", checkpoint, "--port", "0"]
    for flags, line in MEDIA_FLAG_ERRORS + BATCH_FLAG_ERRORS + ENGINE_FLAG_ERRORS:
        for cmd in (
            [cli.path, "serve", *common, *flags],
            [sys.executable, "-m", "torchtpu_cpp.serve", *common, *flags],
        ):
            try:
                proc = subprocess.run(
                    cmd, check=False, capture_output=True, text=True, env=env, timeout=120
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"{cmd} did not refuse {flags}: still running after 120 s")
            assert proc.returncode == 2, (cmd, proc.stderr)
            assert proc.stderr.strip().splitlines()[-1] == line, (cmd, proc.stderr)
            assert "serving" not in proc.stdout, cmd


@pytest.fixture(scope="module")
def multimodal(checkpoint, tmp_path_factory):
    """The tiny checkpoint with a vision and an audio encoder that tests/js/make_multimodal.py
    writes (transformers' save_pretrained), on `checkpoint`'s text model and tokenizer."""
    out = tmp_path_factory.mktemp("multimodal")
    subprocess.run(
        [sys.executable, str(REPO_DIR / "tests" / "js" / "make_multimodal.py"), checkpoint, out],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return str(out)


def _png(size):
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


def _wav(seconds=0.1):
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * int(16000 * seconds))
    return out.getvalue()


def _b64(data):
    import base64

    return base64.b64encode(data).decode()


def _image_part(png, detail=None):
    part = {"url": "data:image/png;base64," + _b64(png)}
    if detail:
        part["detail"] = detail
    return {"type": "image_url", "image_url": part}


def _audio_part(wav):
    return {"type": "input_audio", "input_audio": {"data": _b64(wav), "format": "wav"}}


def _chat(server, *parts, max_tokens=2):
    content = [*parts, {"type": "text", "text": "What is this?"}]
    status, text = server.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens},
    )
    return status, json.loads(text)


def _mcp_ask(server, **arguments):
    """The /mcp ask tool's result."""
    status, text = server.post(
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "ask",
                "arguments": {"prompt": "What is this?", "max_tokens": 2, **arguments},
            },
        },
    )
    assert status == 200, text
    return json.loads(text)["result"]


def test_the_python_host_takes_the_media_flags(multimodal, tmp_path):
    """--no-vision, --max-media, --max-audio-bytes and --mcp-media-dir reach the server: the
    modalities it lists, the 400s naming the flags, and the MCP tools reading files inside the
    directory only."""
    media = tmp_path / "media"
    media.mkdir()
    (media / "clip.wav").write_bytes(_wav())
    (tmp_path / "outside.wav").write_bytes(_wav())
    big = _wav(0.5)
    server = _python_host(
        multimodal,
        "--context",
        "1024",
        "--no-vision",
        "--max-media",
        "1",
        "--max-audio-bytes",
        str(len(big) - 1),
        "--mcp-media-dir",
        str(media),
    )
    try:
        models = json.loads(server.get("/v1/models")[1])
        assert models["data"][0]["modalities"] == ["text", "audio"]

        status, body = _chat(server, _image_part(_png(8)))
        assert status == 400, body
        assert body["error"]["message"] == (
            "'messages[0].content[0].image_url.url' is an image, and this server was started "
            "with --no-vision"
        )
        status, body = _chat(server, _audio_part(_wav()), _audio_part(_wav()))
        assert status == 400, body
        assert body["error"]["message"] == (
            "the request holds 2 images and audio clips, more than this server's --max-media 1"
        )
        status, body = _chat(server, _audio_part(big))
        assert status == 400, body
        assert body["error"]["message"].endswith(f"more than --max-audio-bytes {len(big) - 1}")
        status, body = _chat(server, _audio_part(_wav()))
        assert status == 200, body

        # The MCP tools read the clip inside --mcp-media-dir and nothing outside it.
        result = _mcp_ask(server, audio=["clip.wav"])
        assert result["isError"] is False, result
        assert result["structuredContent"]["prompt_tokens"] == body["usage"]["prompt_tokens"]
        result = _mcp_ask(server, audio=["../outside.wav"])
        assert result["isError"] is True
        assert result["content"][0]["text"] == (
            "'audio[0]' (../outside.wav) is outside --mcp-media-dir, the one directory this "
            "server's MCP tools read files from (relative paths are read from it)"
        )
    finally:
        server.stop()


def test_the_python_host_takes_the_image_flags(multimodal):
    """--no-audio, --image-tokens and --allow-media-urls (with --media-url-timeout) reach the
    server: audio is refused naming the flag, an image without detail gets --image-tokens' budget
    (the prompt of detail "low", 70: 64 soft tokens for this image, where the default 280 gives
    256), and an http URL is fetched."""
    import http.server
    import threading

    png = _png(64)

    class Images(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    server = _python_host(
        multimodal,
        "--context",
        "2048",
        "--no-audio",
        "--image-tokens",
        "70",
        "--allow-media-urls",
        "--media-url-timeout",
        "30",
    )
    try:
        models = json.loads(server.get("/v1/models")[1])
        assert models["data"][0]["modalities"] == ["text", "image"]
        status, body = _chat(server, _audio_part(_wav()))
        assert status == 400, body
        assert body["error"]["message"] == (
            "'messages[0].content[0].input_audio.data' is audio, and this server was started "
            "with --no-audio"
        )
        tokens = {}
        for detail in (None, "auto", "low"):
            status, body = _chat(server, _image_part(png, detail))
            assert status == 200, body
            tokens[detail] = body["usage"]["prompt_tokens"]
        assert tokens[None] == tokens["auto"] == tokens["low"], tokens
        url = f"http://127.0.0.1:{images.server_address[1]}/dot.png"
        status, body = _chat(server, {"type": "image_url", "image_url": {"url": url}})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == tokens[None]
    finally:
        server.stop()
        images.shutdown()
