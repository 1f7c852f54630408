"""The engine against llama.cpp (an independent Gemma 4 implementation, run through
node-llama-cpp's prebuilt binaries) on the same tiny weights, exported to GGUF by
bench/gguf_export.py: greedy tokens from token ids, the Q4_0 repack of our int4 values, and a
LoRA adapter applied by llama.cpp's own adapter code.

Known rounding differences, and how each is kept out of the comparison:
- Embedding scale: llama.cpp multiplies by sqrtf(hidden) in f32; transformers rounds sqrt(hidden)
  to the weight dtype (39.25 in bf16 against 39.19 in f32 for E2B). Everything here is f32, and
  the hidden sizes (64, 128) are ones where the f32 values agree anyway.
- KV cache: llama.cpp's default F16 cache moves logits by about 0.1; the cache here is F32.
- bf16 weights make llama.cpp round activations to bf16 inside its matmuls; weights here are F32.
- Flash attention: ggml's CPU flash-attention kernel works in fp16 internally (log-probabilities
  move by ~0.03 on these models); it is switched off.
- GELU: ggml's CPU GELU reads an fp16 lookup table (GGML_GELU_FP16), which cannot be switched off.
  It is controlled for by also running the float64 reference (tests/reference/gemma4.py) with that
  table emulated: llama.cpp must then agree with it far more closely than with plain GELU.
- KV sharing: llama.cpp takes the shared layers' source as first_shared - (sliding ? 2 : 1), the
  transformers rule only when the last two non-shared layers are [sliding, full]; every config
  here keeps that.
- Q4_0: llama.cpp quantizes activations to 8 bits before a Q4_0 matmul, so the Q4_0 run is not
  compared token for token; what is checked is that the GGUF holds exactly our int4 values
  (decoded by gguf-py against compressed-tensors' decoder). Every Q4_0 row is >= 64 wide (rows of
  32 gave wrong results in this llama.cpp build).
"""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import gguf_export
from reference import gemma4 as reference_gemma4

PLAIN_GELU = reference_gemma4._gelu_tanh

N_NEW = 32
# Largest difference allowed between two log-probabilities of one token at one step, llama.cpp
# against the engine (ggml's fp16 GELU table included), and against the float64 reference running
# that same table (what is left: f32 arithmetic). A wrong norm, scale, rope or KV source moves them
# by whole units.
LOGPROB_TOL = 0.05
EMULATED_TOL = 0.02

# Two layouts and shapes, f32 throughout. Both keep the last two non-shared layers [sliding, full].
CONFIGS = {
    "tiny-multimodal-tied": dict(preset="tiny", seed=1, dtype="f32"),
    "causal-untied-gqa": dict(
        preset="tiny",
        seed=7,
        dtype="f32",
        prefix="model.",
        untied=True,
        hidden=128,
        heads=4,
        kv_heads=2,
        head_dim=32,
        global_head_dim=64,
        intermediate=256,
        ple=32,
        window=16,
        vocab=1024,
        layer_types="sliding,full,sliding,sliding,full,sliding,full",
        shared=2,
        no_double_wide=True,
    ),
}
PROMPTS = {"tiny-multimodal-tied": 3, "causal-untied-gqa": 5}


def prompt(vocab, seed, length=12):
    """BOS and random ordinary ids (0-3 are special)."""
    rng = np.random.RandomState(seed)
    return [2] + [int(t) for t in rng.randint(4, vocab, size=length - 1)]


def llamacpp(model, ids, new, **options):
    """One greedy run of bench/llamacpp_run.mjs; its JSON."""
    if not (BENCH / "node_modules" / "node-llama-cpp").is_dir():
        pytest.fail("node-llama-cpp is not installed: run `npm ci --prefix bench`")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH (llama.cpp runs through node-llama-cpp)")
    cmd = [node, str(BENCH / "llamacpp_run.mjs"), "--model", str(model)]
    cmd += ["--ids", ",".join(map(str, ids)), "--new", str(new)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llamacpp_exact(model, ids, **options):
    """N_NEW greedy tokens with every step's log-probabilities, with the rounding llama.cpp lets us
    switch off switched off (F32 KV cache, no flash attention; one thread)."""
    return llamacpp(
        model,
        ids,
        N_NEW,
        kv_type="F32",
        flash_attention="false",
        threads=1,
        context=256,
        probabilities=True,
        **options,
    )


def log_softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def greedy_margins(step_logits):
    top2 = np.sort(np.asarray(step_logits, dtype=np.float64), axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def ggml_gelu(x):
    """ggml's CPU GELU (GGML_GELU_FP16): the input rounded to fp16, looked up in an fp16 table of
    the tanh formula, passed through unchanged at or beyond +-10 (zero below -10)."""
    x16 = x.astype(np.float16).astype(np.float64)
    table = PLAIN_GELU(x16).astype(np.float32).astype(np.float16)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, table.astype(np.float64)))


def reference_logprobs(model_dir, ids, tokens, gelu):
    """Teacher-forced log-probabilities of each generated token's step from the float64 reference
    (tests/reference/gemma4.py), with the GELU given."""
    try:
        reference_gemma4._gelu_tanh = gelu
        logits = reference_gemma4.Reference(str(model_dir)).logits(ids + tokens[:-1])
    finally:
        reference_gemma4._gelu_tanh = PLAIN_GELU
    return log_softmax(logits[len(ids) - 1 :])


def max_gap(a, b):
    """Largest difference of two log-probability tables over the entries above e^-30 (smaller
    probabilities have lost their digits in llama.cpp's f32 softmax)."""
    seen = a > -30
    return float(np.abs(a - b)[seen].max())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_llamacpp_gives_the_same_greedy_tokens(name, cli, tmp_path, report):
    spec = dict(CONFIGS[name])
    model = cli.make_tiny(tmp_path / "model", **spec)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    path = gguf_export.export(model, tmp_path / "model.gguf", "f32")
    ids = prompt(vocab, PROMPTS[name])

    ours, dumped = cli.generate(model, ids, N_NEW, dump=tmp_path / "logits.safetensors")
    theirs = llamacpp_exact(path, ids)
    assert len(theirs["tokens"]) == N_NEW
    same = sum(a == b for a, b in zip(ours["tokens"], theirs["tokens"]))
    margin = greedy_margins(dumped["step_logits"]).min()

    # Teacher-forced on llama.cpp's own tokens, so the log-probabilities compare step by step even
    # if a greedy choice were to differ.
    their_logprobs = np.array(theirs["logprobs"], dtype=np.float64)
    our_gap = max_gap(log_softmax(dumped["step_logits"]), their_logprobs) if same == N_NEW else None
    plain = max_gap(reference_logprobs(model, ids, theirs["tokens"], PLAIN_GELU), their_logprobs)
    emulated = max_gap(reference_logprobs(model, ids, theirs["tokens"], ggml_gelu), their_logprobs)
    report(
        f"llama.cpp {name}: {same} of {N_NEW} greedy tokens (smallest margin {margin:.4f});"
        f" log-probabilities: ours vs llama.cpp {our_gap:.4f}, f64 reference vs llama.cpp"
        f" {plain:.4f}, {emulated:.4f} with ggml's fp16 GELU table"
    )
    assert theirs["tokens"] == ours["tokens"]
    assert our_gap < LOGPROB_TOL
    assert emulated < EMULATED_TOL


def ct_dequantize(packed, scale, shape):
    """compressed-tensors' own decoder: int4 values times their group scales, in f32."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    values = unpack_from_int32(packed, 4, torch.Size(shape)).to(torch.float32)
    groups = scale.to(torch.float32).repeat_interleave(shape[1] // scale.shape[1], dim=1)
    return (values * groups).numpy()


def test_q4_0_gguf_holds_our_int4_values_bit_for_bit(cli, tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    spec = dict(
        preset="tiny",
        seed=5,
        dtype="bf16",
        hidden=128,
        heads=2,
        kv_heads=2,
        head_dim=32,
        global_head_dim=64,
        intermediate=256,
        ple=64,
    )
    dense = cli.make_tiny(tmp_path / "dense", **spec)
    cli("quantize", dense, tmp_path / "q", "--group", "32", "--emb4", tmp_path / "emb4")
    path = gguf_export.export(
        dense, tmp_path / "q4.gguf", "q4_0", tmp_path / "q", tmp_path / "emb4"
    )

    # Which int4 module each Q4_0 tensor came from, by the exporter's own name table.
    prefix = "model.language_model."
    sources = {}
    for hf, gg in gguf_export.GLOBAL_NAMES.items():
        sources[gg + ".weight"] = prefix + hf[: -len(".weight")]
    for il in range(7):
        for hf, gg in gguf_export.LAYER_NAMES.items():
            if hf.endswith(".weight"):
                sources[f"blk.{il}.{gg}.weight"] = f"{prefix}layers.{il}.{hf[: -len('.weight')]}"
    quantized = gguf_export.Checkpoint(tmp_path / "q")
    emb4 = gguf_export.Checkpoint(tmp_path / "emb4")

    checked = 0
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type != GGMLQuantizationType.Q4_0:
            continue
        module = sources[tensor.name]
        is_table = module.endswith(("embed_tokens", "embed_tokens_per_layer"))
        ckpt = emb4 if is_table else quantized
        packed, scale = ckpt.get(module + ".weight_packed"), ckpt.get(module + ".weight_scale")
        shape = ckpt.get(module + ".weight_shape").tolist()
        theirs = dequantize(np.asarray(tensor.data), GGMLQuantizationType.Q4_0).reshape(shape)
        np.testing.assert_array_equal(theirs, ct_dequantize(packed, scale, shape), err_msg=module)
        checked += 1
    # Every linear of 7 layers (4 of them with k/v), the two vocabulary tables, the projection.
    assert checked == 7 * 7 + 4 * 2 + 3


def test_llamacpp_applies_a_lora_adapter_as_we_do(cli, tmp_path, report):
    """A PEFT adapter of every attention and MLP linear, exported by gguf_export.export_lora and
    loaded by llama.cpp's own adapter code: the same greedy tokens as the engine's `--lora`, and
    log-probabilities as close as without an adapter. The adapter moves the tokens, so it is
    applied on both sides."""
    from safetensors.torch import save_file

    spec = dict(CONFIGS["causal-untied-gqa"])
    model = cli.make_tiny(tmp_path / "model", **spec)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    text = config.get("text_config", config)
    vocab = text["vocab_size"]
    r, alpha = 4, 16.0
    g = torch.Generator().manual_seed(3)
    shapes = {
        "self_attn.q_proj": ("num_attention_heads", "hidden_size"),
        "self_attn.k_proj": ("num_key_value_heads", "hidden_size"),
        "self_attn.v_proj": ("num_key_value_heads", "hidden_size"),
        "self_attn.o_proj": ("hidden_size", "num_attention_heads"),
        "mlp.gate_proj": ("intermediate_size", "hidden_size"),
        "mlp.up_proj": ("intermediate_size", "hidden_size"),
        "mlp.down_proj": ("hidden_size", "intermediate_size"),
    }
    first_shared = text["num_hidden_layers"] - text["num_kv_shared_layers"]
    tensors = {}
    for il, kind in enumerate(text["layer_types"]):
        d = text["global_head_dim"] if kind == "full_attention" else text["head_dim"]

        def width(key):
            heads = key in ("num_attention_heads", "num_key_value_heads")
            return text[key] * d if heads else text[key]

        for module, (out_key, in_key) in shapes.items():
            if il >= first_shared and module in ("self_attn.k_proj", "self_attn.v_proj"):
                continue
            out, inp = width(out_key), width(in_key)
            key = f"base_model.model.model.layers.{il}.{module}"
            tensors[key + ".lora_A.weight"] = torch.randn(r, inp, generator=g) / inp**0.5
            # Small enough that the adapted activations stay O(1): the error of ggml's fp16 GELU
            # table grows with them (a gap of 0.10 with B three times larger, tokens still equal).
            tensors[key + ".lora_B.weight"] = torch.randn(out, r, generator=g) * 0.03
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": True})
    )
    path = gguf_export.export(model, tmp_path / "model.gguf", "f32")
    lora = gguf_export.export_lora(adapter, tmp_path / "adapter.gguf")
    ids = prompt(vocab, PROMPTS["causal-untied-gqa"])

    plain, _ = cli.generate(model, ids, N_NEW)
    ours, dumped = cli.generate(
        model, ids, N_NEW, dump=tmp_path / "logits.safetensors", lora=str(adapter)
    )
    theirs = llamacpp_exact(path, ids, lora=lora)
    moved = sum(a != b for a, b in zip(ours["tokens"], plain["tokens"]))
    gap = max_gap(log_softmax(dumped["step_logits"]), np.array(theirs["logprobs"]))
    report(
        f"llama.cpp with a LoRA adapter (rsLoRA, r {r}): the adapter moves {moved} of {N_NEW}"
        f" greedy tokens; log-probabilities ours vs llama.cpp {gap:.4f}"
    )
    assert moved > 0
    assert theirs["tokens"] == ours["tokens"]
    assert gap < LOGPROB_TOL


def test_export_lora_writes_pefts_scaling_or_refuses(tmp_path):
    """llama.cpp scales each pair by one alpha over the pair's own rank: under use_rslora with a
    rank_pattern no single alpha gives every module PEFT's lora_alpha / sqrt(rank), so the
    others' lora_B carry the difference. What a GGUF LoRA cannot hold is refused, and leaves no
    file."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    prefix = "base_model.model.model.layers.0."
    ranks = {"self_attn.q_proj": 8, "self_attn.o_proj": 4}
    tensors = {}
    for module, rank in ranks.items():
        tensors[f"{prefix}{module}.lora_A.weight"] = torch.randn(rank, 16, generator=g)
        tensors[f"{prefix}{module}.lora_B.weight"] = torch.randn(32, rank, generator=g)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 16.0, "use_rslora": True,
              "rank_pattern": {"q_proj": 8}}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    out = gguf_export.export_lora(adapter, tmp_path / "adapter.gguf")

    import gguf

    reader = gguf.GGUFReader(str(out))
    alpha = float(reader.fields["adapter.lora.alpha"].parts[-1][0])
    written = {t.name: torch.from_numpy(np.array(t.data)) for t in reader.tensors}
    for module, rank in ranks.items():
        gg = gguf_export.LAYER_NAMES[module + ".weight"]
        b = written[f"blk.0.{gg}.weight.lora_b"].reshape(32, rank)
        # llama.cpp's product of the written tensors equals PEFT's of the adapter's.
        theirs = b * (alpha / rank)
        peft = tensors[f"{prefix}{module}.lora_B.weight"] * (16.0 / rank**0.5)
        assert torch.allclose(theirs, peft, rtol=1e-6), module

    for key, value in [("use_dora", True), ("lora_bias", True), ("alpha_pattern", {"q_proj": 2}),
                       ("bias", "all")]:
        (adapter / "adapter_config.json").write_text(json.dumps({**config, key: value}))
        refused = tmp_path / f"{key}.gguf"
        with pytest.raises(ValueError, match=f"{key} .* has no place in a GGUF LoRA"):
            gguf_export.export_lora(adapter, refused)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "adapter.gguf"], key


def test_an_export_that_fails_leaves_no_file(tmp_path):
    """A GGUF is written beside its path and moved there whole: an export refused midway (a
    q4_0 scale that fp16 does not hold, found tensor by tensor) left gigabytes of partial file."""
    out = tmp_path / "model.gguf"
    with pytest.raises(RuntimeError, match="midway"):
        with gguf_export.written_whole(out) as partial:
            partial.write_bytes(b"GGUF")
            raise RuntimeError("midway")
    assert list(tmp_path.iterdir()) == []
    with gguf_export.written_whole(out) as partial:
        partial.write_bytes(b"GGUF")
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]
