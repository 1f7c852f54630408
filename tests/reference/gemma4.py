"""An eager float64 Gemma 4 text model in numpy, written from research/gemma4-architecture.md §2
and transformers' modeling_gemma4.py. It recomputes the whole causal forward for every call: no
cache, no rings, so it is independent of the engine's decode path."""

import json
import math
import os

import numpy as np

from .pack_quant import dequantize
from .safetensors_np import Checkpoint

_PREFIXES = ("model.language_model.", "model.")
_VOCAB_TABLES = ("embed_tokens", "embed_tokens_per_layer", "lm_head")


def _text_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return config.get("text_config") or config


def _prefix_of(checkpoint):
    for prefix in _PREFIXES:
        if (
            f"{prefix}embed_tokens.weight" in checkpoint
            or f"{prefix}embed_tokens.weight_packed" in checkpoint
        ):
            return prefix
    for prefix in _PREFIXES:
        if any(n.startswith(f"{prefix}layers.") for n in checkpoint.names()):
            return prefix
    raise ValueError(
        f"{checkpoint.directory}: no tensor under {' or '.join(_PREFIXES)}"
    )


def _module(checkpoint, name, exact_int4=False):
    """Float64 weight of module `name` (full tensor name without `.weight`), plain or
    pack-quantized; None when absent. Pack-quantized products (q - zp) * scale are rounded to the
    scale dtype as compressed-tensors' decompressor does, or kept exact with `exact_int4`."""
    if f"{name}.weight" in checkpoint:
        return checkpoint.float64(f"{name}.weight")
    if f"{name}.weight_packed" in checkpoint:

        def opt(suffix):
            return (
                checkpoint.raw(f"{name}.{suffix}")
                if f"{name}.{suffix}" in checkpoint
                else None
            )

        return dequantize(
            checkpoint.raw(f"{name}.weight_packed"),
            checkpoint.float64(f"{name}.weight_scale"),
            checkpoint.raw(f"{name}.weight_shape"),
            zero_point=opt("weight_zero_point"),
            g_idx=opt("weight_g_idx"),
            scale_dtype="F64"
            if exact_int4
            else checkpoint.dtype(f"{name}.weight_scale"),
        )
    return None


def _rms_norm(x, weight, eps):
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if weight is None else y * weight


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _inv_freq(rope, head_dim):
    theta = float(rope["rope_theta"])
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if kind == "proportional":
        angles = int(float(rope.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        inv = np.zeros(head_dim // 2)
        inv[:angles] = theta ** -(
            np.arange(0, 2 * angles, 2, dtype=np.float64) / head_dim
        )
        return inv / float(rope.get("factor", 1.0))
    raise ValueError(f"rope_type {kind!r} not supported by the reference")


def _rope(x, positions, inv_freq):
    """Half-split rotation of x [T, heads, d]: dim j pairs with j + d/2."""
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class Reference:
    """Gemma 4 text model in float64. `emb4_dir`, when given, supplies embed_tokens,
    embed_tokens_per_layer and lm_head (plain or pack-quantized) in place of the main
    checkpoint's. `exact_int4`: int4 weights as the exact products (q - zp) * scale, the values
    the int4 model stands for, instead of compressed-tensors' products rounded to the scale
    dtype."""

    def __init__(self, model_dir, emb4_dir=None, exact_int4=False):
        c = _text_config(model_dir)
        self.model_dir = model_dir
        self.config = c
        if c.get("attention_k_eq_v") or c.get("enable_moe_block"):
            raise ValueError(
                "attention_k_eq_v / MoE are not E2B features; not in the reference"
            )
        self.num_layers = n = int(c["num_hidden_layers"])
        self.layer_types = list(c["layer_types"])
        self.window = int(c["sliding_window"])
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.softcap = c.get("final_logit_softcapping")
        self.hidden = int(c["hidden_size"])
        self.heads = int(c["num_attention_heads"])
        per_layer = {int(k): v for k, v in (c.get("per_layer_config") or {}).items()}
        self.head_dim, self.kv_heads = [], []
        for i, kind in enumerate(self.layer_types):
            d = int(c["head_dim"])
            if kind == "full_attention" and c.get("global_head_dim"):
                d = int(c["global_head_dim"])
            d = int(per_layer.get(i, {}).get("head_dim", d))
            self.head_dim.append(d)
            self.kv_heads.append(
                int(
                    per_layer.get(i, {}).get(
                        "num_key_value_heads", c["num_key_value_heads"]
                    )
                )
            )
        rope = c["rope_parameters"]
        self.inv_freq = [
            _inv_freq(rope[kind], self.head_dim[i])
            for i, kind in enumerate(self.layer_types)
        ]

        first_shared = n - int(c.get("num_kv_shared_layers") or 0)
        self.kv_source = list(range(n))
        for i in range(first_shared, n):
            same = [
                j
                for j in range(first_shared)
                if self.layer_types[j] == self.layer_types[i]
            ]
            if not same:
                raise ValueError(
                    f"shared layer {i} has no non-shared {self.layer_types[i]} layer to read"
                )
            self.kv_source[i] = same[-1]

        def module(checkpoint, name):
            return _module(checkpoint, name, exact_int4)

        main = Checkpoint(model_dir)
        p = _prefix_of(main)
        tables = {}
        if emb4_dir is not None:
            emb4 = Checkpoint(emb4_dir)
            q = _prefix_of(emb4)
            for t in _VOCAB_TABLES:
                w = module(emb4, t if t == "lm_head" else q + t)
                if w is not None:
                    tables[t] = w
        for t in _VOCAB_TABLES:
            if t not in tables:
                w = module(main, t if t == "lm_head" else p + t)
                if w is not None:
                    tables[t] = w
        self.embed = tables["embed_tokens"]
        self.head = tables.get("lm_head", self.embed)
        self.ple_dim = int(c.get("hidden_size_per_layer_input") or 0)
        if self.ple_dim:
            self.embed_ple = tables["embed_tokens_per_layer"]
            self.ple_projection = module(main, p + "per_layer_model_projection")
            self.ple_projection_norm = module(main, p + "per_layer_projection_norm")
        self.norm = module(main, p + "norm")

        names = [
            "input_layernorm",
            "self_attn.q_proj",
            "self_attn.q_norm",
            "self_attn.o_proj",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "post_feedforward_layernorm",
        ]
        if self.ple_dim:
            names += [
                "per_layer_input_gate",
                "per_layer_projection",
                "post_per_layer_input_norm",
            ]
        self.layers = []
        for i in range(n):
            own = names + (
                ["self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm"]
                if self.kv_source[i] == i
                else []
            )
            layer = {}
            for name in own:
                w = module(main, f"{p}layers.{i}.{name}")
                if w is None:
                    raise ValueError(
                        f"{model_dir}: tensor {p}layers.{i}.{name} missing"
                    )
                layer[name] = w
            scalar = f"{p}layers.{i}.layer_scalar"
            layer["layer_scalar"] = (
                main.float64(scalar).reshape(()) if scalar in main else np.float64(1.0)
            )
            self.layers.append(layer)

    def logits(self, ids):
        """Logits [T, V] (float64) of a full causal forward over `ids` from position 0."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        positions = np.arange(T)
        rel = positions[:, None] - positions[None, :]
        masks = {
            "full_attention": rel >= 0,
            "sliding_attention": (rel >= 0) & (rel < self.window),
        }

        h = self.embed[ids] * math.sqrt(self.hidden)
        if self.ple_dim:
            tok = (self.embed_ple[ids] * math.sqrt(self.ple_dim)).reshape(
                T, self.num_layers, self.ple_dim
            )
            ctx = (h @ self.ple_projection.T) * self.hidden**-0.5
            ctx = _rms_norm(
                ctx.reshape(T, self.num_layers, self.ple_dim),
                self.ple_projection_norm,
                self.eps,
            )
            ple = (ctx + tok) * 2.0**-0.5

        kv = {}
        for i, w in enumerate(self.layers):
            kind, d = self.layer_types[i], self.head_dim[i]
            a = _rms_norm(h, w["input_layernorm"], self.eps)
            q = _rms_norm(
                (a @ w["self_attn.q_proj"].T).reshape(T, self.heads, d),
                w["self_attn.q_norm"],
                self.eps,
            )
            q = _rope(q, positions, self.inv_freq[i])
            if self.kv_source[i] == i:
                k = (a @ w["self_attn.k_proj"].T).reshape(T, self.kv_heads[i], d)
                v = (a @ w["self_attn.v_proj"].T).reshape(T, self.kv_heads[i], d)
                k = _rope(
                    _rms_norm(k, w["self_attn.k_norm"], self.eps),
                    positions,
                    self.inv_freq[i],
                )
                v = _rms_norm(v, None, self.eps)
                kv[i] = (k, v)
            k, v = kv[self.kv_source[i]]
            group = self.heads // k.shape[1]
            out = np.empty((T, self.heads, d))
            for head in range(self.heads):
                scores = q[:, head, :] @ k[:, head // group, :].T  # attention scale 1.0
                scores = np.where(masks[kind], scores, -np.inf)
                scores -= scores.max(axis=-1, keepdims=True)
                probs = np.exp(scores)
                probs /= probs.sum(axis=-1, keepdims=True)
                out[:, head, :] = probs @ v[:, head // group, :]
            attn = out.reshape(T, self.heads * d) @ w["self_attn.o_proj"].T
            h = h + _rms_norm(attn, w["post_attention_layernorm"], self.eps)

            f = _rms_norm(h, w["pre_feedforward_layernorm"], self.eps)
            m = (_gelu_tanh(f @ w["mlp.gate_proj"].T) * (f @ w["mlp.up_proj"].T)) @ w[
                "mlp.down_proj"
            ].T
            h = h + _rms_norm(m, w["post_feedforward_layernorm"], self.eps)

            if self.ple_dim:
                g = _gelu_tanh(h @ w["per_layer_input_gate"].T) * ple[:, i, :]
                h = h + _rms_norm(
                    g @ w["per_layer_projection"].T,
                    w["post_per_layer_input_norm"],
                    self.eps,
                )
            h = h * w["layer_scalar"]

        logits = _rms_norm(h, self.norm, self.eps) @ self.head.T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits

    def greedy(self, ids, n):
        """The next `n` greedy tokens after `ids` (EOS is not special here)."""
        seq = [int(t) for t in ids]
        for _ in range(n):
            seq.append(int(np.argmax(self.logits(seq)[-1])))
        return seq[len(ids) :]
