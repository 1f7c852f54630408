"""The engine against the own float64 reference (tests/reference), and the reference itself against
transformers and compressed-tensors first, so that a disagreement is known to be the engine's."""

import json
import os
import shutil

import hf_tiny
import numpy as np
import pytest
import torch
from hf_tiny import N_NEW, TOL
from reference import Reference
from reference.pack_quant import dequantize


def _prompts(window, vocab, seed):
    """Prompts shorter than, equal to and longer than the sliding window."""
    return {
        "short": hf_tiny.prompt(vocab, max(2, window - 3), seed),
        "equal": hf_tiny.prompt(vocab, window, seed + 1),
        "long": hf_tiny.prompt(vocab, window + 9, seed + 2),
    }


# --- the reference, validated --------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(hf_tiny.HF_CONFIGS))
def hf_checkpoint(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    hf_tiny.make_named(request.param, out)
    return request.param, str(out)


def test_reference_matches_transformers(hf_checkpoint, report):
    name, path = hf_checkpoint
    model = hf_tiny.load(path)
    ref = Reference(path)
    cfg = model.config.get_text_config()
    worst = 0.0
    for ids in _prompts(cfg.sliding_window, cfg.vocab_size, seed=10).values():
        worst = max(worst, float(np.abs(ref.logits(ids) - hf_tiny.logits(model, ids)).max()))
    ids = _prompts(cfg.sliding_window, cfg.vocab_size, seed=20)["long"]
    tokens = ref.greedy(ids, N_NEW)
    hf_tokens = hf_tiny.greedy(model, ids, N_NEW)
    rows = ref.logits(ids + tokens)[len(ids) - 1 : -1]
    margin = hf_tiny.greedy_margins(rows).min()
    agree = sum(a == b for a, b in zip(tokens, hf_tokens))
    report(
        f"reference f64 vs transformers f32 [{name}]: max|dlogit| {worst:.2e}, "
        f"greedy {agree}/{N_NEW}, min margin {margin:.3f}, distinct tokens {len(set(tokens))}"
    )
    assert worst <= 2e-4
    hf_tiny.check_greedy(name, hf_tokens, tokens, rows)


def test_reference_reads_sharded_and_f16(tmp_path):
    """The sharded F16 config really is sharded through an index (the math is proven above)."""
    hf_tiny.make_named("causal-f16-sharded-unshared", tmp_path)
    with open(tmp_path / "model.safetensors.index.json") as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) > 1


def test_reference_ignores_dead_shared_kv(tmp_path):
    """Garbage k_proj/v_proj/k_norm on KV-shared layers (as on the hub) change nothing."""
    from safetensors.torch import load_file, save_file

    hf_tiny.make_named("causal-f32-shared", tmp_path / "clean")
    clean = load_file(tmp_path / "clean" / "model.safetensors")
    ref = Reference(str(tmp_path / "clean"))
    dead = dict(clean)
    g = torch.Generator().manual_seed(0)
    for i in range(ref.num_layers):
        if ref.kv_source[i] != i:
            d, kv = ref.head_dim[i], ref.kv_heads[i]
            for part, shape in (
                ("k_proj.weight", (kv * d, ref.hidden)),
                ("v_proj.weight", (kv * d, ref.hidden)),
                ("k_norm.weight", (d,)),
            ):
                dead[f"model.layers.{i}.self_attn.{part}"] = torch.randn(shape, generator=g) * 100
    os.makedirs(tmp_path / "dead")
    save_file(dead, tmp_path / "dead" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "dead" / "config.json").write_text((tmp_path / "clean" / "config.json").read_text())
    ids = hf_tiny.prompt(512, 20, 3)
    np.testing.assert_array_equal(Reference(str(tmp_path / "dead")).logits(ids), ref.logits(ids))
    model = hf_tiny.load(str(tmp_path / "dead"))
    assert np.abs(hf_tiny.logits(model, ids) - ref.logits(ids)).max() <= 2e-4


@pytest.mark.parametrize(
    "rows,cols,group,symmetric,scale_dtype",
    [
        (
            13,
            36,
            12,
            False,
            torch.bfloat16,
        ),  # columns not a multiple of 8, rows not of 8, zero points
        (16, 100, None, True, torch.bfloat16),  # per channel, padded last word
        (24, 96, 32, True, torch.float16),
        (9, 256, 128, False, torch.float32),
        (40, 64, 32, False, torch.float16),
    ],
)
def test_unpacker_bit_identical_to_compressed_tensors(rows, cols, group, symmetric, scale_dtype):
    g = torch.Generator().manual_seed(rows * cols)
    w = torch.randn(rows, cols, generator=g) + 0.3
    args = hf_tiny.ct_args(group, symmetric)
    packed = hf_tiny.ct_compress(w, args, scale_dtype=scale_dtype)
    expected = hf_tiny.ct_decompress(packed, args).double().numpy()
    scale = packed["weight_scale"].double().numpy()
    zp = packed["weight_zero_point"].numpy() if "weight_zero_point" in packed else None
    stored = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}[scale_dtype]
    ours = dequantize(
        packed["weight_packed"].numpy(),
        scale,
        packed["weight_shape"].numpy(),
        zero_point=zp,
        scale_dtype=stored,
    )
    # compressed-tensors returns the product rounded once to the scale's dtype.
    np.testing.assert_array_equal(ours, expected)


def test_unpacker_g_idx_picks_each_columns_group():
    """With weight_g_idx, column c takes scale group g_idx[c] (compressed-tensors 0.20 has no g_idx
    path of its own; its unpacker gives the levels, the group lookup is the format's definition)."""
    from compressed_tensors.compressors.pack_quantized import unpack_from_int32

    rows, cols, group = 8, 64, 16
    g = torch.Generator().manual_seed(7)
    packed = hf_tiny.ct_compress(torch.randn(rows, cols, generator=g), hf_tiny.ct_args(group))
    g_idx = torch.randperm(cols, generator=g) % (cols // group)
    levels = unpack_from_int32(packed["weight_packed"], 4, packed["weight_shape"]).double()
    expected = (levels * packed["weight_scale"].double()[:, g_idx]).numpy()
    ours = dequantize(
        packed["weight_packed"].numpy(),
        packed["weight_scale"].double().numpy(),
        packed["weight_shape"].numpy(),
        g_idx=g_idx.numpy(),
    )
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("symmetric,name", [(True, "causal-f32-shared"), (False, "e2b-pattern")])
def test_reference_int4_matches_transformers_on_decompressed(symmetric, name, tmp_path, report):
    """compressed-tensors writes W4A16 (+ an emb4 twin); the reference reading it agrees with
    transformers run on compressed-tensors' own decompression."""
    hf_tiny.make_named(name, tmp_path / "dense")
    hf_tiny.ct_quantize_checkpoint(
        tmp_path / "dense", tmp_path / "q", group=32, symmetric=symmetric, emb4_dir=tmp_path / "q4"
    )
    for emb4 in (None, str(tmp_path / "q4")):
        hf_tiny.dense_from_quantized(tmp_path / "q", tmp_path / "hf", emb4_dir=emb4)
        model = hf_tiny.load(str(tmp_path / "hf"))
        ref = Reference(str(tmp_path / "q"), emb4_dir=emb4)
        cfg = model.config.get_text_config()
        ids = _prompts(cfg.sliding_window, cfg.vocab_size, seed=30)["long"]
        delta = float(np.abs(ref.logits(ids) - hf_tiny.logits(model, ids)).max())
        report(
            f"reference int4 vs transformers on CT-decompressed [{name}, symmetric={symmetric}, "
            f"emb4={emb4 is not None}]: max|dlogit| {delta:.2e}"
        )
        assert delta <= 2e-4


# --- the engine against the reference ------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(hf_tiny.MAKE_TINY_CONFIGS))
def tiny(request, cli, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    cli.make_tiny(out, preset="tiny", **hf_tiny.MAKE_TINY_CONFIGS[request.param])
    return request.param, str(out), Reference(str(out))


def _check_against_reference(cli, tmp_path, ref, ids, report, label, chunk=None):
    dump = str(tmp_path / (label.replace("/", "_") + ".safetensors"))
    out, logits = cli.generate(
        ref.model_dir, ids, N_NEW, context=len(ids) + N_NEW + 8, chunk=chunk, dump=dump
    )
    tokens = ref.greedy(ids, N_NEW)
    summary = hf_tiny.check_run(label, out, logits, tokens, ref.logits(ids + tokens), TOL)
    report(f"engine f32 vs reference [{label}]: {summary}, distinct tokens {len(set(tokens))}")
    return logits


def test_engine_matches_reference_f32(tiny, cli, tmp_path, report):
    name, path, ref = tiny
    for kind, ids in _prompts(ref.window, ref.embed.shape[0], seed=40).items():
        # The long prompt plus 64 new tokens crosses the window boundary several times.
        one = _check_against_reference(cli, tmp_path, ref, ids, report, f"{name}/{kind}")
        if kind == "long":
            chunked = _check_against_reference(
                cli, tmp_path, ref, ids, report, f"{name}/{kind}/chunk3", chunk=3
            )
            delta = float(np.abs(chunked["step_logits"] - one["step_logits"]).max())
            report(f"engine chunk 3 vs one chunk [{name}]: max|dlogit| {delta:.2e}")
            assert delta <= 2e-4


def test_engine_bf16_close_to_reference(tiny, cli, engine_device, tmp_path, report):
    name, path, ref = tiny
    ids = _prompts(ref.window, ref.embed.shape[0], seed=50)["long"]
    tokens = ref.greedy(ids, N_NEW)
    want = ref.logits(ids + tokens)
    T = len(ids)
    _, first = cli.generate(
        path, ids, 1, dtype="bfloat16", dump=str(tmp_path / "first.safetensors")
    )
    first_kl = hf_tiny.kl(want[T - 1], first["step_logits"][0])
    # Teacher forcing: one pass over the prompt and the reference's own greedy continuation.
    _, forced = cli.generate(
        path, ids + tokens, 1, dtype="bfloat16", dump=str(tmp_path / "forced.safetensors")
    )
    picks = np.argmax(forced["prompt_logits"][T - 1 : T - 1 + N_NEW], axis=-1)
    agree = int(np.sum(picks == np.asarray(tokens)))
    # What bf16 rounding alone costs on these random weights: transformers' own bf16 (eager) model
    # on the same checkpoint, tokens and device, measured the same way.
    hf_model = hf_tiny.load(path, dtype=torch.bfloat16, device=engine_device)
    hf_rows = hf_tiny.logits(hf_model, ids + tokens)
    hf_kl = hf_tiny.kl(want[T - 1], hf_rows[T - 1])
    hf_agree = int(np.sum(np.argmax(hf_rows[T - 1 : T - 1 + N_NEW], axis=-1) == np.asarray(tokens)))
    report(
        f"bf16 vs reference f32 [{name}]: first-step KL engine {first_kl:.3e} transformers "
        f"{hf_kl:.3e}; teacher-forced top-1 engine {agree}/{N_NEW} transformers {hf_agree}/{N_NEW}"
    )
    # Issue #2's bars (KL <= 1e-3, top-1 on >= 95%), unless transformers' bf16 misses them on the
    # same weights too; then the engine may be no worse than transformers.
    assert first_kl <= max(1e-3, 1.1 * hf_kl)
    assert agree >= min(0.95 * N_NEW, hf_agree)


@pytest.mark.parametrize(
    "emb4,asym", [(False, False), (True, False), (True, True)], ids=["w4a16", "+emb4", "asym+emb4"]
)
def test_engine_quantized_matches_reference(emb4, asym, cli, tmp_path, report):
    """Checkpoints written by the engine's own `quantize`: the reference reads them (its unpacker
    is checked against compressed-tensors above), the engine must agree."""
    src = cli.make_tiny(
        tmp_path / "dense", preset="tiny", **hf_tiny.quantizable("lm-prefix-dead-kv")
    )
    args = ["quantize", src, tmp_path / "q", "--group", 32]
    if emb4:
        args += ["--emb4", tmp_path / "q4"]
    if asym:
        args.append("--asym")
    cli(*args)
    emb4_dir = str(tmp_path / "q4") if emb4 else None
    ref = Reference(str(tmp_path / "q"), emb4_dir=emb4_dir)
    ids = _prompts(ref.window, ref.embed.shape[0], seed=60)["long"]
    out, logits = cli.generate(
        str(tmp_path / "q"), ids, N_NEW, emb4=emb4_dir, dump=str(tmp_path / "d.safetensors")
    )
    tokens = ref.greedy(ids, N_NEW)
    want = ref.logits(ids + tokens)
    T = len(ids)
    delta = max(
        float(np.abs(logits["prompt_logits"] - want[:T]).max()),
        float(np.abs(logits["step_logits"] - want[T - 1 : -1]).max()),
    )
    agree = sum(a == b for a, b in zip(out["tokens"], tokens))
    margin = hf_tiny.greedy_margins(want[T - 1 : -1]).min()
    report(
        f"engine int4 vs reference [emb4={emb4}, asym={asym}]: greedy {agree}/{N_NEW}, "
        f"max|dlogit| {delta:.2e}, min margin {margin:.3f}"
    )
    hf_tiny.check_greedy(
        f"int4 emb4={emb4} asym={asym}",
        out["tokens"],
        tokens,
        want[T - 1 : -1],
        logits["step_logits"],
    )
    assert delta <= TOL


@pytest.fixture
def e2b_checkpoint(cli, tmp_path, need_disk):
    """The full-size synthetic E2B checkpoint (about 10 GB at bf16), removed right after the test
    rather than left to pytest's rotation of old temporary directories."""
    need_disk(tmp_path, 11, "the synthetic E2B checkpoint")
    out = tmp_path / "e2b"
    try:
        yield cli.make_tiny(out, preset="e2b", seed=1, dtype="bf16")
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.slow
def test_synthetic_e2b_loads_and_decodes(e2b_checkpoint, cli, report):
    result, _ = cli.generate(e2b_checkpoint, [2, 105, 2364, 107], 2, dtype="bfloat16", context=1024)
    report(
        f"synthetic E2B: layout {result['layout']}, read_s {result.get('read_s')}, "
        f"decode_s {result.get('decode_s')}"
    )
    # One row of the rings in bf16: a full ring's 1,024 slots of one 512-wide K and V head and an
    # int64 position; a sliding ring's 512 slots (the window) of 256-wide heads.
    full, sliding = 1024 * (2 * 512 * 2 + 8), 512 * (2 * 256 * 2 + 8)
    assert result["layout"] == {
        "full_rings": 3,
        "sliding_rings": 12,
        "shared_layers": 20,
        "context": 1024,
        "row_bytes": 3 * full + 12 * sliding,
    }
    assert len(result["tokens"]) == 2
