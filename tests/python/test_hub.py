"""torchtpu::hub::download against a fake Hub on loopback (hub_fixture.py), driven through the
hub_download_tool executable, and checked against huggingface_hub itself sharing the same cache.

The expected hashes, blob names and file contents come from the fixture (hashlib, the git and LFS
definitions); huggingface_hub is the independent reference for the cache layout.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from hub_fixture import HubFixture, Repo
from safetensors.numpy import save


def _find_built(env_var: str, pattern: str) -> str:
    """The executable named by `env_var` (CTest sets it), else the newest in a build directory."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    repo_dir = Path(__file__).resolve().parents[2]
    found = sorted(repo_dir.glob(pattern), key=lambda p: -p.stat().st_mtime)
    return str(found[0]) if found else ""


TOOL = _find_built("HUB_DOWNLOAD_TOOL", "build*/tests/hub_download_tool")
CLI = _find_built("TORCHTPU_CLI", "build*/torchtpu-cpp")
REPO = "fixture-org/tiny-gemma"
ENGINE_FILES = {
    "config.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
}
SHARD = "model-00001-of-00002.safetensors"
ENGINE_PATTERNS = sorted(ENGINE_FILES)


def shard(seed: int, n: int) -> bytes:
    rng = np.random.default_rng(seed)
    return save({f"layer{seed}.weight": rng.standard_normal((n, 64), dtype=np.float32)})


def repo_files(config_extra: dict | None = None) -> dict[str, bytes]:
    config = {"model_type": "gemma4_text", "hidden_size": 64, **(config_extra or {})}
    index = {
        "metadata": {},
        "weight_map": {
            "layer1.weight": "model-00001-of-00002.safetensors",
            "layer2.weight": "model-00002-of-00002.safetensors",
        },
    }
    return {
        "config.json": json.dumps(config).encode(),
        "generation_config.json": b'{"eos_token_id": [1, 106]}',
        "chat_template.jinja": b"{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": b'{"bos_token": "<bos>"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001-of-00002.safetensors": shard(1, 2048),  # 512 kB
        "model-00002-of-00002.safetensors": shard(2, 512),
        "README.md": b"# tiny\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "onnx/model.onnx": b"\x08\x07" * 1000,
    }


@pytest.fixture
def hub():
    fixture = HubFixture()
    fixture.add(Repo(REPO, {"main": repo_files(), "v1": repo_files({"hidden_size": 32})}))
    fixture.add(Repo("fixture-org/gated", {"main": repo_files()}, gated=True))
    fixture.add(Repo("fixture-org/private", {"main": repo_files()}, private=True))
    yield fixture
    fixture.close()


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "hub-cache"


def hub_env(hub: HubFixture, cache: Path, token: str | None = None, **extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_"))
    }
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_CACHE=str(cache),
        HF_HOME=str(cache.parent / "hf-home"),
        HF_HUB_DISABLE_XET="1",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    env.update(extra)
    return env


def run_tool(hub, cache, repo=REPO, revision="main", *include, token=None, **extra):
    assert TOOL, "build hub_download_tool, or point HUB_DOWNLOAD_TOOL at it"
    return subprocess.run(
        [TOOL, repo, revision, *include],
        env=hub_env(hub, cache, token, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def download_ok(hub, cache, *args, **kwargs) -> Path:
    r = run_tool(hub, cache, *args, **kwargs)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def storage(cache: Path, repo: str = REPO) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def resolve_and_cdn_requests(hub):
    return [r for r in hub.log() if r.server == "cdn" or "/resolve/" in r.path]


def python_hub(hub, cache, script: str, **extra: str) -> str:
    """Runs huggingface_hub in a fresh interpreter (it reads its environment at import)."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=hub_env(hub, cache, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# --- downloads ---


def test_fresh_download_lays_out_the_huggingface_cache(hub, cache):
    snap = download_ok(hub, cache)
    commit = hub.repos[REPO].refs["main"]
    assert snap == storage(cache) / "snapshots" / commit.sha
    assert (storage(cache) / "refs" / "main").read_text() == commit.sha
    present = {str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir()}
    assert present == ENGINE_FILES
    for name in ENGINE_FILES:
        f = commit.files[name]
        link = snap / name
        assert link.is_symlink()
        assert os.readlink(link) == f"../../blobs/{f.etag}"
        assert link.read_bytes() == f.content
    assert commit.files[SHARD].etag == commit.files[SHARD].sha256  # LFS: named by sha256
    assert commit.files["config.json"].etag == commit.files["config.json"].blob_id  # git sha1
    assert not list((storage(cache) / "blobs").glob("*.incomplete"))
    assert (cache / ".locks" / storage(cache).name / f"{commit.files[SHARD].etag}.lock").exists()


def test_second_run_transfers_nothing(hub, cache):
    first = download_ok(hub, cache)
    hub.clear_log()
    assert download_ok(hub, cache) == first
    assert resolve_and_cdn_requests(hub) == []
    assert all(r.path.startswith("/api/models/") for r in hub.log())
    hub.clear_log()
    commit = hub.repos[REPO].refs["main"].sha
    assert download_ok(hub, cache, REPO, commit) == first  # a commit never moves: no request
    assert hub.log() == []


def test_tag_revision_gets_its_own_snapshot_and_ref(hub, cache):
    v1 = hub.repos[REPO].refs["v1"]
    snap = download_ok(hub, cache, REPO, "v1")
    assert snap.name == v1.sha
    assert (storage(cache) / "refs" / "v1").read_text() == v1.sha
    assert json.loads((snap / "config.json").read_text())["hidden_size"] == 32


def test_include_globs_restrict_the_engine_files(hub, cache):
    snap = download_ok(hub, cache, REPO, "main", "*.json", "README.md")
    present = {p.name for p in snap.iterdir()}
    assert present == {n for n in ENGINE_FILES if n.endswith(".json")}
    r = run_tool(hub, cache, REPO, "main", "*.md")
    assert r.returncode == 2 and "NotFoundError" in r.stderr and "README.md" in r.stderr


def test_tree_api_is_used_when_the_server_ignores_blobs(hub, cache):
    hub.honour_blobs = False
    hub.tree_page_size = 3
    snap = download_ok(hub, cache)
    assert {p.name for p in snap.iterdir()} == ENGINE_FILES
    tree_pages = [r for r in hub.log() if "/tree/" in r.path]
    assert len(tree_pages) > 3 and any("cursor" in r.query for r in tree_pages)


# --- resume, integrity, disk ---


def test_cut_connection_resumes_with_a_range_request(hub, cache):
    hub.faults.cut_once.add(SHARD)
    snap = download_ok(hub, cache)
    f = hub.repos[REPO].refs["main"].files[SHARD]
    assert (snap / SHARD).read_bytes() == f.content
    gets = [r for r in hub.log("cdn") if r.path.endswith(f.sha256)]
    assert [r.headers.get("range") for r in gets] == [
        None,
        f"bytes={len(f.content) // 2}-",
    ]


def test_interrupted_download_resumes_on_the_next_run(hub, cache):
    f = hub.repos[REPO].refs["main"].files[SHARD]
    cut = 100_000
    hub.faults.cut_at[SHARD] = cut
    r = run_tool(hub, cache)
    assert r.returncode == 5, r.stderr
    assert "UpstreamError" in r.stderr and "interrupted" in r.stderr and "next run resumes" in r.stderr
    partial = storage(cache) / "blobs" / f"{f.sha256}.incomplete"
    assert partial.stat().st_size == cut

    del hub.faults.cut_at[SHARD]
    hub.clear_log()
    snap = download_ok(hub, cache)
    assert (snap / SHARD).read_bytes() == f.content
    gets = [r for r in hub.log("cdn") if r.path.endswith(f.sha256)]
    assert [r.headers.get("range") for r in gets] == [f"bytes={cut}-"]
    assert not partial.exists()


def test_corrupted_transfer_is_caught_by_its_hash_and_fetched_again(hub, cache):
    hub.faults.corrupt_once.add(SHARD)
    snap = download_ok(hub, cache)
    f = hub.repos[REPO].refs["main"].files[SHARD]
    assert (snap / SHARD).read_bytes() == f.content
    assert len([r for r in hub.log("cdn") if r.path.endswith(f.sha256)]) == 2


def test_concurrent_downloads_fetch_each_blob_once(hub, cache):
    hub.cdn_delay_s = 0.3
    env = hub_env(hub, cache)
    procs = [
        subprocess.Popen(
            [TOOL, REPO, "main"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert outs[0][0] == outs[1][0]
    commit = hub.repos[REPO].refs["main"]
    for f in commit.files.values():
        if f.path in ENGINE_FILES and f.lfs:
            assert len([r for r in hub.log("cdn") if r.path.endswith(f.sha256)]) == 1, f.path
    snap = Path(outs[0][0].strip())
    assert all((snap / n).read_bytes() == commit.files[n].content for n in ENGINE_FILES)


def test_damaged_cached_blob_is_verified_and_fetched_again(hub, cache):
    snap = download_ok(hub, cache)
    f = hub.repos[REPO].refs["main"].files[SHARD]
    blob = storage(cache) / "blobs" / f.sha256
    damaged = bytearray(blob.read_bytes())
    damaged[100] ^= 0xFF
    blob.write_bytes(bytes(damaged))
    (snap / SHARD).unlink()  # a new snapshot that shares the blob links it again
    hub.clear_log()
    assert download_ok(hub, cache) == snap
    assert (snap / SHARD).read_bytes() == f.content
    assert len([r for r in hub.log("cdn") if r.path.endswith(f.sha256)]) == 1


@pytest.mark.parametrize("name, digest", [(SHARD, "sha256"), ("config.json", "git blob sha1")])
def test_persistent_corruption_is_reported_and_nothing_stored(hub, cache, name, digest):
    hub.faults.corrupt_always.add(name)
    r = run_tool(hub, cache)
    assert r.returncode == 4, r.stderr
    assert "FormatError" in r.stderr and name in r.stderr and digest in r.stderr
    f = hub.repos[REPO].refs["main"].files[name]
    assert not (storage(cache) / "blobs" / f.etag).exists()
    assert not (storage(cache) / "snapshots" / hub.repos[REPO].refs["main"].sha / name).exists()


def test_disk_full_is_named(hub, cache):
    f = hub.repos[REPO].refs["main"].files[SHARD]
    blobs = storage(cache) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{f.sha256}.incomplete").symlink_to("/dev/full")  # every write fails with ENOSPC
    r = run_tool(hub, cache)
    assert r.returncode == 1
    assert "disk full" in r.stderr and SHARD in r.stderr


# --- tokens, redirects, errors ---


def test_redirect_to_another_host_drops_the_token(hub, cache):
    download_ok(hub, cache, "fixture-org/gated", token=hub.token)
    hub_requests, cdn_requests = hub.log("hub"), hub.log("cdn")
    assert cdn_requests, "LFS files should have come from the CDN host"
    assert all(r.authorization == f"Bearer {hub.token}" for r in hub_requests)
    assert all(r.authorization is None for r in cdn_requests)


def test_gated_repo_without_token_says_how_to_get_access(hub, cache):
    r = run_tool(hub, cache, "fixture-org/gated")
    assert r.returncode == 5
    assert "UpstreamError" in r.stderr and "HF_TOKEN" in r.stderr and "licence" in r.stderr
    assert f"{hub.url}/fixture-org/gated" in r.stderr and "401" in r.stderr


def test_gated_repo_with_refused_token(hub, cache):
    r = run_tool(hub, cache, "fixture-org/gated", token="hf_not_accepted")
    assert r.returncode == 5 and "UpstreamError" in r.stderr
    assert "403" in r.stderr and "refused" in r.stderr and "licence" in r.stderr


def test_unknown_repo_is_not_found(hub, cache):
    r = run_tool(hub, cache, "fixture-org/nope", token=hub.token)
    assert r.returncode == 2
    assert "NotFoundError" in r.stderr and "'fixture-org/nope' not found" in r.stderr
    assert "404" in r.stderr


def test_private_repo_without_token_is_not_found_with_a_token_hint(hub, cache):
    hub.missing_repo_status = 401
    r = run_tool(hub, cache, "fixture-org/private")
    assert r.returncode == 2
    assert "401" in r.stderr and "HF_TOKEN" in r.stderr
    assert download_ok(hub, cache, "fixture-org/private", token=hub.token).is_dir()


def test_unknown_revision_is_named(hub, cache):
    r = run_tool(hub, cache, REPO, "no-such-branch")
    assert r.returncode == 2
    assert "revision 'no-such-branch' not found" in r.stderr


def test_malformed_id_is_a_value_error(hub, cache):
    r = run_tool(hub, cache, "org/../etc")
    assert r.returncode == 3 and "ValueError" in r.stderr
    assert hub.log() == []


# --- offline ---


def test_offline_without_cache_names_hf_hub_offline(hub, cache):
    r = run_tool(hub, cache, HF_HUB_OFFLINE="1")
    assert r.returncode == 2
    assert "HF_HUB_OFFLINE" in r.stderr and "nothing of" in r.stderr
    assert hub.log() == []


def test_offline_with_cache_uses_it_without_network(hub, cache):
    snap = download_ok(hub, cache)
    hub.clear_log()
    assert download_ok(hub, cache, HF_HUB_OFFLINE="1") == snap
    assert hub.log() == []


def test_offline_with_partial_cache_names_what_is_missing(hub, cache):
    download_ok(hub, cache, REPO, "main", "config.json")
    r = run_tool(hub, cache, HF_HUB_OFFLINE="1")
    assert r.returncode == 2 and "lacks" in r.stderr and SHARD in r.stderr


def test_unreachable_hub_falls_back_to_the_cache(hub, cache):
    snap = download_ok(hub, cache)
    r = run_tool(hub, cache, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens on port 9
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == snap and "cached snapshot" in r.stderr


def test_unreachable_hub_without_the_cache_is_an_upstream_error(hub, cache):
    r = run_tool(hub, cache, HF_ENDPOINT="http://127.0.0.1:9")
    assert r.returncode == 5, r.stderr
    assert "UpstreamError: cannot reach the Hub at http://127.0.0.1:9" in r.stderr
    assert "nothing of" in r.stderr


# --- the command line ---


def test_cli_download_prints_the_snapshot_dir(hub, cache):
    assert CLI, "build torchtpu-cpp, or point TORCHTPU_CLI at it"
    r = subprocess.run(
        [CLI, "download", f"{REPO}@v1", "--include", "*.json"],
        env=hub_env(hub, cache),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    snap = Path(r.stdout.strip())
    assert snap == storage(cache) / "snapshots" / hub.repos[REPO].refs["v1"].sha
    assert {p.name for p in snap.iterdir()} == {n for n in ENGINE_FILES if n.endswith(".json")}
    r = subprocess.run(
        [CLI, "download", "fixture-org/nope"],
        env=hub_env(hub, cache),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode != 0 and "'fixture-org/nope' not found" in r.stderr and r.stdout == ""
    r = subprocess.run(
        [CLI, "download", f"{REPO}@"],
        env=hub_env(hub, cache),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and f"'{REPO}@' names no revision after '@'" in r.stderr, r.stderr


def _serve(env, *args):
    """`torchtpu-cpp serve` on a free port: the process and its URL once /health answers 200."""
    proc = subprocess.Popen(
        [CLI, "serve", "--port", "0", *args],
        env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("serving "), line + proc.stderr.read()
    url = line.split()[-1]
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health") as r:
                if r.status == 200:
                    return proc, url
        except urllib.error.URLError:
            pass
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.2)


def _post(url, path, body):
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _stop(proc):
    proc.terminate()
    proc.wait(timeout=60)


def test_cli_serve_takes_hub_ids_for_the_model_and_its_adapters(hub, cache, tmp_path):
    """`serve --model org/name` (and `--lora NAME=org/name`, and /v1/load_lora_adapter's
    lora_path) download into the Hub cache and serve from it, as `generate --model` does; the
    adapter from the Hub gives PEFT's tokens; offline, a second start needs no network."""
    assert CLI, "build torchtpu-cpp, or point TORCHTPU_CLI at it"
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    proc, _ = _serve({**os.environ, **xdg})  # writes the demo checkpoint
    _stop(proc)
    demo = tmp_path / "xdg" / "torchtpu-cpp" / "demo-v1"
    adapters = tmp_path / "adapters"
    make_lora = Path(__file__).resolve().parents[1] / "js" / "make_lora.py"
    subprocess.run([sys.executable, str(make_lora), str(demo), str(adapters)], check=True)
    expected = json.loads((adapters / "expected.json").read_text())

    def files(directory):
        return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}

    hub.add(Repo("fixture-org/demo", {"main": files(demo)}))
    for name in ("first", "second"):
        hub.add(Repo(f"fixture-org/demo-{name}", {"main": files(adapters / name)}))
    env = hub_env(hub, cache, **xdg)
    proc, url = _serve(
        env, "--model", "fixture-org/demo", "--lora", "first=fixture-org/demo-first",
        "--runtime-lora", "--dtype", "float32", "--lora-init-without-apply",
    )
    try:
        with urllib.request.urlopen(url + "/v1/models") as r:
            models = json.load(r)["data"]
        assert [m["id"] for m in models] == ["fixture-org/demo", "first"]
        assert models[1]["root"] == str(storage(cache, "fixture-org/demo-first") / "snapshots" /
                                        hub.repos["fixture-org/demo-first"].refs["main"].sha)

        def complete(model):
            status, text = _post(url, "/v1/completions", {
                "model": model, "prompt": expected["prompt"], "temperature": 0,
                "max_tokens": len(expected["tokens"]), "ignore_eos": True,
            })
            assert status == 200, text
            return json.loads(text)["choices"][0]["text"]

        def text_of(tokens):
            return json.loads(_post(url, "/detokenize", {"tokens": tokens})[1])["content"]

        assert complete("first") == text_of(expected["tokens"])
        assert complete("fixture-org/demo") == text_of(expected["base_tokens"])
        status, text = _post(url, "/v1/load_lora_adapter",
                             {"lora_name": "second", "lora_path": "fixture-org/demo-second"})
        assert (status, text) == (200, "Success: LoRA adapter 'second' added successfully.")
        assert complete("second") not in (complete("first"), complete("fixture-org/demo"))
        status, text = _post(url, "/v1/load_lora_adapter",
                             {"lora_name": "third", "lora_path": "fixture-org/nope"})
        assert status == 404 and json.loads(text)["error"]["param"] == "lora_path", text
        assert "'fixture-org/nope' not found" in text
    finally:
        _stop(proc)
    # From the cache alone.
    requests = len(hub.log())
    proc, url = _serve({**env, "HF_HUB_OFFLINE": "1"}, "--model", "fixture-org/demo", "--lora",
                       "first=fixture-org/demo-first", "--dtype", "float32")
    _stop(proc)
    assert len(hub.log()) == requests


# --- progress ---


def test_progress_is_plain_lines_off_a_terminal(hub, cache):
    r = run_tool(hub, cache)
    assert r.returncode == 0
    assert f"downloading {SHARD}" in r.stderr and "\r" not in r.stderr
    assert r.stdout.count("\n") == 1  # stdout holds only the snapshot directory


def test_progress_is_a_bar_on_a_terminal(hub, cache):
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [TOOL, REPO, "main"],
        env=hub_env(hub, cache),
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    out = io.BytesIO()
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        out.write(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(controller)
    text = out.getvalue().decode()
    assert "\r" in text and "100%" in text and SHARD in text


# --- the cache is shared with huggingface_hub ---


def test_huggingface_hub_finds_what_we_downloaded(hub, cache):
    snap = download_ok(hub, cache)
    hub.clear_log()
    out = python_hub(
        hub,
        cache,
        f"""
        import json
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import IncompleteSnapshotError
        snap = snapshot_download({REPO!r}, local_files_only=True,
                                 allow_patterns={ENGINE_PATTERNS!r})
        config = hf_hub_download({REPO!r}, "config.json", local_files_only=True)
        shard = hf_hub_download({REPO!r}, {SHARD!r}, local_files_only=True)
        try:  # our tree listing tells it that README.md etc. were not fetched
            snapshot_download({REPO!r}, local_files_only=True)
            complete = True
        except IncompleteSnapshotError:
            complete = False
        print(json.dumps([snap, config, shard, complete]))
    """,
        HF_HUB_OFFLINE="1",
    )
    snap_py, config, shard_path, complete = json.loads(out)
    assert Path(snap_py) == snap.resolve() or Path(snap_py).resolve() == snap.resolve()
    assert Path(config).parent.resolve() == snap.resolve()
    assert Path(shard_path).read_bytes() == hub.repos[REPO].refs["main"].files[SHARD].content
    assert complete is False
    assert hub.log() == []


def test_huggingface_hub_online_reuses_our_blobs(hub, cache):
    download_ok(hub, cache)
    hub.clear_log()
    python_hub(
        hub,
        cache,
        f"""
        from huggingface_hub import snapshot_download
        print(snapshot_download({REPO!r}, allow_patterns={ENGINE_PATTERNS!r}))
    """,
    )
    assert hub.log("cdn") == []
    assert not [r for r in hub.log() if r.method == "GET" and "/resolve/" in r.path]


def test_we_find_what_huggingface_hub_downloaded(hub, cache):
    out = python_hub(
        hub,
        cache,
        f"""
        from huggingface_hub import snapshot_download
        print(snapshot_download({REPO!r}, allow_patterns={ENGINE_PATTERNS!r}))
    """,
    )
    assert hub.log("cdn"), "huggingface_hub should have fetched LFS files from the CDN host"
    hub.clear_log()
    snap = download_ok(hub, cache, HF_HUB_OFFLINE="1")
    assert snap.resolve() == Path(out).resolve()
    assert hub.log() == []
    assert download_ok(hub, cache).resolve() == Path(out).resolve()
    assert resolve_and_cdn_requests(hub) == []
