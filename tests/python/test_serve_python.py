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

VOLATILE = {"id", "created", "timings"}

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
    return cli.make_tiny(
        tmp_path_factory.mktemp("served"),
        seed=8,
        dtype="bf16",
        vocab=262144,
        hidden=64,
        window=32,
        layer_types="sliding,full,sliding,full",
        shared=2,
        tokenizer=str(test_tokenizer_dir),
    )


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


def _answer(status, text):
    """JSON bodies as data, SSE streams as the list of their events."""
    if text.startswith("data:"):
        events = [e[len("data:") :].strip() for e in text.split("\n\n") if e.strip()]
        return status, [e if e == "[DONE]" else _normalise(json.loads(e)) for e in events]
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
