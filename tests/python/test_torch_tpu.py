"""torch-tpu 0.2.0 (PyPI) installed beside torchtpu_cpp must not break it (issue #5 item 8), and what
works without a TPU is reported.

torch-tpu registers itself as a torch device backend (entry point `torch.backends`), so a plain
`import torch` imports torch_tpu too. It is installed, without dependencies, into a directory that
goes on PYTHONPATH of a subprocess; the project's torch stays the only torch. With its runtime
(libtpu) it loads and, finding no TPU, leaves the "tpu" device unregistered; without libtpu it
aborts the process inside `import torch`, which TORCH_DEVICE_BACKEND_AUTOLOAD=0 avoids."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO_DIR = pathlib.Path(__file__).resolve().parents[2]
# Installed once per checkout (.cache is git-ignored): about 230 MB of wheels.
CACHE = REPO_DIR / ".cache" / "torch-tpu-0.2.0"
# torch_tpu's own imports at load time, without their heavier optional ones (tensorboard).
RUNTIME = ["libtpu", "absl-py", "frozendict", "immutabledict", "portpicker", "pyzmq"]


def _install(target, packages):
    if (target / ".complete").exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(partial),
            *packages,
        ],
        check=True,
        timeout=1200,
    )
    (partial / ".complete").write_text(json.dumps(packages))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


@pytest.fixture(scope="module")
def bare():
    """torch-tpu alone."""
    return _install(CACHE / "bare", ["torch-tpu==0.2.0"])


@pytest.fixture(scope="module")
def with_runtime():
    """torch-tpu with libtpu and the small packages its import needs."""
    return _install(CACHE / "runtime", ["torch-tpu==0.2.0", *RUNTIME])


def _module_path():
    import torchtpu_cpp

    return str(pathlib.Path(torchtpu_cpp.__file__).parents[1])


PROBE = r"""
import json, sys, warnings
order = sys.argv[1]
warnings.filterwarnings("ignore", message=".*tcmalloc")
out = {}
if order == "torchtpu_cpp-first":
    import torchtpu_cpp, torch
else:
    import torch, torchtpu_cpp
out["torch"] = str(torch.__version__)
out["torch_tpu_loaded"] = "torch_tpu" in sys.modules
if out["torch_tpu_loaded"]:
    import torch_tpu
    out["torch_tpu_file"] = torch_tpu.__file__
out["privateuse1"] = torch._C._get_privateuse1_backend_name()
out["build_torch"] = torchtpu_cpp.BUILD["torch"]
out["matmul_sum"] = torchtpu_cpp.matmul_sum(torch.ones(8, 8)).item()
try:
    torchtpu_cpp.Engine("/nonexistent", device="tpu")
except Exception as e:
    out["engine_tpu"] = f"{type(e).__name__}: {e}"
print("PROBE " + json.dumps(out))
"""


def _probe(site, order, **env):
    pythonpath = os.pathsep.join([str(site), _module_path()])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, order],
        env=dict(os.environ, PYTHONPATH=pythonpath, **env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
    return proc, (json.loads(lines[-1][6:]) if lines else None)


@pytest.mark.parametrize("order", ["torch-first", "torchtpu_cpp-first"])
def test_torchtpu_cpp_works_beside_torch_tpu_without_a_tpu(with_runtime, order, report):
    proc, out = _probe(with_runtime, order)
    assert proc.returncode == 0 and out, proc.stderr[-3000:]
    assert out["torch_tpu_loaded"], "torch did not autoload torch_tpu: the probe tests nothing"
    assert out["torch_tpu_file"].startswith(str(with_runtime))
    assert out["torch"] == out["build_torch"]
    assert out["matmul_sum"] == 512.0
    # No TPU here: torch_tpu leaves PrivateUse1 unnamed, so "tpu" is a clear caller error.
    assert out["privateuse1"] == "privateuseone"
    assert out["engine_tpu"].startswith("ValueError: unknown device 'tpu'")
    report(
        f"torch-tpu 0.2.0 + libtpu, no TPU [{order}]: import torch autoloads torch_tpu; "
        f"torchtpu_cpp imports and runs on CPU; device 'tpu' unregistered -> {out['engine_tpu']}"
    )


def test_without_libtpu_only_autoload_off_keeps_torch_importable(bare, report):
    crashed, _ = _probe(bare, "torch-first")
    why = [l for l in crashed.stderr.splitlines() if "Check failed" in l] or ["no message"]
    proc, out = _probe(bare, "torch-first", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0 and out, proc.stderr[-3000:]
    assert not out["torch_tpu_loaded"]
    assert out["matmul_sum"] == 512.0
    report(
        "torch-tpu 0.2.0 without libtpu: import torch exits with "
        f"{crashed.returncode} ({why[0][:160]}); "
        "with TORCH_DEVICE_BACKEND_AUTOLOAD=0 torch and torchtpu_cpp import and run on CPU"
    )
