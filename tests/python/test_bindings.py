"""The torchtpu_cpp module (issue #5): the seed's eight binding tests re-created for our module,
Engine.logits against the float64 reference, and read_every batching against read_every=1.

Tiny checkpoints come from `torchtpu-cpp make-tiny`; the module is imported from the CMake build
tree (CTest sets PYTHONPATH to <build>/python)."""

import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import threading

import pytest
import torch



import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not

import hf_tiny  # conftest puts tests/python on sys.path
from reference import Reference
from threads import in_thread, ticks_while

CONTEXT = 64


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory):
    """The `tiny` preset at f32: 7 layers (S S S F | S S F, the last 3 KV-shared), vocab 512."""
    return cli.make_tiny(tmp_path_factory.mktemp("tiny"), seed=5, dtype="f32")


@pytest.fixture(scope="module")
def chat_tiny(cli, tmp_path_factory, test_tokenizer_dir):
    """Tiny bf16 weights with the test tokenizer's 262,144 ids: prompts as text, 1 MiB of logits a
    step."""
    return cli.make_tiny(tmp_path_factory.mktemp("chat"), dtype="bf16", tokenizer=test_tokenizer_dir)


@pytest.fixture(scope="module")
def engine(tiny):
    return tt.Engine(tiny, context=CONTEXT, dtype="float32")


def _prompt(n, seed=1, vocab=512):
    return hf_tiny.prompt(vocab, n, seed)


# --- 1. bad input is ValueError -------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda e: e.decode([], 4), ["empty"]),
        (lambda e: e.logits([]), ["empty"]),
        (lambda e: e.generate([], 4), ["empty"]),
        (lambda e: e.decode([2, 5], 0), ["max_new", "0"]),
        (lambda e: e.generate([2, 5], -3), ["max_new", "-3"]),
        (lambda e: e.decode([2, 512], 4), ["512", "position 1", "vocabulary"]),
        (lambda e: e.logits([2, -1]), ["-1", "vocabulary"]),
        (lambda e: e.decode(_prompt(CONTEXT + 1), 4), [str(CONTEXT + 1), str(CONTEXT)]),
        (lambda e: e.logits(_prompt(CONTEXT + 5)), [str(CONTEXT + 5), str(CONTEXT)]),
        (lambda e: e.decode([2, 5], 4, read_every=0), ["read_every", "0"]),
        (lambda e: e.generate([2, 5], 4, read_every=-1), ["read_every", "-1"]),
        (lambda e: e.decode([2, 5], 4, stop=[1, "a"]), ["stop[1]", "'a'", "str"]),
        (lambda e: e.decode([2, 5], 4, stop=[1.5]), ["stop[0]", "1.5", "float"]),
        (lambda e: e.decode([2, 5], 4, stop=[True]), ["stop[0]", "bool"]),
        (lambda e: e.decode([2, 5], 4, stop="abc"), ["stop", "str"]),
        (lambda e: e.decode([2, "5"], 4), ["ids[1]", "'5'"]),
        (lambda e: e.decode([2, 2**70], 4), ["ids[1]"]),
        (lambda e: e.logits(None), ["ids", "NoneType"]),
        (lambda e: e.decode([2, 5], 4, draft_max=-2), ["draft_max", "-2"]),
        (
            lambda e: e.decode([2, 5], 4, draft_max=2, draft_ngram_min=3, draft_ngram_max=2),
            ["draft_ngram_min", "draft_ngram_max", "got 3 and 2"],
        ),
        (lambda e: e.batch(rows=2).submit([2, 5], 4, draft_max=-1), ["draft_max", "-1"]),
        (lambda e: e.decode([2, 5], 4, stop=[1, -5]), ["stop id -5", "position 1", "vocabulary"]),
        (lambda e: e.decode([2, 5], 4, stop=[512]), ["stop id 512", "vocabulary [0, 512)"]),
        (lambda e: e.decode([2, 5], 4, grammar="[0-9]+"), ["grammar", "grammar_kind"]),
        (lambda e: e.decode([2, 5], 4, seed=-1), ["seed", "2**64 - 1", "-1"]),
        (lambda e: e.decode([2, 5], 4, seed=2**64), ["seed", str(2**64)]),
        (lambda e: e.decode([2, 5], 4, seed=1.0), ["seed", "1.0"]),
        (lambda e: e.batch(rows=2).submit([2, 5], 4, seed=True), ["seed", "True"]),
        (lambda e: e.batch(cache_mb=float("inf")), ["cache_mb", "inf"]),
        (lambda e: e.batch(cache_mb=1e30), ["cache_mb", "1e+30"]),
    ],
)
def test_bad_input_is_value_error(engine, call, words):
    with pytest.raises(ValueError) as info:
        call(engine)
    for word in words:
        assert word in str(info.value)
    # Nothing else broke: the engine still decodes.
    assert len(engine.generate([2, 7, 9], 3)[0]) == 3


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"dtype": "int3"}, ["dtype", "int3"]),
        ({"dtype": torch.int8}, ["dtype", "int8"]),
        ({"device": "quantum:0"}, ["device", "quantum:0"]),
        # Devices torch names but the engine cannot hold weights on.
        ({"device": "meta"}, ["device 'meta' holds no data"]),
        ({"device": "mps"}, ["device 'mps'", "no mps backend"]),
        ({"device": "cpu:7"}, ["device 'cpu:7'", "the CPU is one device"]),
        # torch keeps a device's index in an int8, where 250 is -6 and 256 is 0.
        ({"device": "cpu:250"}, ["device 'cpu:250': index 250 is past", "127"]),
        ({"device": "cpu:256"}, ["device 'cpu:256': index 256 is past", "127"]),
        ({"like": torch.zeros(1, device="meta")}, ["device 'meta' holds no data"]),
        ({"context": 0}, ["context", "0"]),
        ({"threads": -1}, ["threads", "-1"]),
        ({"int4": "fast"}, ["int4 weights", "fast", "packed"]),
        ({"quantize": "int8"}, ["quantize", "int8", "int4"]),
        ({"int4_activation_bits": 4}, ["int4 activation bits", "16 or 8", "got 4"]),
        # The tiny preset's per-layer inputs are 16 wide: not whole groups of 32.
        ({"quantize": "int4"}, ["--quantize int4", "per_layer_projection", "16"]),
    ],
)
def test_bad_engine_arguments_are_value_error(tiny, kwargs, words):
    with pytest.raises(ValueError) as info:
        tt.Engine(tiny, **kwargs)
    for word in words:
        assert word in str(info.value)


def test_int4_operator_threads_and_weights_from_python(cli, tmp_path):
    """torch.ops.torchtpu.int4_linear is registered by the import, computes compressed-tensors'
    linear through the composite and the CPU blocks (16- or 8-bit activations), and Engine takes
    threads=/int4=/quantize=/int4_activation_bits=."""
    torch.manual_seed(0)
    out, inp = 40, 64
    packed = torch.randint(-(2**31), 2**31 - 1, (out, inp // 8), dtype=torch.int32)
    scale = (torch.rand(out, inp // 32) * 0.02 + 0.01).to(torch.bfloat16)
    nibbles = (packed.unsqueeze(-1) >> torch.arange(0, 32, 4)) & 0xF
    dense = (
        (nibbles.reshape(out, inp) - 8).float() * scale.float().repeat_interleave(32, 1)
    ).to(torch.bfloat16)
    x = torch.randn(3, inp).to(torch.bfloat16)
    composite = torch.ops.torchtpu.int4_linear(x, packed, scale, None, 32, out)
    assert torch.equal(composite, torch.nn.functional.linear(x, dense))
    blocks, block_scale = torch.ops.torchtpu.int4_repack(packed, scale, None, 32, out)
    streamed = torch.ops.torchtpu.int4_linear(x, blocks, block_scale, None, 32, out)
    assert streamed.shape == (3, out) and streamed.dtype == torch.bfloat16
    exact = x.double() @ dense.double().T
    assert (streamed.double() - exact).abs().max() <= 0.02 * exact.abs().max()
    eight = torch.ops.torchtpu.int4_linear(
        x, blocks, block_scale, None, 32, out, activation_bits=8
    )
    assert (eight.double() - exact).abs().max() <= 0.05 * exact.abs().max()
    assert not torch.equal(eight, streamed)
    with pytest.raises(ValueError, match="activation_bits must be 16 or 8, got 12"):
        torch.ops.torchtpu.int4_linear(x, blocks, block_scale, None, 32, out, 12)
    meta = torch.ops.torchtpu.int4_linear(
        x.to("meta"), packed.to("meta"), scale.to("meta"), None, 32, out
    )
    assert meta.device.type == "meta" and meta.shape == (3, out)
    with pytest.raises(ValueError, match=r"weight is \[40, 8\], expected \[40, 16\]"):
        torch.ops.torchtpu.int4_linear(
            torch.randn(1, 128), packed, scale, None, 32, out
        )

    src = cli.make_tiny(tmp_path / "dense", seed=3, dtype="bf16", ple=32)
    cli("quantize", src, tmp_path / "q", "--group", 32)
    for kwargs, weights in (
        ({"threads": 1, "int4": "composite"}, "composite"),
        ({}, "packed"),
        ({"int4": "dequantized"}, "dequantized"),
        ({"int4_activation_bits": 8}, "packed"),
        # Float32 activations take the dequantized product: 8 bits are not in effect.
        ({"int4_activation_bits": 8, "dtype": "float32"}, "packed"),
    ):
        report = tt.Engine(str(tmp_path / "q"), context=32, **kwargs).report()
        assert report["int4"]["weights"] == weights
        bits = 16 if kwargs.get("dtype") == "float32" else kwargs.get("int4_activation_bits", 16)
        assert report["int4"]["activation_bits"] == bits
        # Default: OMP_NUM_THREADS, which conftest.py sets.
        assert report["threads"] == kwargs.get("threads", int(os.environ["OMP_NUM_THREADS"]))
        linears = next(s for s in report["storage"] if s["family"] == "linears")
        assert ("int4(g32" in linears["format"]) == (weights != "dequantized"), linears
        assert ("8-bit activations" in linears["format"]) == (bits == 8), linears
    quantized = tt.Engine(src, context=32, quantize="int4").report()
    assert quantized["int4"]["quantized_at_load"] is True
    formats = {s["family"]: s["format"] for s in quantized["storage"]}
    assert (
        "quantized at load" in formats["linears"]
        and "quantized at load" in formats["lm_head"]
    )


@pytest.mark.parametrize(
    "env, expected",
    [("3", 3), ("2,1", 2), (None, "cores"), ("0", "cores"), ("many", "cores")],
)
def test_default_threads_follow_omp_num_threads(tiny, monkeypatch, env, expected):
    """threads=0 takes OMP_NUM_THREADS (OpenMP's list form: its first count) when it is a positive
    count, as libtorch does, and the physical cores otherwise."""
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    threads = tt.Engine(tiny, context=16, dtype="float32").report()["threads"]
    # Physical cores: one per (package, core id), as Linux lists them.
    cores = {
        (
            (cpu / "topology/physical_package_id").read_text(),
            (cpu / "topology/core_id").read_text(),
        )
        for cpu in pathlib.Path("/sys/devices/system/cpu").glob("cpu[0-9]*")
    }
    assert threads == (len(cores) if expected == "cores" else expected)
    tt.Engine(tiny, context=16, dtype="float32", threads=1)  # the process's threads back to 1


def test_file_errors_cross_as_value_and_file_not_found_errors(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="config.json"):  # FormatError
        tt.Engine(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):  # NotFoundError
        tt.Tokenizer(str(tmp_path / "tokenizer.json"))
    with pytest.raises(FileNotFoundError, match="is a directory: give the tokenizer.json in it"):
        tt.Tokenizer(str(tmp_path))


def test_generate_chat_flags_need_text_and_take_an_empty_prompt(cli, chat_tiny):
    for flag in (["--chat"], ["--system", "Be brief."], ["--think"]):
        out = subprocess.run([cli.path, "generate", "--model", chat_tiny, "--ids", "2", *flag],
                             capture_output=True, text=True)
        assert out.returncode != 0 and f"--ids excludes {flag[0]}" in out.stderr, out.stderr
    # An empty user turn is a prompt: the template's turn around it.
    out = cli("generate", "--model", chat_tiny, "--prompt", "", "--chat", "--max-new", 2, "--json")
    assert json.loads(out.stdout)["prompt_tokens"] > 3


def test_generate_stop_ends_the_text_where_a_stop_string_begins(cli, chat_tiny):
    """As a request's `stop`: the text before the string's first place, nothing from it on; the
    tokens up to the one that completed it; a string that never appears changes nothing."""
    run = lambda *flags: subprocess.run(
        [cli.path, "generate", "--model", chat_tiny, "--prompt", "Hello", "--max-new", "24",
         "--ignore-eos", *flags], capture_output=True, text=True)
    out = run("--json")
    assert out.returncode == 0, out.stderr
    full = json.loads(out.stdout)
    text = full["text"]
    assert len(text) >= 8 and full["stop"] is None, full
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = text.find(stop)
    out = run("--json", "--stop", "never appears in it", "--stop", stop)
    assert out.returncode == 0, out.stderr
    stopped = json.loads(out.stdout)
    assert (stopped["text"], stopped["finish"], stopped["stop"]) == (text[:cut], "stop", stop)
    assert stopped["tokens"] == full["tokens"][:len(stopped["tokens"])]
    assert len(stopped["tokens"]) < len(full["tokens"])
    # Read back in batches, the tokens past the stop are decoded but not the answer's. Batches of
    # 3, 5 and 7 cannot all end where the stop string does.
    for every in ("3", "5", "7"):
        batched = json.loads(run("--json", "--read-every", every, "--stop", stop).stdout)
        assert (batched["text"], batched["tokens"]) == (stopped["text"], stopped["tokens"]), every
    printed = run("--stop", stop)
    assert printed.returncode == 0 and printed.stdout == text[:cut] + "\n", printed
    assert "finish stop" in printed.stderr, printed.stderr
    unmatched = json.loads(run("--json", "--stop", "never appears in it").stdout)
    assert (unmatched["text"], unmatched["finish"]) == (text, full["finish"])

    out = run("--stop", "")
    assert out.returncode != 0 and "--stop: must not be empty" in out.stderr, out.stderr
    out = subprocess.run([cli.path, "generate", "--model", chat_tiny, "--ids", "2", "--stop", "x"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "--stop requires --prompt" in out.stderr, out.stderr


def test_generate_reads_a_prompt_from_stdin_and_takes_top_k_minus_one_as_off(cli, chat_tiny):
    """`--prompt -` is the bytes piped in, as they are; -1 is top_k's "off", as in a request."""
    run = lambda *flags, stdin=None: subprocess.run(
        [cli.path, "generate", "--model", chat_tiny, "--max-new", "6", "--json", *flags],
        input=stdin, capture_output=True, text=True)
    typed = json.loads(run("--prompt", "Hello there\n").stdout)
    piped = run("--prompt", "-", stdin="Hello there\n")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["prompt_ids"] == typed["prompt_ids"]
    sampled = ("--prompt", "hi", "--temperature", "1", "--seed", "3")
    off = run(*sampled, "--top-k", "0")
    minus_one = run(*sampled, "--top-k", "-1")
    assert minus_one.returncode == 0, minus_one.stderr
    assert json.loads(minus_one.stdout)["tokens"] == json.loads(off.stdout)["tokens"]
    refused = run(*sampled, "--top-k", "-2")
    assert refused.returncode == 2 and "top_k must be >= 0" in refused.stderr, refused.stderr


def test_every_usage_error_exits_2(cli, tmp_path):
    """CLI11's own errors exited with its codes (105 for a directory that is not there, 106 for a
    file, 109 for an unknown flag) where every other usage error exits 2."""
    for args in (["quantize", str(tmp_path / "missing"), str(tmp_path / "out")],
                 ["generate", "--no-such-flag"], ["generate", "--max-new", "many"]):
        out = subprocess.run([cli.path, *args], capture_output=True, text=True)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
    assert subprocess.run([cli.path, "generate", "--help"], capture_output=True).returncode == 0
    # A misspelled command is named, not "A subcommand is required".
    out = subprocess.run([cli.path, "serv", "--port", "0"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr == ("error: unknown command 'serv'; the commands are make-tiny, generate, "
                          "quantize, download, serve, bench, mcp, proxy, launch\n")


def test_generate_keeps_no_logits_for_the_tokens_it_decodes(cli, chat_tiny):
    """A step's logits are the vocabulary's floats (1 MiB here): kept for every step, whether or
    not --dump-logits asked for them, 600 tokens grew the process by 700 MB."""
    out = cli("generate", "--model", chat_tiny, "--ids", "2", "--max-new", 600, "--ignore-eos",
              "--json")
    report = json.loads(out.stdout)
    assert len(report["tokens"]) == 600
    grown = report["peak_rss_bytes"] - report["rss_after_load_bytes"]
    assert grown < 200 * 2**20, f"{grown / 2**20:.0f} MiB"


def test_generate_refuses_flags_that_would_do_nothing_or_fail_late(cli, tiny, tmp_path):
    """--image-tokens without an image would be ignored; a --dump-logits path in a directory that
    does not exist would fail only after the load and the decode."""
    run = lambda *flags: subprocess.run([cli.path, "generate", "--model", tiny, "--ids", "2,3",
                                         "--max-new", "2", *flags], capture_output=True, text=True)
    out = run("--image-tokens", "70")
    assert out.returncode != 0 and "--image-tokens requires --image" in out.stderr, out.stderr
    dump = tmp_path / "missing" / "logits.safetensors"
    out = run("--dump-logits", str(dump))
    assert out.returncode != 0, out.stderr
    assert f"error: --dump-logits {dump}: the directory {dump.parent} does not exist" in out.stderr
    assert "finish" not in out.stderr  # nothing was decoded
    written = tmp_path / "logits.safetensors"
    assert run("--dump-logits", str(written)).returncode == 0 and written.is_file()
    # A seed is an int64 at least 0, as a request's: -1 (llama.cpp's "random") and 2^64 were
    # taken as 2^64 - 1, all three giving the same tokens.
    for seed in ("-1", str(2**64)):
        out = run("--temperature", "1", "--seed", seed)
        assert out.returncode != 0 and "--seed" in out.stderr, (seed, out.stderr)
    assert run("--temperature", "1", "--seed", str(2**63 - 1)).returncode == 0


def test_make_tiny_writes_a_new_or_empty_directory_whole_or_not_at_all(cli, tmp_path):
    """Over another checkpoint its index and shards were left and read in place of the new
    weights; a refused spec left a directory holding only config.json."""
    out = tmp_path / "sharded"
    cli.make_tiny(out, seed=1, shards=3)
    written = sorted(p.name for p in out.iterdir())
    again = subprocess.run([cli.path, "make-tiny", str(out), "--seed", "2"],
                           capture_output=True, text=True)
    assert again.returncode != 0, again.stderr
    assert f"make-tiny: OUT {out} exists and is not an empty directory" in again.stderr
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        tt.make_tiny(str(out), seed=2)
    assert sorted(p.name for p in out.iterdir()) == written
    for flags, message in ((["--window", "0"], "window"), (["--layers", "0"], "at least 1 layer")):
        refused = subprocess.run([cli.path, "make-tiny", str(tmp_path / "refused"), *flags],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sharded"]  # nor anything staged
    empty = tmp_path / "empty"
    empty.mkdir()
    cli.make_tiny(empty, seed=2)
    assert (empty / "config.json").is_file()


def test_an_integer_tensor_for_a_weight_is_refused(tiny, tmp_path):
    """Its bits read as numbers would make another model: the loader names the tensor."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "ints"
    shutil.copytree(tiny, bad)
    name = "model.language_model.layers.0.input_layernorm.weight"
    for path in bad.glob("*.safetensors"):
        tensors = load_file(path)
        if name in tensors:
            tensors[name] = tensors[name].view(torch.int32)
            save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"tensor {name} in .* has dtype I32, not a floating"):
        tt.Engine(str(bad), context=16, dtype="float32")


def test_a_missing_directory_is_file_not_found(tiny, tmp_path):
    missing = str(tmp_path / "missing")
    for kwargs, words in (
        ({"model_dir": missing}, "checkpoint directory"),
        ({"model_dir": tiny, "draft_model": missing}, "checkpoint directory"),
        ({"model_dir": tiny, "lora": [missing]}, "LoRA adapter directory"),
    ):
        with pytest.raises(FileNotFoundError, match=f"{words} {missing} does not exist"):
            tt.Engine(**kwargs, context=16, dtype="float32")
    config = f"{tiny}/config.json"
    with pytest.raises(FileNotFoundError, match=f"^checkpoint directory {config} is a file: give "
                       "the directory that holds config.json$"):
        tt.Engine(config, context=16, dtype="float32")


def _available_memory():
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_a_kv_cache_beyond_the_memory_is_refused_before_it_is_made(cli, tiny, tmp_path,
                                                                    test_tokenizer_dir):
    """The rings a context needs are measured against the memory available before any is made:
    the engine's own row when it is built (it makes it only for its first decode), a batch's
    rows when the batch is, and serve's at start, each naming what it needs."""
    huge = 2**40
    need = (r"needs \d+ MiB, more than 90% of the \d+ MiB of memory available: lower the "
            r"context or the rows decoded together")
    with pytest.raises(ValueError, match=rf"^the KV cache of 1 row at a context of {huge} tokens {need}$"):
        tt.Engine(tiny, context=huge, dtype="float32")
    # One row in about a quarter of what is available, eight in twice that: the engine is built
    # (its row is not made yet), its batch of eight rows is refused. Past the sliding window only
    # the full rings grow with the context.
    window = _text_config(tiny)[0]["sliding_window"]
    per_position = _row_bytes(tiny, window + 1) - _row_bytes(tiny, window)
    context = _available_memory() // 4 // per_position
    roomy = tt.Engine(tiny, context=context, dtype="float32")
    with pytest.raises(ValueError, match=rf"^the KV cache of 8 rows at a context of {context} tokens {need}$"):
        roomy.batch(rows=8)
    out = subprocess.run([cli.path, "serve", "--model", tiny, "--port", "0", "--context", str(huge)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert re.search(rf"error: the KV cache of 1 row at a context of {huge} tokens {need}", out.stderr), out.stderr
    # serve counts its --parallel rows before its warm-up makes any ring: an error and exit 2,
    # not an abort once the rows are half made (nor a warm-up's row of a quarter of the memory).
    served = cli.make_tiny(tmp_path / "served", tokenizer=test_tokenizer_dir)
    assert _row_bytes(served, window + 1) - _row_bytes(served, window) == per_position
    out = subprocess.run([cli.path, "serve", "--model", served, "--port", "0", "--context",
                          str(context), "--parallel", "8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr)  # a ValueError's, as for bad flags
    assert re.search(rf"error: the KV cache of 8 rows at a context of {context} tokens {need}", out.stderr), out.stderr
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 < _available_memory() // 8


def test_a_tokenizer_with_more_ids_than_the_model_is_named(cli, tiny, tmp_path, test_tokenizer_dir):
    """make-tiny sizes the vocabulary to the tokenizer it copies; a checkpoint whose tokenizer
    gives ids past its embeddings is refused where text meets the model, naming both sizes."""
    fitted = pathlib.Path(cli.make_tiny(tmp_path / "fitted", tokenizer=test_tokenizer_dir))
    config = json.loads((fitted / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == 262144
    small = subprocess.run(
        [cli.path, "make-tiny", tmp_path / "small", "--vocab", "512",
         "--tokenizer", test_tokenizer_dir], capture_output=True, text=True)
    assert small.returncode == 2
    assert "--vocab 512 is smaller than the 262144 ids of" in small.stderr
    assert not (tmp_path / "small").exists()
    mismatched = tmp_path / "mismatched"
    shutil.copytree(tiny, mismatched)
    shutil.copy(test_tokenizer_dir / "tokenizer.json", mismatched)
    message = "has 262144 token ids but the model's vocab_size is 512"
    out = subprocess.run([cli.path, "generate", "--model", mismatched, "--prompt", "Hi",
                          "--max-new", "2"], capture_output=True, text=True)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    engine = tt.Engine(str(mismatched), context=16, dtype="float32")
    with pytest.raises(ValueError, match=message):
        engine.decode([2], 2, grammar_kind="json_object")


def test_like_names_the_device(tiny):
    assert (
        tt.Engine(tiny, like=torch.zeros(1), context=16, dtype="float32").device
        == "cpu"
    )
    # "meta" names a device on every machine (cuda:0 would be refused first where there is none).
    with pytest.raises(ValueError, match="disagree"):
        tt.Engine(tiny, like=torch.zeros(1, device="meta"), device="cpu")
    with pytest.raises(TypeError, match="torch.Tensor"):
        tt.Engine(tiny, like=[0.0])


# --- 2. a callback exception propagates ------------------------------------------------------------


class Boom(Exception):
    pass


def test_callback_exception_propagates(engine):
    seen = []

    def on_tokens(batch):
        seen.append(batch)
        if len(seen) == 2:
            raise Boom("from the callback")
        return True

    with pytest.raises(Boom, match="from the callback") as info:
        engine.decode(_prompt(6), 20, stop=(), on_tokens=on_tokens)
    assert len(seen) == 2  # the decode ended at the failing batch
    assert (
        info.traceback[-1].name == "on_tokens"
    )  # the callback's own frame, not a re-wrap
    assert len(engine.decode(_prompt(6), 5, stop=()).tokens) == 5


def test_callback_errors_in_truth_value_propagate(engine):
    class NoTruth:
        def __bool__(self):
            raise Boom("no truth value")

    with pytest.raises(Boom, match="no truth value"):
        engine.decode(_prompt(6), 5, stop=(), on_tokens=lambda b: NoTruth())
    with pytest.raises(TypeError, match="callable"):
        engine.decode(_prompt(6), 5, on_tokens=42)


# --- 3. cancel and length ---------------------------------------------------------------------------


def test_cancel_and_length(engine):
    full = engine.decode(_prompt(6), 12, stop=())
    assert full.finish == "length"
    assert len(full.tokens) == 12
    assert full.stop_id is None
    assert full.prompt_tokens == 6

    batches = []
    cancelled = engine.decode(
        _prompt(6),
        12,
        stop=(),
        read_every=3,
        on_tokens=lambda b: batches.append(b) or len(batches) < 2,
    )
    assert cancelled.finish == "cancelled"
    assert batches == [
        full.tokens[:1],
        full.tokens[1:4],
    ]  # the first token is read at once
    assert cancelled.tokens == full.tokens[:4]

    falsy = engine.decode(_prompt(6), 12, stop=(), on_tokens=lambda b: None)
    assert falsy.finish == "cancelled"
    assert falsy.tokens == full.tokens[:1]
    assert all(isinstance(t, int) for t in full.tokens)


# --- 4. decode stops at stop ids and streams -----------------------------------------------------


def test_decode_stops_and_streams(engine):
    ids = _prompt(9, seed=4)
    tokens, _, _ = engine.generate(ids, 24)
    stop = tokens[5]
    first = tokens.index(stop)

    for read_every in (1, 4):
        streamed = []
        result = engine.decode(
            ids,
            24,
            stop=[stop],
            read_every=read_every,
            on_tokens=lambda b, seen=streamed: seen.append(b) or True,
        )
        assert result.finish == "stop"
        assert result.stop_id == stop
        assert result.tokens == tokens[:first]
        assert [t for b in streamed for t in b] == result.tokens
        assert all(1 <= len(b) <= read_every for b in streamed)
        assert result.read_s > 0 and result.decode_s >= 0

    # The default stop ids are the Gemma 4 eos list; None means the checkpoint's own (the same here).
    assert engine.eos_token_ids == [1, 106, 50]
    default = engine.decode(ids, 24)
    by_checkpoint = engine.decode(ids, 24, stop=None)
    assert default.tokens == by_checkpoint.tokens
    assert not set(default.tokens) & {1, 106, 50}


def test_drafts_give_the_tokens_of_plain_decoding(engine):
    """Speculative decoding by prompt lookup: the same tokens and stop, the drafts counted, with
    every draft checked (draft_always) and as the engine's timing chooses."""
    part = _prompt(7, seed=6)[1:]
    ids = [2] + part + part + part[:2]
    drafts = {"draft_max": 4, "draft_ngram_min": 1, "draft_always": True}
    for sampling in ({}, {"temperature": 0.8, "top_k": 40, "seed": 5}):
        plain = engine.decode(ids, 40, stop=(), **sampling)
        drafted = engine.decode(ids, 40, stop=(), **drafts, **sampling)
        assert drafted.tokens == plain.tokens, sampling
        assert plain.drafted == plain.accepted == 0
        assert 0 < drafted.drafted and 0 <= drafted.accepted <= drafted.drafted
        gated = engine.decode(ids, 40, stop=(), **{**drafts, "draft_always": False}, **sampling)
        assert gated.tokens == plain.tokens, sampling
        stop = plain.tokens[len(plain.tokens) // 2]
        stopped = engine.decode(ids, 40, stop=[stop], **drafts, **sampling)
        assert stopped.finish == "stop"
        assert stopped.tokens == plain.tokens[: plain.tokens.index(stop)]
        # Several sequences drafting together in a batch: each gets its tokens alone.
        many = engine.batch(rows=2).decode_many([ids, ids[:-3]], 40, stop=(), **drafts, **sampling)
        assert many[0].tokens == plain.tokens, sampling
        assert many[1].tokens == engine.decode(ids[:-3], 40, stop=(), **sampling).tokens
        assert sum(r.drafted for r in many) > 0


# --- 5. the GIL is released during decode --------------------------------------------------------


def test_gil_released_during_decode(tiny):
    engine = tt.Engine(tiny, context=512, dtype="float32")
    # One host read at the very end: the GIL is taken back once, after the work.
    (tokens, _, _), during, start, end = ticks_while(
        lambda: engine.generate(_prompt(8), 400, read_every=400)
    )
    assert len(tokens) == 400
    gaps = [b - a for a, b in zip([start] + during, during + [end])]
    # Holding the GIL would leave the ticker one gap as long as the whole call.
    assert len(during) > 1000
    assert max(gaps) < 0.5 * (end - start)


# --- 6. module surface ------------------------------------------------------------------------------


def _text_config(tiny):
    """The checkpoint's text config and the layer types of the layers that own a ring."""
    config = json.loads(pathlib.Path(tiny, "config.json").read_text())
    text = config.get("text_config", config)
    types = text["layer_types"]
    return text, types[: len(types) - text["num_kv_shared_layers"]]


def _row_bytes(tiny, context):
    """One row of every ring at float32: per slot, k and v of kv_heads × head_dim values and an
    int64 position; full rings have `context` slots, sliding ones the window at most."""
    text, own = _text_config(tiny)
    slot = lambda head_dim: 2 * text["num_key_value_heads"] * head_dim * 4 + 8
    full = context * slot(text["global_head_dim"])
    sliding = min(text["sliding_window"], context) * slot(text["head_dim"])
    return own.count("full_attention") * full + own.count("sliding_attention") * sliding


def test_module_surface(engine, tiny):
    assert set(tt.BUILD) >= {
        "torch",
        "compiler",
        "cxx_standard",
        "python",
        "version",
        "git_revision",
    }
    assert tt.BUILD["torch"] == str(torch.__version__)
    assert tt.BUILD["version"] == tt.__version__
    assert tt.BUILD["python"].split(".")[:2] == [str(v) for v in sys.version_info[:2]]
    assert tt.BUILD["cxx_standard"] == "C++20"
    assert tt.BUILD["cxx11_abi"] == torch._C._GLIBCXX_USE_CXX11_ABI

    text, own = _text_config(tiny)
    assert engine.layout() == {
        "full_rings": own.count("full_attention"),
        "sliding_rings": own.count("sliding_attention"),
        "shared_layers": text["num_kv_shared_layers"],
        "context": CONTEXT,
        "row_bytes": _row_bytes(tiny, CONTEXT),
    }
    assert engine.vocab_size == text["vocab_size"]
    assert engine.device == "cpu"
    assert engine.dtype == "float32"
    assert engine.report()["layout"] == engine.layout()


def test_version_guard_names_both_versions():
    code = (
        "import torch\n"
        "real = torch.__version__\n"
        "torch.__version__ = '2.0.0+elsewhere'\n"
        "try:\n"
        "    import torchtpu_cpp\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ImportError:" in out.stdout
    assert "2.0.0+elsewhere" in out.stdout
    assert str(torch.__version__) in out.stdout


def test_errors_are_mapped_by_this_module():
    """c10::ValueError from a TORCH_CHECK_VALUE inside our module is ValueError, without the C++
    backtrace; c10::Error from ATen is RuntimeError."""
    with pytest.raises(ValueError, match="2-D tensor, got 1 dimensions") as info:
        tt.matmul_sum(torch.ones(3))
    assert "Exception raised from" not in str(info.value)
    with pytest.raises(RuntimeError):
        tt.matmul_sum(torch.ones(3, 4, dtype=torch.int64).to(torch.bool))
    with pytest.raises(ValueError, match="n >= 0"):
        tt.ramp(-1)


# --- 7. tensor functions ----------------------------------------------------------------------------


def _devices():
    """The CPU, plus TORCHTPU_TEST_DEVICE (cuda:0, tpu) where the machine has one."""
    extra = os.environ.get("TORCHTPU_TEST_DEVICE")
    return ["cpu"] + ([extra] if extra else [])


@pytest.mark.parametrize("device", _devices())
def test_tensor_functions(device):
    if device.startswith("tpu"):
        import torch_tpu  # noqa: F401  (registers the device)
    x = torch.ones(8, 8, device=device)
    total = tt.matmul_sum(x)
    assert total.item() == 512.0
    assert total.device == x.device and total.dim() == 0

    b = torch.full((4, 4), 0.5, dtype=torch.bfloat16, device=device)
    assert tt.matmul_sum(b).dtype == torch.bfloat16

    like = torch.zeros(1, device=device)
    made = tt.ramp(5, like=like, dtype=torch.bfloat16)
    assert made.dtype == torch.bfloat16
    assert made.device == like.device
    assert made.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert tt.ramp(3, dtype="float32").dtype == torch.float32

    # Python -> C++: C++ writes into the tensor Python holds, and hands back the same object.
    y = torch.zeros(4, dtype=torch.bfloat16, device=device)
    pointer = y.data_ptr()
    back = tt.add_(y, 1.5)
    assert back is y
    assert y.tolist() == [1.5] * 4 and y.data_ptr() == pointer
    # C++ -> Python: a tensor C++ built is the memory C++ writes later; a view Python took sees it.
    view = made[1:3]
    tt.add_(made, 10)
    assert view.tolist() == [11.0, 12.0]
    assert tt.add_(view, 1) is view and made.tolist() == [10.0, 12.0, 13.0, 13.0, 14.0]


def test_logits_share_storage_with_the_aten_result(engine):
    out = engine.logits([2, 7, 9])
    assert out.dtype == torch.float32 and out.shape == (3, engine.vocab_size)
    # The engine computes under c10::InferenceMode; the tensor Python gets is that very result,
    # not a converted copy, so it is still an inference tensor and C++ writes into what Python sees.
    assert out.is_inference()
    before = out.clone()
    with torch.inference_mode():
        assert tt.add_(out, 1) is out
    assert torch.equal(out, before + 1)


# --- 8. one owner thread ----------------------------------------------------------------------------


def test_owner_thread_rule(engine, tiny):
    for call in (
        lambda: engine.decode([2, 5], 3),
        lambda: engine.generate([2, 5], 3),
        lambda: engine.logits([2, 5]),
        lambda: engine.layout(),
    ):
        box = in_thread(call)
        assert type(box.get("error")) is RuntimeError, box
        message = str(box["error"])
        assert "intruder" in message and threading.current_thread().name in message
    assert engine.owner_thread == threading.current_thread().name
    assert len(engine.generate([2, 5], 3)[0]) == 3  # the owner is unaffected

    # An engine made on another thread belongs to that thread.
    box = in_thread(lambda: tt.Engine(tiny, context=16, dtype="float32"), name="owner")
    other = box["value"]
    with pytest.raises(RuntimeError, match="owner"):
        other.layout()


def test_no_reentrant_calls_from_callbacks(engine):
    def on_tokens(batch):
        engine.logits([2, 5])

    with pytest.raises(RuntimeError, match="decoding"):
        engine.decode(_prompt(6), 5, on_tokens=on_tokens)
    # Reading properties from a callback is fine.
    seen = []
    engine.decode(
        _prompt(6),
        3,
        stop=(),
        on_tokens=lambda b: seen.append(engine.vocab_size) or True,
    )
    assert seen and set(seen) == {engine.vocab_size}


# --- against the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lm-prefix-dead-kv", "e2b-pattern-dead-kv"])
def test_logits_match_reference_f32(name, cli, tmp_path, report):
    knobs = hf_tiny.MAKE_TINY_CONFIGS[name]
    assert knobs["dtype"] == "f32"
    path = cli.make_tiny(tmp_path / name, preset="tiny", **knobs)
    ref = Reference(path)
    ids = _prompt(knobs["window"] + 9, seed=31, vocab=knobs["vocab"])
    engine = tt.Engine(path, context=128, dtype="float32")
    got = engine.logits(ids)
    assert got.dtype == torch.float32 and got.shape == (len(ids), knobs["vocab"])
    delta = float((got.double() - torch.from_numpy(ref.logits(ids))).abs().max())
    report(
        f"Engine.logits f32 vs reference [{name}]: max|dlogit| {delta:.2e} over {len(ids)} tokens"
    )
    assert delta <= hf_tiny.TOL

    # generate batches host reads; the tokens are the reference's greedy ones either way.
    want = ref.greedy(ids, 16)
    assert engine.generate(ids, 16, read_every=1)[0] == want
    assert engine.generate(ids, 16, read_every=8)[0] == want
    assert engine.generate(ids, 16, read_every=5)[0] == want


# --- the text layer ------------------------------------------------------------------------------

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnewlines  ",
    "naïve café, 東京, emoji 🙂, Ελληνικά",
    "<start_of_turn>user\nspecial tokens inline<end_of_turn>",
    "",
]


def test_tokenizer_crosses_like_hf_tokenizers(test_tokenizer_dir):
    from tokenizers import Tokenizer as HfTokenizer

    path = str(test_tokenizer_dir / "tokenizer.json")
    ours, hf = tt.Tokenizer(path), HfTokenizer.from_file(path)
    assert ours.vocab_size == len(ours) == hf.get_vocab_size(with_added_tokens=True)
    for text in TEXTS:
        for special in (False, True):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == hf.encode(text, add_special_tokens=special).ids
            assert isinstance(ids, list)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                    ids, skip_special_tokens=skip
                )
    assert ours.token_to_id("<bos>") == hf.token_to_id("<bos>")
    assert ours.token_to_id("no such token \u2603") is None
    assert ours.id_to_token(2) == hf.id_to_token(2)
    with pytest.raises(ValueError):
        ours.decode([ours.vocab_size])
    with pytest.raises(ValueError, match=r"ids\[0\]"):
        ours.decode(["1"])
    with pytest.raises(FileNotFoundError):
        tt.Tokenizer(str(test_tokenizer_dir / "missing.json"))


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def test_render_chat_matches_transformers(test_tokenizer_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(test_tokenizer_dir))
    template = tt.ChatTemplate(str(test_tokenizer_dir))
    for tools in (None, TOOLS):
        for thinking in (False, True):
            want = reference.apply_chat_template(
                MESSAGES,
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
                enable_thinking=thinking,
            )
            assert (
                tt.render_chat(
                    MESSAGES, tools, thinking, template=str(test_tokenizer_dir)
                )
                == want
            )
            assert template.render(MESSAGES, tools, True, thinking) == want
    file_template = tt.ChatTemplate(str(test_tokenizer_dir / "chat_template.jinja"))
    assert file_template.source == template.source
    assert tt.render_chat(
        MESSAGES, template=file_template
    ) == reference.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )


def test_render_chat_keeps_key_order_and_rejects_non_json():
    template = tt.ChatTemplate.from_string(
        "{% for m in messages %}{{ m | tojson }}|{% endfor %}{{ extra }}"
        "{% if enable_thinking %}T{% endif %}"
    )
    messages = [{"role": "user", "zeta": 1, "alpha": [True, None], "content": "x"}]
    out = tt.render_chat(messages, enable_thinking=True, template=template, extra="E")
    assert out.startswith(
        '{"role": "user", "zeta": 1, "alpha": [true, null], "content": "x"}|'
    )
    assert out.endswith("ET")
    with pytest.raises(ValueError, match="messages must be JSON"):
        tt.render_chat([{"role": "user", "content": object()}], template=template)
    with pytest.raises(ValueError, match="messages must be JSON"):
        tt.render_chat([{"role": "user", "content": float("nan")}], template=template)
    with pytest.raises(ValueError, match=r"^messages must be valid Unicode text \(a lone surrogate\?\): "
                       r"parse error at line 1, column \d+: .*surrogate U\+D800"):
        template.render([{"role": "user", "content": "a\ud800b"}])
    with pytest.raises(TypeError, match="template must be"):
        tt.render_chat(messages, template=3)


def test_a_thinking_budget_closes_the_block_for_the_model(cli, tmp_path, test_tokenizer_dir):
    """thinking_budget=N (the server's thinking_token_budget): once N tokens follow <|channel>,
    here opened by the prompt as Gemma 4's template opens it after a tool result, the next token
    is <channel|> (after thinking_budget_message's, when given), alone and in a Batch; None
    leaves the model free."""
    model = cli.make_tiny(
        tmp_path / "tok", seed=2, dtype="f32", vocab=262144, tokenizer=test_tokenizer_dir
    )
    engine = tt.Engine(model, context=256, dtype="float32")
    tokenizer = tt.Tokenizer(str(test_tokenizer_dir / "tokenizer.json"))
    prompt = tokenizer.encode("<bos>Rain?<|channel>thought\n")
    close = tokenizer.encode("<channel|>")[0]
    free = engine.decode(prompt, 8, stop=()).tokens
    assert close not in free
    # "thought" and "\n" are two of the budget's four tokens.
    capped = engine.decode(prompt, 8, stop=(), thinking_budget=4).tokens
    assert capped[:2] == free[:2] and capped[2] == close
    assert engine.decode(prompt, 8, stop=(), thinking_budget=0).tokens[0] == close
    batch = engine.batch(rows=2)
    ids = [batch.submit(prompt, 8, stop=(), thinking_budget=4), batch.submit(prompt, 8, stop=())]
    results = {}
    while not batch.idle:
        for done in batch.step():
            results[done] = batch.result(done).tokens
    assert [results[i] for i in ids] == [capped, free]
    with pytest.raises(ValueError, match="thinking_budget must be at least 0, got -1"):
        engine.decode(prompt, 4, thinking_budget=-1)

    # thinking_budget_message (llama.cpp's --reasoning-budget-message): its tokens, as Hugging
    # Face tokenizers encodes the text, are written before the block is closed.
    from tokenizers import Tokenizer as HfTokenizer

    message = " Enough thinking, time to answer."
    expected = HfTokenizer.from_file(str(test_tokenizer_dir / "tokenizer.json")).encode(
        message, add_special_tokens=False
    ).ids
    told = engine.decode(
        prompt, len(expected) + 4, stop=(), thinking_budget=4, thinking_budget_message=message
    ).tokens
    assert told[:2] == free[:2]
    assert told[2 : 2 + len(expected)] == expected
    assert told[2 + len(expected)] == close
    with pytest.raises(ValueError, match="thinking block's marker .*: it would close it early"):
        engine.decode(prompt, 4, thinking_budget=4, thinking_budget_message="Stop.<channel|>")
    with pytest.raises(ValueError, match="give a thinking_budget too"):
        engine.decode(prompt, 4, thinking_budget_message="Stop.")


def test_an_engine_sleeps_and_wakes(cli, tmp_path):
    """Engine.sleep() frees the weights (the server's --sleep-idle-seconds) while its properties
    still answer; what runs the model is a RuntimeError until wake(), which gives the tokens of
    before. A live Batch keeps the engine awake."""
    model = cli.make_tiny(tmp_path / "m", seed=3, dtype="f32")
    engine = tt.Engine(model, context=64, dtype="float32")
    before = engine.decode([2, 3, 4], 5, stop=()).tokens
    vocab = engine.vocab_size
    batch = engine.batch(rows=1)
    with pytest.raises(RuntimeError, match=r"while 1 Batch\(es\) of this engine are alive"):
        engine.sleep()
    del batch
    engine.sleep()
    assert engine.asleep and engine.vocab_size == vocab
    with pytest.raises(RuntimeError, match="the engine is asleep: wake"):
        engine.decode([2, 3, 4], 5, stop=())
    with pytest.raises(RuntimeError, match="called while the engine sleeps"):
        engine.batch(rows=1)
    engine.wake()
    assert not engine.asleep
    assert engine.decode([2, 3, 4], 5, stop=()).tokens == before


def _caps_by_transformers(reference, source):
    """ChatTemplate.caps' probes (the spec of llama.cpp's chat_template_caps: a probe
    conversation is rendered and its marker text looked for), rendered by transformers."""

    def prompt(messages, tools=None, **kwargs):
        try:
            return reference.apply_chat_template(
                messages, tools=tools, tokenize=False, chat_template=source, **kwargs
            )
        except Exception:  # noqa: BLE001 - a template that raises does not support the probe
            return ""

    def shows(messages, tools, *markers):
        text = prompt(messages, tools)
        return all(marker in text for marker in markers)

    user = {"role": "user", "content": "Hey"}
    parameters = {
        "type": "object",
        "properties": {"arg": {"type": "string"}},
        "required": ["arg"],
    }
    tools = [
        {
            "type": "function",
            "function": {"name": "probe_tool", "description": "A probe", "parameters": parameters},
        }
    ]

    def call(id_, arg):
        function = {"name": "probe_tool", "arguments": {"arg": arg}}
        return {"id": id_, "type": "function", "function": function}

    one_call = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "reasoning marker",
        "tool_calls": [call("call_probe_1", "call marker")],
    }
    two_calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("call_probe_1", "first marker"), call("call_probe_2", "second marker")],
    }
    response = {
        "role": "tool",
        "tool_call_id": "call_probe_1",
        "name": "probe_tool",
        "content": "response marker",
    }
    after_call = [user, one_call, response]
    system = [{"role": "system", "content": "system marker"}, user]
    return {
        "supports_system_role": shows(system, None, "system marker"),
        "supports_tools": shows([user], tools, "probe_tool"),
        "supports_tool_calls": shows(after_call, tools, "call marker"),
        "supports_tool_responses": shows(after_call, tools, "response marker"),
        "supports_parallel_tool_calls": shows(
            [user, two_calls], tools, "first marker", "second marker"
        ),
        "supports_tool_call_id": shows(after_call, tools, "call_probe_1"),
        "supports_preserve_reasoning": shows(after_call, tools, "reasoning marker"),
        "supports_reasoning_effort": prompt([user], reasoning_effort="high")
        != prompt([user], reasoning_effort="low"),
    }


def test_template_caps_are_what_transformers_renders_of_the_probes(test_tokenizer_dir):
    """ChatTemplate.caps() (the server's /props chat_template_caps) for Gemma 4's templates and
    templates that lack one kind of content or another equals the same probes rendered by
    transformers; across them every cap is seen both true and false."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(test_tokenizer_dir))
    data = pathlib.Path(__file__).parents[2] / "data/gemma4"
    sources = [tt.ChatTemplate(str(test_tokenizer_dir)).source]
    sources += [p.read_text() for p in sorted(data.glob("chat_template.*.jinja"))]
    sources += [
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
        "{% endif %}{{ m.content }}{% endfor %}",
        "{% for m in messages if m.role != 'tool' %}{{ m.content }}{% for c in m.tool_calls or [] "
        "%}[{{ c.id }} {{ c.function.arguments | tojson }}]{% endfor %}{% endfor %}"
        "{{ reasoning_effort }}",
    ]
    seen = {}
    for source in sources:
        caps = tt.ChatTemplate.from_string(source).caps()
        assert caps == _caps_by_transformers(reference, source), source[:80]
        for name, value in caps.items():
            seen.setdefault(name, set()).add(value)
    assert all(values == {True, False} for values in seen.values()), seen


def _binding_parameters(obj):
    """Parameter names in the signature line pybind11 writes atop a binding's docstring."""
    head = obj.__doc__.lstrip().split("\n", 1)[0]
    depth, current, parts = 0, "", []
    for ch in head[head.index("(") + 1 :]:
        if ch in ")]}" and depth == 0:
            parts.append(current)
            break
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts, current = parts + [current], ""
        else:
            current += ch
    names = [part.split(":")[0].split("=")[0].strip() for part in parts]
    return [name for name in names if name not in ("", "self", "*")]


def test_the_type_stubs_name_every_parameter_of_the_bindings():
    """__init__.pyi is what editors and type checkers see: every function and method it declares
    exists and takes the parameters the binding takes, in order (a parameter added to a binding
    and not to the stub fails here)."""
    import ast

    stub = pathlib.Path(tt.__file__).with_name("__init__.pyi")
    checked = []

    def check(owner, function, name):
        binding = getattr(owner, function.name)
        if "Overloaded function" in (binding.__doc__ or ""):
            return
        a = function.args
        declared = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != "self"]
        declared += ["**" + a.kwarg.arg] if a.kwarg else []
        assert _binding_parameters(binding) == declared, name
        checked.append(name)

    declared = set()  # public names the stub gives the package and its classes
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            check(tt, node, node.name)
            declared.add(node.name)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            # A class the stub declares is one the package exports (not only the extension).
            assert hasattr(tt, node.name), f"the stub declares {node.name}; the package lacks it"
            declared.add(node.name)
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    declared.add(node.name + "." + f.name)
                    if "property" not in map(ast.unparse, f.decorator_list):
                        check(getattr(tt, node.name), f, node.name + "." + f.name)
    assert {"Engine.decode", "Batch.submit", "Batch.decode_many", "Engine.__init__"} <= set(checked)
    # The other way: everything the package exports, and every public method and property of
    # its classes, is in the stub.
    exported = set()
    for name in tt.__all__:
        value = getattr(tt, name)
        if callable(value) or isinstance(value, type):
            exported.add(name)
        if isinstance(value, type):
            exported |= {f"{name}.{m}" for m in vars(value) if not m.startswith("_")}
    missing = sorted(exported - declared)
    assert not missing, f"exported but not in __init__.pyi: {missing}"


def test_decode_follows_a_grammar(cli, tmp_path, test_tokenizer_dir):
    """grammar_kind + grammar constrain the tokens (issue #18): on random weights every sampled
    reply is valid for the schema (checked with jsonschema), and what llguidance cannot enforce
    is a ValueError naming it."""
    import jsonschema

    model = cli.make_tiny(
        tmp_path / "tok", seed=2, dtype="f32", vocab=262144, tokenizer=test_tokenizer_dir
    )
    engine = tt.Engine(model, context=256, dtype="float32")
    tokenizer = tt.Tokenizer(str(test_tokenizer_dir / "tokenizer.json"))
    prompt = tokenizer.encode("<bos>JSON:")
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "level": {"enum": ["low", "mid", "high"]},
        },
        "required": ["ok", "n", "level"],
        "additionalProperties": False,
    }
    for seed in range(3):
        r = engine.decode(
            prompt, 64, temperature=1.0, seed=seed,
            grammar_kind="json_schema", grammar=json.dumps(schema),
        )
        assert r.finish == "stop"
        jsonschema.validate(json.loads(tokenizer.decode(r.tokens)), schema)
    digits = engine.decode(prompt, 16, grammar_kind="regex", grammar="[0-9]{3}")
    assert digits.finish == "stop"
    assert len(tokenizer.decode(digits.tokens)) == 3 and tokenizer.decode(digits.tokens).isdigit()
    with pytest.raises(ValueError, match="uniqueItems"):
        engine.decode(prompt, 4, grammar_kind="json_schema", grammar='{"uniqueItems": true}')
    with pytest.raises(ValueError, match="grammar_kind 'xml'"):
        engine.decode(prompt, 4, grammar_kind="xml")
    with pytest.raises(ValueError, match="ignore_eos"):
        engine.decode(prompt, 4, stop=(), grammar_kind="json_object")
