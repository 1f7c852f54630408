"""The Cloud TPU rig, checked offline: a stand-in `gcloud` (tests/rig/bin/gcloud) records every
argument vector and answers with canned resources; the startup script runs for real with its
Google-Cloud and TPU parts replaced (guest attributes as files, the Hub by tests/python's fake
Hub on loopback, device cpu). The `slow` test installs the pinned pip spec (PyPI's wheels, through
the project's wheelhouse) and builds the module on "boot"."""

import asyncio
import base64
import fcntl
import http.server
import io
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import tomllib
from pathlib import Path

import pytest
from hub_fixture import HubFixture, Repo

REPO = Path(__file__).resolve().parents[2]
RIG = REPO / "rig" / "rig"
FAKE_BIN = REPO / "tests" / "rig" / "bin"
FAKE_VM_BIN = REPO / "tests" / "rig" / "vm-bin"
PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
METADATA_VALUE_LIMIT = 256 * 1024  # Compute Engine: one metadata value is at most 256 KiB
METADATA_TOTAL_LIMIT = 512_000  # all keys and values "less than 512 KB"
# setup.sh downloads torch's wheels here once; the boot test adds what else its spec needs.
WHEELS = REPO / ".cache" / "wheels"
STAGES = ["python", "torch", "toolchain", "build", "weights", "smoke", "unit", "serving"]


class FakeCloud:
    def __init__(self, root: Path):
        self.root = root
        self.log = root / "gcloud.jsonl"
        self.state_file = root / "gcloud-state.json"
        self.state = {}

    def env(self) -> dict:
        env = dict(os.environ)
        env["PATH"] = f"{FAKE_BIN}{os.pathsep}{env['PATH']}"
        env["FAKE_GCLOUD_LOG"] = str(self.log)
        env["FAKE_GCLOUD_STATE"] = str(self.state_file)
        env.pop("RIG_ENV", None)
        return env

    def rig(self, *args: str, check: bool = True, rig: Path = RIG) -> subprocess.CompletedProcess:
        self.state_file.write_text(json.dumps(self.state))
        proc = subprocess.run(
            [sys.executable, str(rig), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def cloud(tmp_path) -> FakeCloud:
    return FakeCloud(tmp_path)


def source_keys(script: str) -> list[str]:
    return bash_values(script, ["RIG_SOURCE_KEYS"])["RIG_SOURCE_KEYS"]


def payload_of(metadata: dict[str, str]) -> dict[str, bytes]:
    """The files of the source tarball carried in the metadata values the script names."""
    keys = source_keys(metadata["startup-script"])
    text = "".join(metadata[k] for k in keys).replace("\n", "")
    tar_bytes = lzma.decompress(base64.b85decode(text))
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def bash_values(script: str, names: list[str]) -> dict[str, list[str]]:
    """What bash makes of the rendered settings block: each name's words."""
    block = script.split("# ---- settings from tpu.env (rendered) ----\n", 1)[1]
    block = block.split("# ---- runner ----", 1)[0]
    printer = "".join(f'printf "%s\\0" "${{{n}[@]}}"; printf "\\1"; ' for n in names)
    out = subprocess.run(
        ["bash", "-c", f"set -eu\n{block}\n{printer}"], capture_output=True, check=True
    ).stdout.decode()
    groups = out.split("\1")[:-1]
    return {n: g.split("\0")[:-1] for n, g in zip(names, groups)}


def write_env(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_create_requests_flex_start_queued_resource_with_the_rendered_script(cloud):
    cloud.rig("--set", "PROJECT=my-proj-123", "create")

    (call,) = cloud.calls()
    argv = call["argv"]
    script_arg = next(a for a in argv if a.startswith("--metadata-from-file="))
    keys = [pair.split("=", 1)[0] for pair in script_arg.split("=", 1)[1].split(",")]
    assert keys == sorted(call["files"]) and "startup-script" in keys
    assert argv == [
        "alpha",
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "torchtpu-cpp-qr",
        "--node-id=torchtpu-cpp-vm",
        "--zone=us-west4-a",
        "--accelerator-type=v5litepod-1",
        "--runtime-version=v2-alpha-tpuv5-lite",
        "--network=default",
        "--tags=torchtpu-cpp-serve",
        "--metadata=enable-guest-attributes=TRUE",
        script_arg,
        "--description=torchtpu-cpp: Gemma 4 E2B over ATen on TorchTPU",
        "--provisioning-model=flex-start",
        "--max-run-duration=8h",
        "--project=my-proj-123",
        "--quiet",
    ]
    script = call["files"]["startup-script"]
    assert script.startswith("#!/bin/bash\n")
    assert sorted(source_keys(script) + ["startup-script"]) == keys
    sizes = {k: len(v.encode()) for k, v in call["files"].items()}
    assert max(sizes.values()) <= METADATA_VALUE_LIMIT
    total = sum(sizes.values()) + sum(len(k) for k in sizes) + len("enable-guest-attributesTRUE")
    assert total < METADATA_TOTAL_LIMIT

    # The payload is HEAD's tree minus PACK_EXCLUDE's default patterns, byte for byte.
    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, check=True).stdout

    # The commit the script names (HEAD may have moved on since, other work goes on in this tree).
    head = re.search(r"^RIG_REVISION=([0-9a-f]{12})$", script, re.M).group(1)
    git("merge-base", "--is-ancestor", head, "HEAD")
    left_out = ("bench/", "docs/", "scripts/", "tests/", "rig/", "deploy/", "src/cli/", ".ci/")
    test_data = ("data/gemma4/rendered_examples", "data/gemma4/chat_template.")
    unread = ("data/gemma4/README.md", "data/gemma4/SOURCES.md", "cmake/GtestSuites.cmake",
              "cmake/JsSuites.cmake", ".clang-format")
    expected = []
    for entry in git("ls-tree", "-r", "-z", "HEAD").decode().split("\0"):
        meta, _, path = entry.partition("\t")
        kept = (
            not path.startswith(left_out)
            and path not in unread
            and (not path.startswith(test_data) or path == "data/gemma4/chat_template.jinja")
        )
        if meta.split(" ")[0] in ("100644", "100755") and kept:
            expected.append(path)
    expected.sort()
    packed = payload_of(call["files"])
    assert sorted(packed) == expected
    assert all(packed[p] == git("show", f"{head}:{p}") for p in expected)
    assert "pyproject.toml" in packed and "CMakeLists.txt" in packed
    assert "data/gemma4/chat_template.jinja" in packed  # the build embeds it

    with_defaults = bash_values(script, ["TORCH_PIP_SPEC", "PYTHON_VERSION", "SERVE_CONTEXT"])
    assert with_defaults == {
        "TORCH_PIP_SPEC": ["torch==2.14.1", "torch_tpu==0.2.0", "huggingface_hub"],
        "PYTHON_VERSION": ["3.12"],
        "SERVE_CONTEXT": ["8192"],
    }


def test_spot_uses_the_ga_track_and_no_project_flag_when_unset(cloud):
    cloud.rig("--set", "PROVISIONING=spot", "create")
    argv = cloud.calls()[0]["argv"]
    assert argv[:4] == ["compute", "tpus", "queued-resources", "create"]
    assert "--spot" in argv
    assert not any(a.startswith(("--project", "--provisioning-model", "--max-run")) for a in argv)


def test_rendered_script_is_valid_bash_and_passes_shellcheck(tmp_path, cloud):
    out = tmp_path / "metadata" / "startup-script"
    proc = cloud.rig("render", "--out", str(out.parent))
    assert str(METADATA_TOTAL_LIMIT) in proc.stdout
    subprocess.run(["bash", "-n", str(out)], check=True)
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is part of the toolchain (scripts/setup.sh installs it)"
    lint = subprocess.run(
        [shellcheck, "--severity=style", str(out)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout
    assert cloud.calls() == []


def repo_with_random_file(tmp_path: Path, size: int) -> Path:
    """A git checkout of rig/ plus big.bin, `size` random bytes (which do not compress)."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "rig", repo / "rig", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "big.bin").write_bytes(os.urandom(size))
    for cmd in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def test_oversized_source_is_refused_before_any_gcloud_call(tmp_path, cloud):
    repo = repo_with_random_file(tmp_path, 400 * 1024)  # base85: about 512 KB
    proc = subprocess.run(
        [sys.executable, str(repo / "rig" / "rig"), "create"],
        env=cloud.env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert f"not under Compute Engine's limit of {METADATA_TOTAL_LIMIT} bytes" in proc.stderr
    assert "big.bin (409600 B)" in proc.stderr
    assert "PACK_EXCLUDE" in proc.stderr
    assert cloud.calls() == []


def test_a_source_over_one_value_is_split_and_reassembled_by_the_script(tmp_path, cloud):
    repo = repo_with_random_file(tmp_path, 250 * 1024)  # base85: about 320 KB, two values
    big = (repo / "big.bin").read_bytes()
    cloud.rig("create", rig=repo / "rig" / "rig")
    (call,) = cloud.calls()
    files = call["files"]
    assert source_keys(files["startup-script"]) == ["rig-source-0", "rig-source-1"]
    assert all(len(v.encode()) <= METADATA_VALUE_LIMIT for v in files.values())
    assert payload_of(files)["big.bin"] == big

    # The script's own reader, over the values as files (RIG_METADATA_DIR) and through the python
    # stage's venv interpreter, gives the tarball whose SHA-256 the script names.
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    venv_bin = tmp_path / "root" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to(sys.executable)
    for key, value in files.items():
        (metadata / key).write_text(value)
    script = files["startup-script"]
    assert script.endswith('\nmain "$@"\n')
    functions = script[: -len('main "$@"\n')]
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'{functions}\nrig_payload | sha256sum -c <(echo "$RIG_PAYLOAD_SHA256  -")',
        ],
        env=dict(os.environ, RIG_METADATA_DIR=str(metadata), RIG_ROOT=str(tmp_path / "root")),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "-: OK"


def test_values_with_spaces_and_quotes_stay_single_arguments(tmp_path, cloud):
    description = """Gemma "4" isn't $HOME; `rm -rf /` & echo hi"""
    env = write_env(
        tmp_path / "odd.env",
        "\n".join(
            [
                "DESCRIPTION='Gemma \"4\" isn'\"'\"'t $HOME; `rm -rf /` & echo hi'",
                "TORCH_PIP_SPEC=\"torch==2.14.1 'jinja2>=3.1' 'name with space'\"",
                "UNIT_PYTEST_ARGS=\"tests/python -k 'not slow and not (a or b)'\"",
                'FIREWALL_SOURCE_RANGES="203.0.113.7/32 198.51.100.0/24"',
                "MODEL_ID=org/model.v1  # a comment after the value",
                "",
            ]
        ),
    )
    cloud.rig("--env", env, "create")
    cloud.rig("--env", env, "firewall")

    create, fw_describe, fw_create = cloud.calls()
    assert f"--description={description}" in create["argv"]
    values = bash_values(
        create["files"]["startup-script"], ["TORCH_PIP_SPEC", "UNIT_PYTEST_ARGS", "MODEL_ID"]
    )
    assert values == {
        "TORCH_PIP_SPEC": ["torch==2.14.1", "jinja2>=3.1", "name with space"],
        "UNIT_PYTEST_ARGS": ["tests/python", "-k", "not slow and not (a or b)"],
        "MODEL_ID": ["org/model.v1"],
    }
    assert "--source-ranges=203.0.113.7/32,198.51.100.0/24" in fw_create["argv"]


HOSTILE = """it's "quoted" $(touch {pwned}) `touch {pwned}` ${{HOME}} 100% \\ back"""


def test_values_reaching_the_vm_shell_are_never_run(tmp_path, cloud):
    """Settings that the startup script hands to bash stay literal words: a command substitution
    in them is text, not something the VM runs."""
    pwned = tmp_path / "pwned"
    hostile = HOSTILE.format(pwned=pwned)
    env = write_env(
        tmp_path / "hostile.env",
        "\n".join(
            [
                f"DESCRIPTION={shlex.quote(hostile)}",
                f"TORCH_PIP_SPEC={shlex.quote(shlex.join(['torch==2.14.1', hostile]))}",
                f"UNIT_PYTEST_ARGS={shlex.quote(shlex.join(['-k', hostile]))}",
                f"PIP_INDEX_ARGS={shlex.quote(shlex.join(['--index-url', hostile]))}",
                "",
            ]
        ),
    )
    script = tmp_path / "metadata" / "startup-script"
    cloud.rig("--env", env, "render", "--out", str(script.parent))
    cloud.rig("--env", env, "create")
    names = ["TORCH_PIP_SPEC", "UNIT_PYTEST_ARGS", "PIP_INDEX_ARGS"]
    assert bash_values(script.read_text(), names) == {
        "TORCH_PIP_SPEC": ["torch==2.14.1", hostile],
        "UNIT_PYTEST_ARGS": ["-k", hostile],
        "PIP_INDEX_ARGS": ["--index-url", hostile],
    }
    (create,) = cloud.calls()
    assert f"--description={hostile}" in create["argv"]
    assert not pwned.exists()


def systemd_words(line: str) -> list[str]:
    """An ExecStart= value split the way systemd does for double-quoted words (systemd.syntax(7)
    and systemd.service(5), "Command lines"): backslash escapes, then $$ -> $ and %% -> %."""
    words = []
    for quoted in re.findall(r'"((?:[^"\\]|\\.)*)"|(\S+)', line):
        word = quoted[0] if quoted[0] or not quoted[1] else quoted[1]
        word = re.sub(r"\\(.)", r"\1", word)
        words.append(word.replace("$$", "$").replace("%%", "%"))
    return words


def test_demo_install_quotes_hostile_values_into_the_unit_and_the_mcp_config(tmp_path):
    pwned = tmp_path / "pwned"
    hostile = HOSTILE.format(pwned=pwned)
    bin_dir = tmp_path / "a dir, 100% spaces"
    bin_dir.mkdir()
    binary = bin_dir / "torchtpu-cpp"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    proc = subprocess.run(
        [
            REPO / "rig" / "demo" / "install.sh",
            "--dry-run",
            "--binary",
            str(binary),
            "--upstream-cmd",
            hostile,
            "--name",
            "demo.1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    unit, config = proc.stdout.split("\nMCP client configuration (stdio):\n")
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert systemd_words(exec_start.removeprefix("ExecStart=")) == [
        str(binary),
        "proxy",
        "--host",
        "127.0.0.1",
        "--port",
        "8015",
        "--upstream-cmd",
        hostile,
    ]
    unit_file = tmp_path / "demo.1.service"
    unit_file.write_text(unit.split("\n", 1)[1])
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit_file)],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    mcp = json.loads(config.split("\nStreamable HTTP:")[0])
    assert mcp["mcpServers"]["demo.1"]["command"] == str(binary)
    assert not pwned.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--name", "a b"], "--name may hold only letters"),
        (["--name", "../../evil"], "--name may hold only letters"),
        (["--binary", "$(touch pwned)/torchtpu-cpp"], "systemd cannot start an executable"),
        (["--binary", 'a "quoted" dir/torchtpu-cpp'], "systemd cannot start an executable"),
        (
            ["--upstream-cmd", "echo x\nExecStartPre=/bin/sh -c 'touch /tmp/pwned'"],
            "may not hold control characters",
        ),
    ],
)
def test_demo_install_refuses_values_it_cannot_quote(tmp_path, args, message):
    binary = tmp_path / (args[1] if args[0] == "--binary" else "torchtpu-cpp")
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    args = args[2:] if args[0] == "--binary" else args
    base = ["--dry-run", "--binary", str(binary)]
    if "--upstream-cmd" not in args:
        base += ["--upstream", "http://127.0.0.1:8000"]
    proc = subprocess.run(
        [REPO / "rig" / "demo" / "install.sh", *base, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "ExecStart" not in proc.stdout
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "line, message",
    [
        ("ZONE='us west4-a'", "ZONE (from "),
        ("NODE_ID=Bad_Name", "'Bad_Name' is not a valid value"),
        ("PORT=70000", "70000 is not a TCP port"),
        ("FIREWALL_SOURCE_RANGES=10.0.0.1/8", "has host bits set"),
        ("NO_SUCH_SETTING=1", "unknown setting NO_SUCH_SETTING"),
        ("DESCRIPTION=two words", "must be quoted as one word"),
        ("DESCRIPTION='unbalanced", "No closing quotation"),
        ("SERVE_API_KEY=short", "'short' is not a valid value"),
        ("SERVE_API_KEY='sk-0123456789abcdef$(touch x)'", "is not a valid value"),
    ],
)
def test_bad_settings_are_refused_with_file_and_key(tmp_path, cloud, line, message):
    env = write_env(tmp_path / "bad.env", line + "\n")
    proc = cloud.rig("--env", env, "create", check=False)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert proc.stderr.startswith("rig: error: ")
    assert cloud.calls() == []


def stage_attr(
    state: str, start: int, end: int | None = None, code: int | None = None, tail: str = ""
) -> str:
    lines = [f"state={state}", f"start={start}"]
    lines += [f"end={end}"] if end is not None else []
    lines += [f"exit={code}"] if code is not None else []
    return "\n".join(lines) + (f"\n\n{tail}" if tail else "")


def test_progress_reads_running_done_and_failed_stages(cloud):
    ns = "torchtpu-rig"
    cloud.state["guest_attributes"] = [
        {
            "namespace": ns,
            "key": "python",
            "value": stage_attr("done", 1000, 1042, None, "Python 3.12.12"),
            "worker_id": 0,
        },
        {
            "namespace": ns,
            "key": "torch",
            "value": stage_attr("done", 1042, 1157, None, "torch 2.14.1+cpu\ntorch_tpu 0.2.0"),
        },
        {
            "namespace": ns,
            "key": "toolchain",
            "value": stage_attr(
                "failed", 1157, 1164, 100, "Reading package lists...\nE: Unable to locate package x"
            ),
        },
        {"namespace": "other", "key": "build", "value": "state=done\nstart=1"},
    ]
    stages = json.loads(cloud.rig("progress", "--json").stdout)
    by_name = {s["stage"]: s for s in stages}
    assert [s["stage"] for s in stages] == STAGES
    assert by_name["python"]["state"] == "done" and by_name["python"]["seconds"] == 42
    assert by_name["torch"]["seconds"] == 115
    assert by_name["toolchain"]["state"] == "failed" and by_name["toolchain"]["exit"] == 100
    assert by_name["build"]["state"] == "pending"  # the other namespace is not ours

    text = cloud.rig("progress").stdout
    assert re.search(r"^python\s+done\s+0:42$", text, re.M)
    assert re.search(r"^torch\s+done\s+1:55$", text, re.M)
    assert "    | torch_tpu 0.2.0" in text
    assert re.search(r"^toolchain\s+failed\s+0:07  exit 100$", text, re.M)
    assert "    | E: Unable to locate package x" in text
    assert text.rstrip().endswith("boot failed at toolchain")
    argv = cloud.calls()[0]["argv"]
    assert argv == [
        "compute",
        "tpus",
        "tpu-vm",
        "get-guest-attributes",
        "torchtpu-cpp-vm",
        "--zone=us-west4-a",
        "--query-path=torchtpu-rig/",
        "--format=json",
        "--quiet",
    ]

    cloud.state["guest_attributes"] = [
        {"namespace": ns, "key": "python", "value": stage_attr("running", 1000)}
    ]
    (running,) = [
        s for s in json.loads(cloud.rig("progress", "--json").stdout) if s["state"] == "running"
    ]
    assert running["stage"] == "python" and running["seconds"] > 0
    assert cloud.rig("progress").stdout.rstrip().endswith("boot in progress")


def test_startup_script_reports_done_then_failed_and_stops(tmp_path, cloud):
    """The real runner on this machine: the python stage creates a venv, the torch stage fails on
    a package PyPI does not have, and nothing after it runs."""
    assert shutil.which(f"python{PY_VERSION}"), f"python{PY_VERSION} must be on PATH"
    env_file = write_env(
        tmp_path / "t.env",
        "\n".join(
            [
                f"PYTHON_VERSION={PY_VERSION}",
                "TORCH_PIP_SPEC=torchtpu-rig-no-such-package==0.0.0",
                "PIP_INDEX_ARGS=",
                "",
            ]
        ),
    )
    script = tmp_path / "metadata" / "startup-script"
    cloud.rig("--env", env_file, "render", "--out", str(script.parent))
    attrs = tmp_path / "attrs"
    env = dict(
        os.environ,
        RIG_ROOT=str(tmp_path / "root"),
        RIG_GUEST_ATTR_DIR=str(attrs),
        RIG_STAGES="python torch toolchain",
    )
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1
    assert "STAGE: python" in proc.stdout and "STAGE: torch" in proc.stdout
    assert "STAGE: toolchain" not in proc.stdout
    assert "rig: stage torch failed (exit 1)" in proc.stderr
    assert (tmp_path / "root" / "venv" / "bin" / "python3").exists()
    assert sorted(p.name for p in (attrs / "torchtpu-rig").iterdir()) == ["python", "torch"]

    cloud.state["guest_attr_dir"] = str(attrs)
    stages = {s["stage"]: s for s in json.loads(cloud.rig("progress", "--json").stdout)}
    assert stages["python"]["state"] == "done"
    assert f"Python {PY_VERSION}" in stages["python"]["tail"]
    assert stages["torch"]["state"] == "failed" and stages["torch"]["exit"] == 1
    assert (
        "No matching distribution found for torchtpu-rig-no-such-package" in stages["torch"]["tail"]
    )
    assert stages["toolchain"]["state"] == "pending"
    assert "boot failed at torch" in cloud.rig("progress").stdout


def test_unit_stage_without_tests_is_reported_skipped_not_done(tmp_path, cloud):
    script = tmp_path / "metadata" / "startup-script"
    cloud.rig("render", "--out", str(script.parent))
    attrs = tmp_path / "attrs"
    env = dict(
        os.environ,
        RIG_ROOT=str(tmp_path / "root"),
        RIG_GUEST_ATTR_DIR=str(attrs),
        RIG_STAGES="unit",
    )
    subprocess.run(["bash", str(script)], env=env, capture_output=True, check=True, timeout=60)
    cloud.state["guest_attr_dir"] = str(attrs)
    text = cloud.rig("progress").stdout
    assert re.search(r"^unit\s+skipped\s+0:0\d$", text, re.M)
    assert "    | UNIT_PYTEST_ARGS is empty in tpu.env: no tests were run" in text


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status":"ok"}' if self.path == "/health" else b"{}"
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_status_endpoint_firewall_and_delete(cloud, tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    cloud.state["queued_resource"] = {"state": {"state": "ACTIVE"}}
    cloud.state["node"] = {
        "state": "READY",
        "health": "HEALTHY",
        "acceleratorType": "v5litepod-1",
        "networkEndpoints": [
            {"ipAddress": "10.0.0.2", "accessConfig": {"externalIp": "127.0.0.1"}}
        ],
    }
    try:
        status = cloud.rig("status").stdout
        endpoint = cloud.rig("--set", f"PORT={port}", "endpoint", "--check").stdout
    finally:
        server.shutdown()
    assert "queued resource torchtpu-cpp-qr (us-west4-a): ACTIVE" in status
    assert (
        "node torchtpu-cpp-vm: READY, health HEALTHY, v5litepod-1, external IP 127.0.0.1" in status
    )
    assert endpoint.splitlines() == [f"http://127.0.0.1:{port}", '/health: 200 {"status":"ok"}']

    refused = cloud.rig("firewall", check=False)
    assert refused.returncode == 1 and "FIREWALL_SOURCE_RANGES is empty" in refused.stderr
    n_before = len(cloud.calls())
    cloud.rig("--set", "FIREWALL_SOURCE_RANGES=203.0.113.7/32", "firewall")
    cloud.state["firewall_rule"] = {"name": "torchtpu-cpp-allow-serve"}
    cloud.rig("--set", "FIREWALL_SOURCE_RANGES=203.0.113.0/24", "firewall")
    cloud.rig("delete", "--firewall")

    argvs = [c["argv"] for c in cloud.calls()[n_before:]]
    assert argvs == [
        [
            "compute",
            "firewall-rules",
            "describe",
            "torchtpu-cpp-allow-serve",
            "--format=json",
            "--quiet",
        ],
        [
            "compute",
            "firewall-rules",
            "create",
            "torchtpu-cpp-allow-serve",
            "--network=default",
            "--direction=INGRESS",
            "--action=ALLOW",
            "--rules=tcp:8000",
            "--target-tags=torchtpu-cpp-serve",
            "--source-ranges=203.0.113.7/32",
            "--quiet",
        ],
        [
            "compute",
            "firewall-rules",
            "describe",
            "torchtpu-cpp-allow-serve",
            "--format=json",
            "--quiet",
        ],
        [
            "compute",
            "firewall-rules",
            "update",
            "torchtpu-cpp-allow-serve",
            "--rules=tcp:8000",
            "--target-tags=torchtpu-cpp-serve",
            "--source-ranges=203.0.113.0/24",
            "--quiet",
        ],
        [
            "compute",
            "tpus",
            "queued-resources",
            "delete",
            "torchtpu-cpp-qr",
            "--zone=us-west4-a",
            "--force",
            "--quiet",
        ],
        ["compute", "firewall-rules", "delete", "torchtpu-cpp-allow-serve", "--quiet"],
    ]


def test_status_progress_and_endpoint_before_the_node_exists(cloud):
    cloud.state["queued_resource"] = {"state": {"state": "WAITING_FOR_RESOURCES"}}
    out = cloud.rig("status").stdout
    assert "WAITING_FOR_RESOURCES" in out and "node torchtpu-cpp-vm: not created yet" in out
    for command in ("endpoint", "progress"):
        proc = cloud.rig(command, check=False)
        assert proc.returncode == 1 and "does not exist (yet)" in proc.stderr

    cloud.state["node"] = {"state": "CREATING"}  # a node whose boot has not reported yet
    out = cloud.rig("progress").stdout
    assert re.search(r"^serving\s+pending$", out, re.M)
    assert out.rstrip().endswith("no stage has reported yet (the VM may still be provisioning)")


def test_cost_per_million_tokens_matches_the_seed():
    # The seed rig: USD 0.60/h on a v5e-1 flex-start; 12.20 tok/s -> 13.66, vLLM 144.1 -> 1.16.
    for tok_s, usd in (("12.20", "13.66"), ("144.1", "1.16")):
        out = subprocess.run(
            [
                sys.executable,
                str(RIG),
                "cost",
                "--usd-per-hour",
                "0.60",
                "--tokens-per-second",
                tok_s,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.startswith(f"USD {usd} per million output tokens")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "service_fails, api_key", [(False, ""), (False, "sk-rig-0123456789abcdef"), (True, "")]
)
def test_serving_stage_installs_the_unit_and_waits_for_health(
    tmp_path, cloud, service_fails, api_key
):
    """The serving stage with systemd, journald and apt replaced (tests/rig/vm-bin): the stand-in
    systemctl starts an HTTP server that answers /health, or reports the unit failed. With
    SERVE_API_KEY, serve.env (root's alone) hands it to the server."""
    port = _free_port()
    script = tmp_path / "metadata" / "startup-script"
    cloud.rig(
        *("--set", f"PORT={port}", "--set", "HEALTH_TIMEOUT=60"),
        *(("--set", f"SERVE_API_KEY={api_key}") if api_key else ()),
        *("render", "--out", str(script.parent)),
    )
    root, etc, attrs = tmp_path / "root", tmp_path / "etc", tmp_path / "attrs"
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python3").symlink_to(sys.executable)
    log = tmp_path / "systemd.jsonl"
    env = dict(
        os.environ,
        PATH=f"{FAKE_VM_BIN}{os.pathsep}{os.environ['PATH']}",
        RIG_ROOT=str(root),
        RIG_ETC=str(etc),
        RIG_GUEST_ATTR_DIR=str(attrs),
        RIG_STAGES="serving",
        FAKE_SYSTEMD_LOG=str(log),
        FAKE_HEALTH_PORT=str(port),
    )
    if service_fails:
        env["FAKE_SERVICE_FAILS"] = "1"
    try:
        proc = subprocess.run(
            ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        pid_file = Path(f"{log}.pid")
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)

    unit = etc / "systemd" / "system" / "torchtpu-cpp.service"
    assert f"EnvironmentFile={etc}/torchtpu-cpp/serve.env" in unit.read_text()
    assert (
        f"ExecStart={root}/venv/bin/python3 -m torchtpu_cpp.serve --device ${{SERVE_DEVICE}} "
        "--model ${MODEL_DIR} --model-id ${MODEL_ID} $EMB4_ARGS --port ${PORT} "
        "--host 0.0.0.0 --context ${SERVE_CONTEXT}"
    ) in unit.read_text()
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (package systemd) checks the unit"
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    serve_env = etc / "torchtpu-cpp" / "serve.env"
    assert serve_env.stat().st_mode & 0o777 == 0o600
    assert serve_env.read_text().splitlines() == [
        "SERVE_DEVICE=tpu",
        f"MODEL_DIR={root}/weights/model",
        "MODEL_ID=xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text",
        f'EMB4_ARGS="--emb4 {root}/weights/emb4"',
        f"PORT={port}",
        "SERVE_CONTEXT=8192",
        "TORCH_TPU_DEFER_AND_FUSE=1",
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "HF_HUB_OFFLINE=1",
        "PYTHONUNBUFFERED=1",
        *([f"TORCHTPU_API_KEY={api_key}"] if api_key else []),
    ]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[:3] == [
        ["daemon-reload"],
        ["enable", "torchtpu-cpp.service"],
        ["restart", "torchtpu-cpp.service"],
    ]

    cloud.state["guest_attr_dir"] = str(attrs)
    (stage,) = [
        s for s in json.loads(cloud.rig("progress", "--json").stdout) if s["stage"] == "serving"
    ]
    if service_fails:
        assert proc.returncode == 1
        assert stage["state"] == "failed"
        assert ["is-failed", "--quiet", "torchtpu-cpp.service"] in calls
        assert "journal line from the stand-in (-u torchtpu-cpp.service -n 40" in stage["tail"]
        assert f"torchtpu-cpp.service did not answer /health on port {port}" in stage["tail"]
    else:
        assert proc.returncode == 0, proc.stderr
        assert stage["state"] == "done"
        assert '{"status":"ok"}' in stage["tail"] and f"serving on port {port}" in stage["tail"]


def test_mcp_server_lists_tools_and_calls_them(cloud):
    from mcp import Client, StdioServerParameters

    cloud.state["guest_attributes"] = [
        {"namespace": "torchtpu-rig", "key": "python", "value": stage_attr("done", 10, 52)}
    ]
    cloud.state_file.write_text(json.dumps(cloud.state))
    params = StdioServerParameters(command=sys.executable, args=[str(RIG), "mcp"], env=cloud.env())

    async def session():
        async with Client(params) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            progress = await client.call_tool("boot_progress", {})
            cost = await client.call_tool(
                "cost_per_million_tokens", {"usd_per_hour": 0.6, "tokens_per_second": 12.2}
            )
            firewall = await client.call_tool("open_firewall", {})
            return tools, progress, cost, firewall

    tools, progress, cost, firewall = asyncio.run(session())
    assert tools == {
        "create_tpu",
        "boot_progress",
        "tpu_status",
        "endpoint",
        "open_firewall",
        "delete_tpu",
        "cost_per_million_tokens",
    }
    assert not progress.is_error
    assert re.search(r"^python\s+done\s+0:42$", progress.content[0].text, re.M)
    assert cost.content[0].text.startswith("USD 13.66 per million output tokens")
    assert firewall.is_error and "FIREWALL_SOURCE_RANGES is empty" in firewall.content[0].text
    assert [c["argv"][3] for c in cloud.calls()] == ["get-guest-attributes"]


def _torch_tpu_has_wheel() -> bool:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--no-deps",
            "--ignore-installed",
            "--only-binary=:all:",
            "torch_tpu==0.2.0",
        ],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


@pytest.mark.slow
def test_boot_installs_the_pin_builds_the_module_and_smokes_on_cpu(tmp_path, cloud, need_disk):
    """The build-on-boot path on this machine: a fresh venv, the pinned pip spec, the module built
    from the script's own tarball against that torch, the smoke stage on cpu. The spec's wheels
    and the build's requirements come from PyPI into the wheelhouse that setup.sh filled with
    torch's, and the boot installs from there alone (`--no-index`): the same files as from PyPI,
    without a second download of torch's 3 GB."""
    assert shutil.which(f"python{PY_VERSION}"), f"python{PY_VERSION} must be on PATH"
    spec = "torch==2.14.1 torch_tpu==0.2.0 huggingface_hub"
    if not _torch_tpu_has_wheel():
        spec = "torch==2.14.1 huggingface_hub"
        print(f"torch_tpu 0.2.0 has no wheel for CPython {PY_VERSION}: installed {spec} without it")
    with open(REPO / "pyproject.toml", "rb") as f:
        build_requires = tomllib.load(f)["build-system"]["requires"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(WHEELS)]
        + spec.split()
        + build_requires,
        check=True,
    )
    env_file = write_env(
        tmp_path / "local.env",
        "\n".join(
            [
                f"PYTHON_VERSION={PY_VERSION}",
                f'TORCH_PIP_SPEC="{spec}"',
                f'PIP_INDEX_ARGS="--no-index --find-links {WHEELS}"',
                "BUILD_JOBS=2",
                "",
            ]
        ),
    )
    script = tmp_path / "metadata" / "startup-script"
    print(cloud.rig("--env", env_file, "render", "--out", str(script.parent)).stdout)
    # A fixed root, emptied first: the venv is fresh, and the paths the compiler sees are the same
    # from run to run, so the build's ccache (see CMakeLists.txt) can answer a rerun. A second
    # boot test running meanwhile gets a root of its own (slower, never clobbered).
    attrs = tmp_path / "attrs"
    lock = open(Path(tempfile.gettempdir()) / "torchtpu-rig-boot.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        root = Path(tempfile.gettempdir()) / "torchtpu-rig-boot"
    except BlockingIOError:
        root = tmp_path / "root"
        print(f"another boot test holds {lock.name}: building in {root}")
    shutil.rmtree(root, ignore_errors=True)
    # The venv with torch's CUDA libraries (6 GB), pip's unpacked wheels beside it, the build.
    need_disk(root.parent, 10, "the boot's venv and build")
    # The weights stage downloads with huggingface_hub for real, from the fake Hub on loopback.
    hub = HubFixture()
    checkpoint = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": os.urandom(64)}
    for hub_id in (
        "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text",
        "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text-emb4",
    ):
        hub.add(Repo(hub_id, {"main": checkpoint}))
    env = dict(
        os.environ,
        RIG_ROOT=str(root),
        RIG_GUEST_ATTR_DIR=str(attrs),
        RIG_METADATA_DIR=str(script.parent),
        RIG_DEVICE="cpu",
        RIG_STAGES="python torch toolchain build weights smoke",
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_XET="1",
        # The boot path is under test, not the code the compilers make: unoptimized C++ (through
        # scikit-build-core's CMAKE_ARGS) and Rust compile in about half the time. The optimized
        # build of the same sources against the same torch is the regular tree's. Cargo builds
        # beside the root, not in it, so that a rerun finds the crates built (about 75 s of
        # compile on 2 cores), as the C++ finds ccache.
        CMAKE_ARGS="-DCMAKE_CXX_FLAGS_RELEASE=-O0 "
        f"-DTORCHTPU_CARGO_TARGET_DIR={root.with_name(root.name + '-cargo')}",
        CARGO_PROFILE_RELEASE_OPT_LEVEL="0",
    )
    try:
        # Its own process group, so that a timeout also stops pip, cmake and the compilers.
        boot = subprocess.Popen(
            ["bash", str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = boot.communicate(timeout=2340)
        except subprocess.TimeoutExpired:
            os.killpg(boot.pid, signal.SIGKILL)
            out, err = boot.communicate()
            err += "\nthe boot did not finish in 2340 s and was killed"
        print(out[-6000:], err[-6000:], sep="\n")
        cloud.state["guest_attr_dir"] = str(attrs)
        stages = json.loads(cloud.rig("progress", "--json").stdout)
        print(cloud.rig("progress").stdout)
        for stopped in (s["stage"] for s in stages if s["state"] in ("failed", "running")):
            log_lines = (root / "logs" / f"{stopped}.log").read_text().splitlines()
            print(f"--- the end of {stopped}.log", *log_lines[-80:], sep="\n")
        assert boot.returncode == 0
        logs = {s: (root / "logs" / f"{s}.log").read_text() for s in ("torch", "build", "smoke")}
        assert re.search(r"^torch 2\.14\.1", logs["torch"], re.M)
        if "torch_tpu" in spec:
            assert "torch_tpu 0.2.0" in logs["torch"]
            assert "torch_tpu imports against torch 2.14.1" in logs["torch"]
        # Built from a tarball, not a checkout: the revision comes from the rig, not from git.
        revision = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        assert f"'git_revision': '{revision}'" in logs["build"]
        assert "torchtpu_cpp matmul_sum 64.0 on cpu" in logs["smoke"]
        # torchtpu_cpp.device_check ran (on the cpu, the device-only checks are skipped).
        assert "ok   tokens: float32 greedy tokens equal the CPU's on 3 of 3" in logs["smoke"]
        check = subprocess.run(
            [
                str(root / "venv" / "bin" / "python3"),
                "-c",
                "import torch, torchtpu_cpp; print(torchtpu_cpp.__file__); "
                "print(torch.__version__); print(torchtpu_cpp.BUILD['torch'])",
            ],
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert check[0].startswith(str(root / "venv")), check[0]
        assert check[1] == check[2], f"module built against torch {check[2]}, venv has {check[1]}"
        assert [s["state"] for s in stages] == ["done"] * 6 + ["pending"] * 2
        for name in ("model", "emb4"):
            got = root / "weights" / name
            assert {p: (got / p).read_bytes() for p in checkpoint} == checkpoint
    finally:
        hub.close()
        if (root / "logs").is_dir():
            shutil.copytree(root / "logs", tmp_path / "logs", dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)  # the venv is gigabytes; the logs stay
        lock.close()
