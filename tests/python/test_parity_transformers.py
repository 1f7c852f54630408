"""The engine against transformers' Gemma4 on tiny checkpoints saved by transformers itself
(save_pretrained) and by `torchtpu-cpp make-tiny`: the seeds' check (64 of 64 greedy tokens, KL of
the first step), at f32 and at bf16 on both sides, and on W4A16 checkpoints from `quantize`."""

import hf_tiny
import numpy as np
import pytest
import torch
from hf_tiny import MAKE_TINY_CONFIGS, N_NEW, TOL
from reference import Reference

MAKE_TINY = ["lm-prefix-dead-kv", "model-prefix-sharded-bf16-untied"]


@pytest.fixture(
    scope="module",
    params=[f"hf:{n}" for n in sorted(hf_tiny.HF_CONFIGS)] + [f"make-tiny:{n}" for n in MAKE_TINY],
)
def checkpoint(request, tmp_path_factory):
    origin, name = request.param.split(":")
    out = tmp_path_factory.mktemp(name)
    if origin == "hf":
        hf_tiny.make_named(name, out)
    else:
        request.getfixturevalue("cli").make_tiny(out, preset="tiny", **MAKE_TINY_CONFIGS[name])
    return request.param, str(out)


def _sizes(model):
    cfg = model.config.get_text_config()
    return cfg.sliding_window, cfg.vocab_size


def _f32_against_transformers(cli, path, label, tmp_path, report, emb4=None, hf_path=None):
    model = hf_tiny.load(hf_path or path)
    window, vocab = _sizes(model)
    ids = hf_tiny.prompt(vocab, window + 9, 70)
    out, logits = cli.generate(
        path,
        ids,
        N_NEW,
        emb4=emb4,
        context=len(ids) + N_NEW + 8,
        dump=str(tmp_path / "f32.safetensors"),
    )
    tokens = hf_tiny.greedy(model, ids, N_NEW)
    want = hf_tiny.logits(model, ids + tokens)
    summary = hf_tiny.check_run(label, out, logits, tokens, want, TOL)
    report(f"engine f32 vs transformers f32 [{label}]: {summary}, logit std {want.std():.2f}")


def test_engine_matches_transformers_f32(checkpoint, cli, tmp_path, report):
    label, path = checkpoint
    _f32_against_transformers(cli, path, label, tmp_path, report)


def test_drafts_give_the_tokens_of_transformers_prompt_lookup(checkpoint, cli, tmp_path, report):
    """Speculative decoding (generate --draft-max) against transformers' own prompt-lookup
    decoding (generate with prompt_lookup_num_tokens), whose tokens are its greedy ones: tokens
    one for one and every step's logits within TOL, after a prompt that repeats itself, so that
    drafts are made, kept and rejected while the sliding rings wrap. Drafts are looked up by runs
    down to one token: a random model's output need not repeat a pair in 64 tokens. Every draft
    found is checked (--draft-always), whatever the engine's timing would choose."""
    label, path = checkpoint
    model = hf_tiny.load(path)
    model.generation_config.eos_token_id = None  # as --ignore-eos
    window, vocab = _sizes(model)
    part = hf_tiny.prompt(vocab, window + 6, 71)[1:]
    ids = [2] + part + part + part[:3]
    out, logits = cli.generate(
        path,
        ids,
        N_NEW,
        context=len(ids) + N_NEW + 8,
        dump=str(tmp_path / "drafts.safetensors"),
        draft_max=4,
        draft_ngram_min=1,
        draft_always=True,
    )
    looked_up = model.generate(
        torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False, prompt_lookup_num_tokens=4
    )
    tokens = looked_up[0, len(ids) :].tolist()
    want = hf_tiny.logits(model, ids + tokens)
    summary = hf_tiny.check_run(label, out, logits, tokens, want, TOL)
    report(
        f"engine drafts vs transformers prompt lookup [{label}]: {summary}, drafts kept "
        f"{out['accepted']} of {out['drafted']}"
    )
    assert out["drafted"] > 0


def test_engine_bf16_matches_transformers_bf16(checkpoint, cli, engine_device, tmp_path, report):
    label, path = checkpoint
    model = hf_tiny.load(path, dtype=torch.bfloat16)
    window, vocab = _sizes(model)
    ids = hf_tiny.prompt(vocab, window + 9, 80)
    out, logits = cli.generate(
        path, ids, 1, dtype="bfloat16", dump=str(tmp_path / "bf16.safetensors")
    )
    engine_first = logits["step_logits"][0]
    figures = {}
    for attn in ("eager", "sdpa"):
        hf_model = hf_tiny.load(path, dtype=torch.bfloat16, attn=attn, device=engine_device)
        hf_first = hf_tiny.logits(hf_model, ids)[-1]
        figures[attn] = (hf_first, hf_tiny.kl(hf_first, engine_first))
    hf_first, first_kl = figures["eager"]
    hf_top5 = set(np.argsort(-hf_first, kind="stable")[:5].tolist())
    report(
        f"engine bf16 vs transformers bf16 [{label}]: first-step KL(HF||engine) "
        f"eager {first_kl:.3e}, sdpa {figures['sdpa'][1]:.3e}; "
        f"top-5 HF {sorted(hf_top5)} engine {sorted(out['top5']['ids'])}"
    )
    assert set(out["top5"]["ids"]) == hf_top5
    assert first_kl <= 1e-3


@pytest.mark.parametrize("emb4", [False, True], ids=["w4a16", "w4a16+emb4"])
@pytest.mark.parametrize("name", ["lm-prefix-dead-kv", "model-prefix-sharded-bf16-untied"])
def test_engine_quantized_matches_transformers(name, emb4, cli, tmp_path, report):
    """`quantize` output, run by the engine, against transformers on the weights that
    compressed-tensors' own decompressor gets back from the same files."""
    src = cli.make_tiny(tmp_path / "dense", preset="tiny", **hf_tiny.quantizable(name))
    args = ["quantize", src, tmp_path / "q", "--group", 32]
    if emb4:
        args += ["--emb4", tmp_path / "q4"]
    cli(*args)
    emb4_dir = str(tmp_path / "q4") if emb4 else None
    hf_tiny.dense_from_quantized(tmp_path / "q", tmp_path / "hf", emb4_dir=emb4_dir)
    # The reference's unpacker reads the same files to the same model (its own check of the format).
    ids = hf_tiny.prompt(MAKE_TINY_CONFIGS[name]["vocab"], 20, 90)
    ref_delta = float(
        np.abs(
            Reference(str(tmp_path / "q"), emb4_dir=emb4_dir).logits(ids)
            - hf_tiny.logits(hf_tiny.load(str(tmp_path / "hf")), ids)
        ).max()
    )
    assert ref_delta <= 2e-4
    _f32_against_transformers(
        cli,
        str(tmp_path / "q"),
        f"{name} int4 emb4={emb4}",
        tmp_path,
        report,
        emb4=emb4_dir,
        hf_path=str(tmp_path / "hf"),
    )
