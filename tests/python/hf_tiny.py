"""Tiny Gemma 4 checkpoints made and run by transformers itself (a random small config, weights
drawn so that the logits are far from uniform, written with `save_pretrained`), their int4 forms
written and read by compressed-tensors, and the configs and criteria the parity suites share."""

import json
import math
import os

import numpy as np
import torch
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

SLIDING, FULL = "sliding_attention", "full_attention"
S, F = SLIDING, FULL

# Parity criteria shared by the parity suites.
N_NEW = 64
TOL = 1e-3
# 64 of 64 greedy tokens means something only on logits that are far from uniform: the typical
# (median) lead of the best token over the second is a sizeable fraction of a logit unit.
MIN_MEDIAN_MARGIN = 0.1

# make-tiny checkpoints. Between them: different seeds; >= 2 sliding and 1 full non-shared layers
# with the last two non-shared [sliding, full]; shared layers of both types; windows shorter than
# the long prompt; dead shared K/V on and off; both prefixes; one sharded; F32 and BF16 files.
MAKE_TINY_CONFIGS = {
    "lm-prefix-dead-kv": dict(
        seed=11,
        dtype="f32",
        prefix="model.language_model.",
        dead_shared_kv=True,
        layer_types="sliding,sliding,sliding,full,sliding,sliding,full",
        shared=3,
        window=8,
        vocab=512,
        hidden=64,
    ),
    "model-prefix-sharded-bf16-untied": dict(
        seed=12,
        dtype="bf16",
        prefix="model.",
        untied=True,
        shards=3,
        layer_types="sliding,sliding,full,sliding,full",
        shared=2,
        window=16,
        vocab=1024,
        hidden=128,
        heads=4,
        kv_heads=2,
    ),
    "e2b-pattern-dead-kv": dict(
        seed=13,
        dtype="f32",
        prefix="model.",
        dead_shared_kv=True,
        layer_types=",".join((["sliding"] * 4 + ["full"]) * 2),
        shared=5,
        window=12,
        vocab=768,
        hidden=96,
        heads=3,
        kv_heads=1,
    ),
    "unshared-narrow": dict(
        seed=14,
        dtype="bf16",
        prefix="model.language_model.",
        layer_types="sliding,sliding,full,sliding,sliding,full",
        shared=0,
        window=5,
        vocab=256,
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        global_head_dim=32,
        no_double_wide=True,
    ),
}


def quantizable(name):
    """MAKE_TINY_CONFIGS[name] with per-layer inputs 32 wide: group-32 int4 needs every input
    width to be a whole number of groups, per_layer_projection's included."""
    return dict(MAKE_TINY_CONFIGS[name], ple=32)


# Tiny configs saved by transformers. Between them: both prefixes, tied and untied heads, F32/BF16/
# F16 files, one sharded, shared layers of both types, windows shorter than the prompts; the last
# two non-shared layers are [sliding, full] (what llama.cpp's KV-reuse rule assumes).
HF_CONFIGS = {
    "causal-f32-shared": dict(
        config=dict(layer_types=[S, S, S, F, S, S, F], shared=3, window=8), seed=1
    ),
    "multimodal-bf16-untied": dict(
        config=dict(
            layer_types=[S, S, F, S, F],
            shared=2,
            window=16,
            hidden=128,
            heads=4,
            kv_heads=2,
            vocab=1024,
            tied=False,
        ),
        seed=2,
        multimodal_prefix=True,
        dtype=torch.bfloat16,
    ),
    "causal-f16-sharded-unshared": dict(
        config=dict(
            layer_types=[S, S, F, S, S, F],
            shared=0,
            window=5,
            vocab=256,
            head_dim=16,
            global_head_dim=32,
            heads=4,
            kv_heads=2,
        ),
        seed=3,
        dtype=torch.float16,
        max_shard_size="60KB",
    ),
    "e2b-pattern": dict(
        config=dict(
            layer_types=[S, S, S, S, F] * 2,
            shared=5,
            window=12,
            hidden=96,
            heads=3,
            vocab=768,
            intermediate=192,
        ),
        seed=4,
        multimodal_prefix=True,
    ),
}


def text_config(
    *,
    layer_types,
    hidden=64,
    heads=2,
    kv_heads=1,
    head_dim=32,
    global_head_dim=64,
    window=8,
    shared=0,
    vocab=512,
    ple=32,
    intermediate=128,
    double_wide=True,
    tied=True,
):
    return Gemma4TextConfig(
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=len(layer_types),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        global_head_dim=global_head_dim,
        layer_types=list(layer_types),
        sliding_window=window,
        num_kv_shared_layers=shared,
        hidden_size_per_layer_input=ple,
        use_double_wide_mlp=double_wide,
        final_logit_softcapping=30.0,
        tie_word_embeddings=tied,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
    )


FINAL_NORM_GAIN = 8.0


@torch.no_grad()
def _randomize(model, seed):
    """Draws every parameter so that activations stay O(1) and the logits spread over several
    units (greedy margins far above f32 noise, soft-cap not saturated)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
        if p.ndim == 2 and "embed_tokens_per_layer" in name:
            p.copy_(
                torch.randn(p.shape, generator=g)
                / math.sqrt(model.config.get_text_config().hidden_size_per_layer_input)
            )
        elif p.ndim == 2 and ("embed_tokens" in name or name == "lm_head.weight"):
            # A small embedding keeps the residual stream from being its own input token (which
            # makes greedy decoding repeat it); the final norm's gain spreads the logits instead.
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 / math.sqrt(p.shape[1]))
        elif p.ndim == 2:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        elif leaf in ("q_norm", "k_norm"):
            p.copy_(torch.rand(p.shape, generator=g) * 0.4 + 0.2)
        elif name.endswith("model.norm.weight") or name.endswith("language_model.norm.weight"):
            p.copy_(torch.rand(p.shape, generator=g) * FINAL_NORM_GAIN + FINAL_NORM_GAIN / 2)
        else:
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    for name, b in model.named_buffers():
        if name.endswith("layer_scalar"):
            b.copy_(torch.rand(b.shape, generator=g) * 0.5 + 0.5)


def make(
    out_dir, config, *, seed, multimodal_prefix=False, dtype=torch.float32, max_shard_size=None
):
    """Saves a randomly initialised model with transformers' own writer. `multimodal_prefix` saves
    a Gemma4ForConditionalGeneration (tensors under model.language_model.) instead of a
    Gemma4ForCausalLM (tensors under model.)."""
    torch.manual_seed(seed)
    if multimodal_prefix:
        model = Gemma4ForConditionalGeneration(
            Gemma4Config(
                text_config=config.to_dict(), tie_word_embeddings=config.tie_word_embeddings
            )
        )
    else:
        model = Gemma4ForCausalLM(config)
    _randomize(model, seed)
    if not config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    return out_dir


def make_assistant(
    out_dir,
    *,
    seed,
    backbone=64,
    vocab=512,
    kv_heads=1,
    head_dim=32,
    global_head_dim=64,
    window=8,
    layer_types=(S, F),
    hidden=32,
    heads=2,
    ordered=False,
):
    """Saves a random Gemma4AssistantForCausalLM (the multi-token-prediction drafter) for a target
    of hidden size `backbone` whose K/V it reads (kv_heads, head_dim, global_head_dim and window
    the target's; the defaults are text_config's), with `layer_types` of its own and ordered
    embeddings (a random token_ordering over 16 clusters, the top 4 scored) or the whole
    vocabulary scored."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    text = text_config(
        layer_types=layer_types,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        global_head_dim=global_head_dim,
        window=window,
        shared=len(layer_types),
        vocab=vocab,
        ple=0,
        intermediate=2 * hidden,
        double_wide=False,
    )
    text.vocab_size_per_layer_input = 0  # an assistant has no per-layer table
    config = Gemma4AssistantConfig(
        text_config=text.to_dict(),
        backbone_hidden_size=backbone,
        use_ordered_embeddings=ordered,
        num_centroids=16,
        centroid_intermediate_top_k=4,
    )
    model = Gemma4AssistantForCausalLM(config)
    _randomize(model, seed)
    if ordered:
        g = torch.Generator().manual_seed(seed)
        model.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=g))
    model.save_pretrained(out_dir)
    return out_dir


def load(model_dir, dtype=torch.float32, attn="eager", device="cpu"):
    """transformers' model for a checkpoint directory, by the config's model_type, on `device`."""
    with open(os.path.join(model_dir, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    cls = Gemma4ForConditionalGeneration if model_type == "gemma4" else Gemma4ForCausalLM
    model = cls.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    return model.to(device).eval()


@torch.no_grad()
def logits(model, ids):
    """Logits [T, V] as float64 numpy of one forward over `ids` (no cache)."""
    ids = torch.tensor([list(ids)], device=model.device)
    out = model(input_ids=ids, use_cache=False).logits[0]
    return out.double().cpu().numpy()


@torch.no_grad()
def greedy(model, ids, n):
    """n greedy tokens, each from a fresh full forward (EOS not special)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(logits(model, seq)[-1])))
    return seq[len(ids) :]


# compressed-tensors side: its own compressor writes int4 checkpoints, its own decompressor turns
# any pack-quantized checkpoint (ours or its) back into dense weights for transformers.

_VOCAB_TABLES = ("embed_tokens", "embed_tokens_per_layer", "lm_head")


def ct_args(group, symmetric=True):
    from compressed_tensors.quantization import QuantizationArgs

    if group:
        return QuantizationArgs(
            num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group
        )
    return QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="channel")


def ct_compress(weight, args, scale_dtype=torch.bfloat16):
    """compressed-tensors' own min-max qparams and PackedQuantizationCompressor.compress."""
    from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    weight = weight.float()
    rows, cols = weight.shape
    grouped = (
        weight.reshape(rows, -1, args.group_size)
        if args.group_size
        else weight.reshape(rows, 1, cols)
    )
    scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    state = {"weight": weight, "weight_scale": scale.to(scale_dtype)}
    if not args.symmetric:
        state["weight_zero_point"] = zero_point.round().to(torch.int8)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    return PackedQuantizationCompressor.compress(state, scheme)


def ct_decompress(tensors, args):
    """compressed-tensors' PackedQuantizationCompressor.decompress as it is: the product (q - z)·s
    rounded once to the scale's dtype, which is what the engine's dequantization reproduces."""
    from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    state = dict(tensors)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    return PackedQuantizationCompressor.decompress(state, scheme)["weight"]


def _quantization_config(group, symmetric, extra_targets=()):
    args = ct_args(group, symmetric)
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear", *extra_targets],
                "weights": args.model_dump(mode="json"),
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def _is_table(name):
    return any(name == t or name.endswith(f".{t}") for t in _VOCAB_TABLES)


def ct_quantize_checkpoint(src_dir, out_dir, *, group=32, symmetric=True, emb4_dir=None):
    """A W4A16 checkpoint written by compressed-tensors' compressor from a dense one: every 2-D
    weight except the vocabulary tables is packed. With `emb4_dir`, a second directory holds the
    packed embed_tokens, embed_tokens_per_layer and an untied lm_head (the -emb4 twin)."""
    from safetensors.torch import load_file, save_file

    dense = {}
    for shard in (f for f in os.listdir(src_dir) if f.endswith(".safetensors")):
        dense.update(load_file(os.path.join(src_dir, shard)))
    args = ct_args(group, symmetric)
    out, unfit = {}, []
    for name, w in dense.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and w.ndim == 2 and not _is_table(module):
            if group and w.shape[1] % group:
                unfit.append(module)  # compressed-tensors cannot group these columns
                out[name] = w.contiguous()
                continue
            out.update({f"{module}.{k}": v.contiguous() for k, v in ct_compress(w, args).items()})
        else:
            out[name] = w.contiguous()
    with open(os.path.join(src_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = _quantization_config(group, symmetric)
    config["quantization_config"]["ignore"] += sorted(unfit)
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if emb4_dir is None:
        return out_dir
    tables = {}
    prefix = next(
        p for p in ("model.language_model.", "model.") if f"{p}embed_tokens.weight" in dense
    )
    sources = {
        f"{prefix}embed_tokens": dense[f"{prefix}embed_tokens.weight"],
        f"{prefix}embed_tokens_per_layer": dense.get(f"{prefix}embed_tokens_per_layer.weight"),
        "lm_head": dense.get("lm_head.weight", dense[f"{prefix}embed_tokens.weight"]),
    }
    for module, w in sources.items():
        if w is not None:
            packed = ct_compress(w, args, scale_dtype=torch.float16)
            tables.update({f"{module}.{k}": v.contiguous() for k, v in packed.items()})
    config["quantization_config"] = _quantization_config(
        group, symmetric, ["Embedding", "re:.*lm_head"]
    )
    config["quantization_config"]["ignore"] = []
    config["tie_word_embeddings"] = False
    if "text_config" in config:
        config["text_config"]["tie_word_embeddings"] = False
    os.makedirs(emb4_dir, exist_ok=True)
    save_file(tables, os.path.join(emb4_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(emb4_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def _group_args(quantization_config, module):
    """The weight args of the config group whose targets name this module (exact or `re:`), or,
    failing that, the group targeting its class (Embedding for vocabulary tables, else Linear)."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.utils.match import match_name

    groups = quantization_config["config_groups"].values()
    cls = "Embedding" if _is_table(module) and not module.endswith("lm_head") else "Linear"
    for group in groups:
        if any(match_name(module, t) for t in group["targets"]):
            return QuantizationArgs.model_validate(group["weights"])
    for group in groups:
        if cls in group["targets"]:
            return QuantizationArgs.model_validate(group["weights"])
    raise AssertionError(f"no config group of the checkpoint targets {module}")


def dense_from_quantized(quant_dir, out_dir, emb4_dir=None):
    """Writes a dense f32 checkpoint that transformers can load: every pack-quantized module of
    `quant_dir` (and of `emb4_dir`, whose vocabulary tables override) decompressed by
    compressed-tensors. Returns {module: f32 tensor} of what was decompressed."""
    from safetensors.torch import load_file, save_file

    def read(directory):
        tensors = {}
        for shard in (f for f in os.listdir(directory) if f.endswith(".safetensors")):
            tensors.update(load_file(os.path.join(directory, shard)))
        with open(os.path.join(directory, "config.json")) as f:
            return tensors, json.load(f)

    def densify(tensors, config):
        dense, decompressed = {}, {}
        for name in sorted(tensors):
            if name.endswith(".weight_packed"):
                module = name.removesuffix(".weight_packed")
                parts = {
                    k: tensors[f"{module}.{k}"]
                    for k in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")
                    if f"{module}.{k}" in tensors
                }
                w = ct_decompress(parts, _group_args(config["quantization_config"], module)).float()
                dense[f"{module}.weight"] = decompressed[module] = w
            elif not any(
                name.endswith(s) for s in (".weight_scale", ".weight_shape", ".weight_zero_point")
            ):
                dense[name] = tensors[name].float()
        return dense, decompressed

    tensors, config = read(quant_dir)
    dense, decompressed = densify(tensors, config)
    if emb4_dir is not None:
        t4, c4 = read(emb4_dir)
        d4, dec4 = densify(t4, c4)
        dense.update({k: v for k, v in d4.items() if _is_table(k.removesuffix(".weight"))})
        decompressed.update(dec4)
        if "lm_head.weight" in dense:
            config["tie_word_embeddings"] = False
            if "text_config" in config:
                config["text_config"]["tie_word_embeddings"] = False
    config.pop("quantization_config", None)
    os.makedirs(out_dir, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in dense.items()},
        os.path.join(out_dir, "model.safetensors"),
        metadata={"format": "pt"},
    )
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return decompressed


def make_named(name, out_dir):
    """Saves HF_CONFIGS[name] to out_dir."""
    spec = dict(HF_CONFIGS[name])
    config = text_config(**spec.pop("config"))
    return make(str(out_dir), config, **spec)


def prompt(vocab, length, seed):
    """BOS followed by random ordinary token ids (0-3 are special)."""
    rng = np.random.RandomState(seed)
    return [2] + [int(t) for t in rng.randint(4, vocab, size=length - 1)]


def greedy_margins(rows):
    """Per row, the lead of the best logit over the second: how far the numbers may move before
    that greedy choice flips."""
    top2 = np.sort(np.asarray(rows, dtype=np.float64), axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def check_greedy(label, got, want, want_rows, got_rows=None):
    """Asserts a non-degenerate greedy run (spread logits, not one repeated token) and then
    token-for-token agreement; a disagreement names the step, its margin and the logit gap."""
    margins = greedy_margins(want_rows)
    assert np.median(margins) >= MIN_MEDIAN_MARGIN, (
        f"{label}: near-uniform logits, margins {margins}"
    )
    assert len(set(want)) > 4, f"{label}: greedy decoding stuck on {sorted(set(want))}"
    if list(got) != list(want):
        step = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        gap = (
            ""
            if got_rows is None
            else f", max|dlogit| there {np.abs(got_rows[step] - want_rows[step]).max():.2e}"
        )
        raise AssertionError(
            f"{label}: tokens differ first at step {step} ({got[step]} vs {want[step]}), "
            f"margin there {margins[step]:.2e}{gap}; got {list(got)} want {list(want)}"
        )


def check_run(label, out, logits, tokens, want, tol):
    """Checks an engine run (`generate --json` output and its dumped logits) against a reference's
    greedy `tokens` and its logits `want` [T + n, V] over prompt + tokens: tokens one for one,
    prompt and step logits within `tol`. Returns the summary line the tests report."""
    T = want.shape[0] - len(tokens)
    prompt_delta = float(np.abs(logits["prompt_logits"] - want[:T]).max())
    step_delta = float(np.abs(logits["step_logits"] - want[T - 1 : -1]).max())
    agree = sum(a == b for a, b in zip(out["tokens"], tokens))
    margin = greedy_margins(want[T - 1 : -1]).min()
    check_greedy(label, out["tokens"], tokens, want[T - 1 : -1], logits["step_logits"])
    assert prompt_delta <= tol, f"{label}: prompt logits differ by {prompt_delta:.2e}"
    assert step_delta <= tol, f"{label}: step logits differ by {step_delta:.2e}"
    return (
        f"greedy {agree}/{len(tokens)}, max|dlogit| prompt {prompt_delta:.2e} steps "
        f"{step_delta:.2e}, min margin {margin:.3f}"
    )


def kl(p_logits, q_logits):
    """KL(P || Q) of the softmax distributions, in float64."""
    p_logits = np.asarray(p_logits, dtype=np.float64)
    q_logits = np.asarray(q_logits, dtype=np.float64)
    log_p = p_logits - p_logits.max() - np.log(np.exp(p_logits - p_logits.max()).sum())
    log_q = q_logits - q_logits.max() - np.log(np.exp(q_logits - q_logits.max()).sum())
    return float(np.sum(np.exp(log_p) * (log_p - log_q)))
