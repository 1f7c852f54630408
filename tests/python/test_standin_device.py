"""The engine on the stand-in out-of-tree device (issue #20, tests/device): the parity suite's
make-tiny configs give the CPU's greedy tokens at float32 through `torchtpu-cpp generate
--device-library LIB --device standin`, and the module takes the device by name and by a `like`
tensor once the library is loaded into the Python process.

CTest sets TORCHTPU_STANDIN_LIBRARY to the built library and PYTHONPATH to the module."""

import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request

import hf_tiny  # conftest puts tests/python on sys.path
import pytest
import torch
import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not
from torchtpu_cpp import device_check as dc

MAX_NEW = 24


@pytest.fixture(scope="module")
def library():
    path = os.environ.get("TORCHTPU_STANDIN_LIBRARY")
    if not path or not os.path.exists(path):
        pytest.fail(
            "TORCHTPU_STANDIN_LIBRARY must name the built libtorchtpu_standin.so"
        )
    # Registers PrivateUse1 as "standin" in this process's dispatcher.
    dc.load_backend(path)
    return path


@pytest.fixture(scope="module", params=sorted(hf_tiny.MAKE_TINY_CONFIGS))
def checkpoint(cli, tmp_path_factory, request):
    out = tmp_path_factory.mktemp(request.param)
    knobs = hf_tiny.MAKE_TINY_CONFIGS[request.param]
    return cli.make_tiny(out, preset="tiny", **knobs), knobs.get("vocab", 512)


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory):
    return cli.make_tiny(tmp_path_factory.mktemp("tiny"), seed=5, dtype="f32")


def _generate(cli, model, ids, device, *head):
    proc = cli(
        *head,
        "generate",
        "--model",
        model,
        "--ids",
        ",".join(map(str, ids)),
        "--max-new",
        MAX_NEW,
        "--dtype",
        "float32",
        "--device",
        device,
        "--chunk",
        7,
        "--ignore-eos",
        "--json",
    )
    return json.loads(proc.stdout)


def test_generate_on_standin_gives_the_cpus_tokens(cli, library, checkpoint):
    model, vocab = checkpoint
    ids = hf_tiny.prompt(vocab, 19, seed=3)
    expected = _generate(cli, model, ids, "cpu")["tokens"]
    got = _generate(cli, model, ids, "standin", "--device-library", library)
    assert len(expected) == MAX_NEW
    assert got["tokens"] == expected


def test_generate_refuses_an_unregistered_device_by_name(cli, tiny):
    with pytest.raises(
        AssertionError, match="unknown device 'standin'.*--device-library"
    ):
        _generate(cli, tiny, [2, 5, 9], "standin")


def test_a_cuda_device_the_machine_lacks_is_named(cli, tiny):
    """cuda:N past the devices torch sees (cuda:0 where there are none) is the user's mistake: a
    message naming it and exit 2, not the driver's failure with torch's C++ backtrace; the
    module's Engine raises ValueError with the same words."""
    count = torch.cuda.device_count()
    name = f"cuda:{count}"
    want = f"device '{name}': torch sees " + (
        "no CUDA device on this machine" if count == 0 else f"{count} CUDA device"
    )
    proc = subprocess.run(
        [cli.path, "generate", "--model", tiny, "--ids", "2,5,9", "--max-new", "2"]
        + ["--device", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {want}"), proc.stderr
    assert "Exception raised from" not in proc.stderr
    with pytest.raises(ValueError, match=re.escape(want)):
        tt.Engine(tiny, context=64, device=name)


def test_engine_takes_the_device_by_name_and_by_like(library, tiny):
    ids = hf_tiny.prompt(512, 11, seed=4)
    cpu = tt.Engine(tiny, context=64, dtype="float32")
    expected = cpu.decode(ids, 16, stop=[]).tokens
    by_name = tt.Engine(tiny, context=64, dtype="float32", device="standin")
    like = tt.Engine(
        tiny, context=64, dtype="float32", like=torch.zeros(1, device="standin")
    )
    assert by_name.device.startswith("standin") and like.device == "standin:0"
    assert by_name.decode(ids, 16, stop=[]).tokens == expected
    assert like.decode(ids, 16, stop=[], read_every=4).tokens == expected
    sampled = dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2, seed=3)
    assert (
        by_name.decode(ids, 16, stop=[], read_every=8, **sampled).tokens
        == cpu.decode(ids, 16, stop=[], read_every=8, **sampled).tokens
    )


# Rows of every kind the sampler serves: greedy; temperature with top-k, top-p and
# min-p; penalties; logit bias; seeds.
BATCH_KINDS = [
    {},
    dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05, seed=1),
    dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=-0.4),
    dict(temperature=0.7, logit_bias={7: 5.0, 300: -100.0}, seed=2),
    dict(temperature=1.2, top_p=0.8, repetition_penalty=1.1, seed=3),
]


def test_batch_steps_are_one_program_as_rows_join_leave_and_sample_differently(
    library, tiny
):
    """Issue #20 with batching: every Batch step that reads no prompt (nothing queued
    or reading when it starts) dispatches the same ops, host ones included: the forward
    pass, the sampling of every row and one read back of all rows' tokens, whatever
    rows are live and however each samples. Each sequence gives its CPU tokens alone."""
    cpu = tt.Engine(tiny, context=64, dtype="float32")
    batch = tt.Engine(tiny, context=64, dtype="float32", device="standin").batch(rows=3)
    rng = random.Random(5)
    jobs, results, programs, live_rows = {}, {}, set(), set()
    cancelled = 0
    while len(jobs) < 10 or not batch.idle:
        if len(jobs) < 10 and rng.random() < 0.3:
            kwargs = dict(stop=(), **BATCH_KINDS[len(jobs) % len(BATCH_KINDS)])
            prompt = hf_tiny.prompt(512, rng.randint(3, 11), seed=len(jobs))
            max_new = rng.randint(4, 18)
            jobs[batch.submit(prompt, max_new, **kwargs)] = (prompt, max_new, kwargs)
        stats = batch.stats()
        steady = stats["queued"] == stats["reading"] == 0 and stats["decoding"] > 0
        if steady and stats["decoding"] > 1 and rng.random() < 0.1:
            batch.cancel(max(i for i in jobs if i not in results))
            cancelled += 1
        recorder = dc.Recorder()
        with recorder:
            finished = batch.step()
        results.update((i, batch.result(i)) for i in finished)
        if steady:
            assert dc.count(recorder.lines, "read") == 1
            programs.add(tuple(recorder.lines))
            live_rows.add(stats["decoding"])
    assert cancelled > 0 and live_rows == {1, 2, 3}
    assert len(programs) == 1
    # Off the CPU prompts arriving together share passes with no limit but the step's budget.
    assert batch.stats()["pass_rows"] is None
    for seq, (prompt, max_new, kwargs) in jobs.items():
        alone = cpu.decode(prompt, max_new, **kwargs).tokens
        got = results[seq]
        if got.finish == "cancelled":
            assert got.tokens == alone[: len(got.tokens)]
        else:
            assert got.tokens == alone, seq


def _serve_completion(cli, model, head, device, body):
    """Starts `serve` on a free port, posts one /v1/completions request, stops the server."""
    cmd = [
        cli.path,
        *head,
        "serve",
        "--model",
        model,
        "--port",
        "0",
        "--context",
        "128",
    ]
    cmd += ["--device", device, "--dtype", "float32"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = None
        for line in proc.stdout:
            match = re.search(r"serving .* on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, f"{cmd} exited {proc.wait()}: {proc.stderr.read()}"
        # The engine loads after the port is bound: /health answers 200 once it has.
        deadline = time.time() + 300
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=10) as response:
                    if response.status == 200:
                        break
            except OSError:
                assert time.time() < deadline, f"{cmd} never became healthy"
                time.sleep(0.2)
        request = urllib.request.Request(
            url + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())["choices"][0]["text"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_on_standin_answers_as_on_the_cpu(
    cli, library, tmp_path_factory, test_tokenizer_dir
):
    model = cli.make_served_tiny(tmp_path_factory.mktemp("served"), test_tokenizer_dir, 8, "f32")
    body = {"prompt": "The sea is", "max_tokens": 6, "temperature": 0}
    expected = _serve_completion(cli, model, [], "cpu", body)
    assert expected
    assert (
        _serve_completion(cli, model, ["--device-library", library], "standin", body)
        == expected
    )


# torchtpu_cpp.device_check: the checks the rig's smoke stage runs on a real TPU, proven here on
# the stand-in (where the C++ suite measures the same things from inside the backend), and shown
# able to fail on records that break each promise.


def test_device_check_passes_on_the_standin(library):
    proc = subprocess.run(
        [sys.executable, "-m", "torchtpu_cpp.device_check", "--device", "standin"]
        + ["--library", library, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["tokens"] == {"ok": True, "mismatched": []}
    assert figures["host reads"]["prompt_reads"] <= 4  # 3 chunks + the first token
    assert figures["host reads"]["reads_per_window"] == [1] * 8
    assert figures["programs"]["distinct_programs"] == 1
    assert figures["programs"]["steps"] == 255 + 19  # every step after the first token, of both requests


def test_device_check_refuses_an_unknown_device():
    proc = subprocess.run(
        [sys.executable, "-m", "torchtpu_cpp.device_check", "--device", "nosuchdevice"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "unknown device 'nosuchdevice'" in proc.stderr


STEP = [
    "aten.mm.default(float32[1, 64], float32[64, 64])",
    "aten.add.Tensor(float32[1, 64], 1)",
]
READ = "read aten.to.dtype_layout(int64[8], device=device(type='cpu'))"


def test_device_check_program_rule_catches_a_changing_step():
    good = dc.check_programs([STEP + [READ]] * 3, [STEP * 8 + [READ]] * 2, 8)
    assert good.ok and good.figures["distinct_programs"] == 1
    grown = [STEP[0].replace("[1, 64]", "[2, 64]"), STEP[1], READ]
    assert (
        dc.check_programs([STEP + [READ], grown], [STEP * 8 + [READ]], 8).figures[
            "distinct_programs"
        ]
        == 2
    )
    assert not dc.check_programs([STEP + [READ], grown], [STEP * 8 + [READ]], 8).ok
    upload = STEP + [
        "upload aten._to_copy.default(int64[1]@cpu, device=device(type='tpu'))"
    ]
    assert not dc.check_programs([upload + [READ]] * 2, [upload * 8 + [READ]], 8).ok
    odd_window = STEP * 7 + [STEP[0], READ]
    assert not dc.check_programs([STEP + [READ]] * 2, [odd_window], 8).ok
    assert not dc.check_programs([STEP + [READ]] * 2, [STEP * 8 + [READ, READ]], 8).ok


def test_device_check_read_rule_catches_a_read_per_token():
    assert dc.check_reads([[READ], [READ], [READ], []], chunks=1, read_every=8).ok
    assert not dc.check_reads(
        [[READ], [READ, READ], [READ], []], chunks=1, read_every=8
    ).ok
    assert not dc.check_reads(
        [[READ] * 3, [READ], [READ], []], chunks=1, read_every=8
    ).ok
    assert not dc.check_reads(
        [[READ], [READ], [READ], [READ]], chunks=1, read_every=8
    ).ok
