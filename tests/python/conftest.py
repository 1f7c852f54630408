"""Shared pytest fixtures: the torchtpu-cpp command and import paths for the test helpers."""

import json
import os
import pathlib
import subprocess
import sys

# The tiny models here are far too small for threaded BLAS; on a shared 2-core machine the thread
# pools only contend (measured: a 10x slower numpy reference).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

TESTS_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO_DIR = TESTS_DIR.parent
for path in (TESTS_DIR, TESTS_DIR / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _module_path():
    """torchtpu_cpp comes from PYTHONPATH (CTest sets it) or an installed wheel; otherwise from
    the newest build tree of the repo, so that a bare `pytest tests/python` works too."""
    import importlib.util

    if importlib.util.find_spec("torchtpu_cpp") is None:
        trees = sorted(
            REPO_DIR.glob("build*/python/torchtpu_cpp"),
            key=lambda p: -p.stat().st_mtime,
        )
        if trees:
            sys.path.insert(0, str(trees[0].parent))


_module_path()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: needs minutes or gigabytes (ctest label 'slow')"
    )


@pytest.fixture(scope="session")
def test_tokenizer_dir():
    """The Gemma 4 test tokenizer (the real 262,144-piece vocabulary) that scripts/setup.sh
    writes, or TORCHTPU_TEST_TOKENIZER."""
    path = pathlib.Path(
        os.environ.get("TORCHTPU_TEST_TOKENIZER")
        or REPO_DIR / ".cache" / "gemma4-test-tokenizer"
    )
    if not (path / "tokenizer.json").is_file():
        pytest.fail(
            f"{path}/tokenizer.json missing: run scripts/make_test_tokenizer.py"
        )
    return path


def _find_cli():
    """TORCHTPU_CLI (CTest sets it to the built target), else a build directory of the repo."""
    if os.environ.get("TORCHTPU_CLI"):
        return os.environ["TORCHTPU_CLI"]
    found = sorted(
        REPO_DIR.glob("build*/torchtpu-cpp"), key=lambda p: -p.stat().st_mtime
    )
    found += sorted(
        REPO_DIR.glob("build*/src/cli/torchtpu-cpp"), key=lambda p: -p.stat().st_mtime
    )
    return str(found[0]) if found else None


# The device the engine runs on in `Cli.generate`: the CPU, or TORCHTPU_TEST_DEVICE (cuda:0, say)
# where a machine has one; the references it is checked against stay on the CPU.
ENGINE_DEVICE = os.environ.get("TORCHTPU_TEST_DEVICE") or "cpu"


class Cli:
    """Runs `torchtpu-cpp` subcommands; a non-zero exit raises with the command's stderr."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args, timeout=900):
        cmd = [self.path, *map(str, args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
            )
        return proc

    def make_tiny(self, out, **knobs):
        """`make-tiny OUT --key value ...`; True adds a bare flag, False/None leaves it out."""
        args = ["make-tiny", out]
        for key, value in knobs.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value not in (False, None):
                args += [flag, value]
        self(*args)
        return str(out)

    def make_served_tiny(self, out, tokenizer, seed, dtype):
        """Tiny random weights with the full Gemma 4 vocabulary, so the test tokenizer fits: what
        the server suites serve."""
        return self.make_tiny(
            out,
            seed=seed,
            dtype=dtype,
            vocab=262144,
            hidden=64,
            window=32,
            layer_types="sliding,full,sliding,full",
            shared=2,
            tokenizer=str(tokenizer),
        )

    def generate(
        self,
        model,
        ids,
        max_new,
        *,
        dtype="float32",
        emb4=None,
        context=None,
        chunk=None,
        dump=None,
        ignore_eos=True,
        int4=None,
        activation_bits=None,
        draft_max=None,
        draft_ngram_min=None,
        draft_always=False,
        lora=None,
    ):
        """`generate --json`: returns (parsed JSON, dumped logits {name: float32 array} or None)."""
        args = [
            "generate",
            "--model",
            model,
            "--ids",
            ",".join(map(str, ids)),
            "--max-new",
            max_new,
            "--dtype",
            dtype,
            "--device",
            ENGINE_DEVICE,
            "--json",
        ]
        if emb4:
            args += ["--emb4", emb4]
        if context:
            args += ["--context", context]
        if chunk:
            args += ["--chunk", chunk]
        if ignore_eos:
            args.append("--ignore-eos")
        if dump:
            args += ["--dump-logits", dump]
        if int4:
            args += ["--int4", int4]
        if activation_bits:
            args += ["--int4-activation-bits", activation_bits]
        if draft_max:
            args += ["--draft-max", draft_max]
        if draft_ngram_min:
            args += ["--draft-ngram-min", draft_ngram_min]
        if draft_always:
            args.append("--draft-always")
        if lora:
            args += ["--lora", lora]
        out = json.loads(self(*args).stdout)
        if not dump:
            return out, None
        from safetensors.numpy import load_file

        return out, load_file(dump)


@pytest.fixture(scope="session")
def engine_device():
    """Where the engine runs (ENGINE_DEVICE). A bf16 result depends on the device's kernels (their
    sums' order, cuBLAS's reduced-precision bf16 reductions), so a bf16 comparison with
    transformers runs transformers there too."""
    return ENGINE_DEVICE


@pytest.fixture(scope="session")
def cli():
    path = _find_cli()
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            "torchtpu-cpp not built: build the `torchtpu-cpp` target or set TORCHTPU_CLI"
        )
    return Cli(path)


@pytest.fixture(scope="session")
def need_disk():
    """`need_disk(path, gigabytes, what)` fails the test before it starts when the file system of
    `path` has less room than `what` takes: a full disk midway fails later tests too, with
    messages about something else."""

    def check(path, gigabytes, what):
        import shutil

        free = shutil.disk_usage(path).free / 1e9
        if free < gigabytes:
            pytest.fail(f"{what} needs {gigabytes} GB free in {path}; it has {free:.1f} GB")

    return check


_MEASURED = []


@pytest.fixture(scope="session")
def report():
    """`report(line)` keeps a measured figure; all of them are printed at the end of the run."""
    return _MEASURED.append


def pytest_terminal_summary(terminalreporter):
    if _MEASURED:
        terminalreporter.section("measured")
        for line in _MEASURED:
            terminalreporter.write_line(line)
