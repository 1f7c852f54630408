"""The int4 quant layer against the compressed-tensors library (PyPI), its independent reference.

- Checkpoints written by the library's own compressor (ModelCompressor over real nn.Linear
  modules, qparams from the library's min-max code) dequantize through our reader bit for bit as
  the library's decompressor does them.
- Our quantizer reproduces the library's qparams and packing bit for bit.
- Checkpoints written by our `quantize` command carry the library's config format, decompress
  with the library's model-free dequantizer to what our reader gives, and stay within the
  quantization error of the original weights.
"""

import json
import os
import pathlib
import subprocess

import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStatus,
)
from compressed_tensors.quantization.lifecycle.apply import apply_quantization_config
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
from compressed_tensors.quantization.utils.helpers import (
    calculate_qparams,
    compute_dynamic_scales_and_zp,
)
from safetensors.torch import load_file, save_file

REPO = pathlib.Path(__file__).resolve().parents[2]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _tool():
    if os.environ.get("TORCHTPU_QUANT_TOOL"):
        return os.environ["TORCHTPU_QUANT_TOOL"]
    found = sorted(REPO.glob("build*/tests/quant_tool"), key=lambda p: -p.stat().st_mtime)
    if not found:
        pytest.fail(
            "quant_tool is not built (ninja -C build-<name> quant_tool) and TORCHTPU_QUANT_TOOL is unset"
        )
    return str(found[0])


def run_tool(*args):
    result = subprocess.run([_tool(), *map(str, args)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"quant_tool {' '.join(map(str, args))} failed:\n{result.stderr}"
    return result.stdout


def dequant(directory, modules, tmp_path, dtype, rows=()):
    """Our reader's dequantize (and dequantize_rows of `rows`) of each module, in one process."""
    out = tmp_path / "dequantized.safetensors"
    run_tool(
        "dequant",
        directory,
        out,
        *modules,
        "--dtype",
        dtype,
        *(["--rows", ",".join(map(str, rows))] if rows else []),
    )
    return load_file(str(out))


def bits_equal(a, b):
    """Same dtype, shape and bit pattern (torch.equal would let -0.0 == 0.0 pass)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))
    )


def weight_args(strategy, group_size, symmetric, **extra):
    return QuantizationArgs(
        num_bits=4,
        type="int",
        symmetric=symmetric,
        strategy=strategy,
        group_size=group_size if strategy == "group" else None,
        dynamic=False,
        observer="minmax",
        **extra,
    )


def minmax_qparams(weight, args):
    """The min-max observer's qparams, from the library's own functions: per group via
    compute_dynamic_scales_and_zp, per output row via calculate_qparams."""
    if args.strategy == "channel":
        return calculate_qparams(
            weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), args
        )
    return compute_dynamic_scales_and_zp(weight, args, module=None)


def random_weight(out, inp, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * 0.05
    # A few outliers and an all-negative row make the asymmetric zero points non-trivial.
    w[0, : min(inp, 7)] += 0.4
    w[-1] = -w[-1].abs() - 0.01
    return w.to(dtype)


def build_model(modules):
    root = torch.nn.Module()
    for name, module in modules.items():
        parent = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, module)
    return root


# (module, out, in, weight dtype, strategy, group size, symmetric, config target)
LIBRARY_CASES = [
    ("model.layers.0.self_attn.q_proj", 45, 160, torch.bfloat16, "group", 32, True, "exact"),
    ("model.layers.0.self_attn.k_proj", 45, 160, torch.bfloat16, "group", 32, False, "exact"),
    ("model.layers.0.mlp.gate_proj", 19, 384, torch.float16, "group", 128, True, "regex"),
    ("model.layers.0.mlp.up_proj", 19, 256, torch.float32, "group", 128, False, "exact"),
    ("model.layers.0.mlp.down_proj", 33, 100, torch.bfloat16, "channel", None, True, "exact"),
    ("model.layers.0.self_attn.o_proj", 33, 100, torch.float16, "channel", None, False, "exact"),
    ("model.layers.1.mlp.down_proj", 12, 64, torch.bfloat16, "group", 32, True, "class"),
]
# compressed-tensors 0.20.1 removed activation ordering (actorder "group", the g_idx writer), so
# these are written from the library's pieces: its qparams per g_idx group, its quantize() and
# pack_to_int32(), and the reference is its unpack_from_int32() + dequantize() on the gathered
# scales and zero points.
G_IDX_CASES = [
    ("model.layers.1.mlp.gate_proj", 21, 128, torch.bfloat16, 32, False),
    ("model.layers.1.mlp.up_proj", 21, 96, torch.float16, 32, True),
]


def write_config(directory, quantization_config):
    config = {
        "model_type": "gemma4_text",
        "vocab_size": 16,
        "hidden_size": 8,
        "quantization_config": quantization_config,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def library_checkpoint(tmp_path_factory):
    """A checkpoint written by the library's compressor and the library's own decompression of it."""
    directory = tmp_path_factory.mktemp("library_ckpt")
    modules, groups, weights = {}, {}, {}
    for i, (name, out, inp, dtype, strategy, group_size, symmetric, target) in enumerate(
        LIBRARY_CASES
    ):
        linear = torch.nn.Linear(inp, out, bias=False, dtype=dtype)
        weights[name] = random_weight(out, inp, dtype, seed=i)
        linear.weight.data.copy_(weights[name])
        modules[name] = linear
        targets = {"exact": [name], "regex": [r"re:.*\.mlp\.gate_p"], "class": ["Linear"]}[target]
        groups[f"group_{i}"] = QuantizationScheme(
            targets=targets,
            weights=weight_args(strategy, group_size, symmetric),
            format="pack-quantized",
        )
    modules["model.embed_tokens"] = torch.nn.Embedding(16, 8)
    model = build_model(modules)
    config = QuantizationConfig(
        config_groups=groups,
        ignore=["lm_head"],
        format="pack-quantized",
        quantization_status="frozen",
    )
    apply_quantization_config(model, config)
    for name, *_ in LIBRARY_CASES:
        module = model.get_submodule(name)
        scale, zero = minmax_qparams(weights[name], module.quantization_scheme.weights)
        module.weight_scale.data.copy_(scale)
        module.weight_zero_point.data.copy_(zero)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}

    reference = {}
    g_idx_groups = {}
    for i, (name, out, inp, dtype, group_size, symmetric) in enumerate(G_IDX_CASES):
        w = random_weight(out, inp, dtype, seed=100 + i)
        g_idx = torch.randperm(inp, generator=torch.Generator().manual_seed(7 + i)) // group_size
        n_groups = inp // group_size
        args = weight_args("group", group_size, symmetric)
        per_group = [
            minmax_qparams(w[:, g_idx == g].contiguous(), weight_args("channel", None, symmetric))
            for g in range(n_groups)
        ]
        scale = torch.cat([s for s, _ in per_group], dim=1)
        zero = torch.cat([z for _, z in per_group], dim=1)
        column_args = weight_args("group", 1, symmetric)
        q = quantize(w, scale[:, g_idx], zero[:, g_idx], column_args, dtype=torch.int8)
        tensors[f"{name}.weight_packed"] = pack_to_int32(q, 4)
        tensors[f"{name}.weight_scale"] = scale
        tensors[f"{name}.weight_shape"] = torch.tensor([out, inp])
        tensors[f"{name}.weight_g_idx"] = g_idx.to(torch.int32)
        if not symmetric:
            tensors[f"{name}.weight_zero_point"] = pack_to_int32(zero, 4, packed_dim=0).contiguous()
        unpacked = unpack_from_int32(tensors[f"{name}.weight_packed"], 4, torch.Size([out, inp]))
        zero_ref = None
        if not symmetric:
            zero_ref = unpack_from_int32(
                tensors[f"{name}.weight_zero_point"], 4, torch.Size([out, n_groups]), packed_dim=0
            )[:, g_idx]
        reference[name] = dequantize(unpacked, scale[:, g_idx], zero_ref, column_args)
        g_idx_groups[f"group_gidx_{i}"] = QuantizationScheme(
            targets=[name], weights=args, format="pack-quantized"
        )

    save_file(tensors, str(directory / "model.safetensors"))
    write_config(directory, {})
    compressor.update_config(str(directory))
    config_json = json.loads((directory / "config.json").read_text())
    for key, scheme in g_idx_groups.items():
        config_json["quantization_config"]["config_groups"][key] = scheme.model_dump()
    (directory / "config.json").write_text(json.dumps(config_json, indent=2))

    compressor.decompress_model(model)
    for name, *_ in LIBRARY_CASES:
        reference[name] = model.get_submodule(name).weight.data.clone()
    return directory, reference


@pytest.mark.parametrize(
    "case", LIBRARY_CASES + G_IDX_CASES, ids=lambda c: c[0].removeprefix("model.layers.")
)
def test_dequantize_is_bit_identical_to_the_library(library_checkpoint, tmp_path, case):
    directory, reference = library_checkpoint
    name, out = case[0], case[1]
    expected = reference[name]
    dtype = {v: k for k, v in DTYPES.items()}[expected.dtype]
    rows = [out - 1, 0, 3, 3, out // 2]
    ours = dequant(directory, [name], tmp_path, dtype, rows)
    assert bits_equal(ours[name], expected)
    assert bits_equal(ours[f"{name}.rows"], expected[rows])


def test_dequantize_converts_after_rounding_to_the_scale_dtype(library_checkpoint, tmp_path):
    directory, reference = library_checkpoint
    name = "model.layers.0.self_attn.k_proj"
    assert torch.equal(dequant(directory, [name], tmp_path, "f32")[name], reference[name].float())


def test_library_checkpoint_config_and_tensors_agree(library_checkpoint):
    directory, _ = library_checkpoint
    assert run_tool("mismatch", directory).strip() == ""


# (out, in, weight dtype, group size (-1: channel), symmetric, scale dtype)
QUANTIZE_CASES = [
    (40, 96, "bf16", 32, True, None),
    (37, 96, "bf16", 32, False, None),
    (19, 256, "f16", 128, True, None),
    (19, 256, "f32", 128, False, None),
    (33, 100, "bf16", -1, True, None),
    (33, 100, "f32", -1, False, None),
    (50, 64, "bf16", 32, True, "f16"),
]


@pytest.mark.parametrize("case", QUANTIZE_CASES, ids=str)
def test_quantize_reproduces_the_library_bit_for_bit(tmp_path, case):
    out, inp, dtype, group_size, symmetric, scale_dtype = case
    w = random_weight(out, inp, DTYPES[dtype], seed=out * inp)
    w[1, :32] = 0  # an all-zero group: its scale is the dtype's eps
    save_file({"w": w}, str(tmp_path / "in.safetensors"))
    flags = ["--group", group_size] + ([] if symmetric else ["--asym"])
    flags += ["--scale-dtype", scale_dtype] if scale_dtype else []
    run_tool(
        "quantize-weight", tmp_path / "in.safetensors", "w", tmp_path / "q.safetensors", *flags
    )
    ours = load_file(str(tmp_path / "q.safetensors"))

    strategy = "channel" if group_size == -1 else "group"
    extra = {"scale_dtype": DTYPES[scale_dtype]} if scale_dtype else {}
    args = weight_args(strategy, group_size, symmetric, **extra)
    observed = w.float() if scale_dtype else w
    scale, zero = minmax_qparams(observed, args)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressed = PackedQuantizationCompressor.compress(
        {"weight": observed, "weight_scale": scale, "weight_zero_point": zero}, scheme
    )
    assert torch.equal(ours["weight_packed"], compressed["weight_packed"])
    expected_scale = compressed["weight_scale"].to(DTYPES[scale_dtype] if scale_dtype else w.dtype)
    assert bits_equal(ours["weight_scale"], expected_scale)
    if symmetric:
        assert "weight_zero_point" not in ours and "weight_zero_point" not in compressed
    else:
        assert torch.equal(ours["weight_zero_point"], compressed["weight_zero_point"])


HIDDEN, VOCAB, LAYERS, PLE = 64, 300, 2, 32
HEADS, KV_HEADS, HEAD_DIM, FF = 8, 1, 20, 96
TEXT = "model.language_model."


def dense_model(directory):
    """A dense Gemma-4-shaped bf16 checkpoint (multimodal names, one vision tensor), with a
    tokenizer file to copy; shapes small and awkward (k/v_proj's 20 outputs and the vocabulary
    are not multiples of 8), and every tensor the config implies, as quantize checks."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)
    t = {
        f"{TEXT}embed_tokens.weight": rand(VOCAB, HIDDEN),
        f"{TEXT}embed_tokens_per_layer.weight": rand(VOCAB, LAYERS * PLE),
        f"{TEXT}per_layer_model_projection.weight": rand(LAYERS * PLE, HIDDEN),
        f"{TEXT}per_layer_projection_norm.weight": rand(PLE),
        f"{TEXT}norm.weight": rand(HIDDEN),
        "model.vision_tower.encoder.fc.weight": rand(24, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"{TEXT}layers.{i}."
        t |= {
            p + "input_layernorm.weight": rand(HIDDEN),
            p + "post_attention_layernorm.weight": rand(HIDDEN),
            p + "pre_feedforward_layernorm.weight": rand(HIDDEN),
            p + "post_feedforward_layernorm.weight": rand(HIDDEN),
            p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": rand(HEAD_DIM),
            p + "self_attn.k_norm.weight": rand(HEAD_DIM),
            p + "mlp.gate_proj.weight": rand(FF, HIDDEN),
            p + "mlp.up_proj.weight": rand(FF, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, FF),
            p + "per_layer_input_gate.weight": rand(PLE, HIDDEN),
            p + "per_layer_projection.weight": rand(HIDDEN, PLE),
            p + "post_per_layer_input_norm.weight": rand(HIDDEN),
            p + "layer_scalar": rand(1),
        }
    save_file(t, str(directory / "model.safetensors"))
    text_config = {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "global_head_dim": HEAD_DIM,
        "hidden_size_per_layer_input": PLE,
        "vocab_size_per_layer_input": VOCAB,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_kv_shared_layers": 0,
        "tie_word_embeddings": True,
    }
    config = {"model_type": "gemma4", "text_config": text_config, "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "tokenizer.json").write_text('{"version": "1.0"}')
    (directory / "chat_template.jinja").write_text("{{ messages }}")
    return t


def library_format_config(tmp_path, weights, ignore):
    """The quantization_config the library itself writes for this scheme (update_config)."""
    groups = {
        name: QuantizationScheme(
            targets=targets, weights=weight_args(**args), format="pack-quantized"
        )
        for name, (targets, args) in weights.items()
    }
    qc = QuantizationConfig(
        config_groups=groups,
        ignore=ignore,
        format="pack-quantized",
        quantization_status="compressed",
    )
    directory = tmp_path / "library_config"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    ModelCompressor(quantization_config=qc).update_config(str(directory))
    return json.loads((directory / "config.json").read_text())["quantization_config"]


def load_dir(directory):
    tensors = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors |= load_file(str(f))
    return tensors


def is_linear(name):
    return (
        name.startswith(TEXT)
        and name.endswith(".weight")
        and "embed_tokens" not in name
        and "norm" not in name
    )


@pytest.mark.parametrize(
    "group_size,symmetric",
    [(32, True), (16, False), (-1, True)],
    ids=["g32", "g16-asym", "channel"],
)
def test_quantize_command_writes_what_the_library_reads(tmp_path, group_size, symmetric):
    (tmp_path / "in").mkdir()
    source = dense_model(tmp_path / "in")
    out = tmp_path / "out"
    run_tool(
        "quantize", tmp_path / "in", out, "--group", group_size, *([] if symmetric else ["--asym"])
    )
    config = json.loads((out / "config.json").read_text())
    strategy = "channel" if group_size == -1 else "group"
    args = {"strategy": strategy, "group_size": group_size, "symmetric": symmetric}
    expected = library_format_config(
        tmp_path, {"group_0": (["Linear"], args)}, ["lm_head", r"re:model\.vision_tower\..*"]
    )
    assert config["quantization_config"] == expected
    assert (
        config["text_config"]
        == json.loads((tmp_path / "in" / "config.json").read_text())["text_config"]
    )
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert (out / "chat_template.jinja").exists()

    stored = load_dir(out)
    quantized = {n.removesuffix(".weight_packed") for n in stored if n.endswith(".weight_packed")}
    assert quantized == {n.removesuffix(".weight") for n in source if is_linear(n)}
    for name, tensor in source.items():
        if not is_linear(name):
            assert torch.equal(stored[name], tensor), name
    for module in quantized:
        assert stored[f"{module}.weight_packed"].dtype == torch.int32
        assert stored[f"{module}.weight_shape"].dtype == torch.int64
        assert stored[f"{module}.weight_scale"].dtype == torch.bfloat16
        assert (f"{module}.weight_zero_point" in stored) == (not symmetric)

    library = CompressedTensorsDequantizer(str(out), dtype=torch.float32).validate(dict(stored))
    ours = dequant(out, sorted(quantized), tmp_path, "f32")
    for module in sorted(quantized):
        original = source[f"{module}.weight"].double()
        theirs = library[f"{module}.weight"]
        assert torch.equal(ours[module], theirs), module
        scale = stored[f"{module}.weight_scale"].double()
        scale = scale.repeat_interleave(original.shape[1] // scale.shape[1], dim=1)
        error = (theirs.double() - original).abs()
        # Half a step, plus what the library's bf16 arithmetic adds before rounding to an integer:
        # w / scale and + zero point each round to bf16 (2^-5 at |value| < 16), and a rounded
        # scale can leave the group's extremes just outside [-8, 7] (measured worst: 0.597).
        assert torch.all(error <= 0.625 * scale + theirs.double().abs() * 2**-8), module
    assert run_tool("mismatch", out).strip() == ""


@pytest.fixture(scope="module")
def emb4_twin(tmp_path_factory):
    directory = tmp_path_factory.mktemp("emb4")
    (directory / "in").mkdir()
    source = dense_model(directory / "in")
    run_tool(
        "quantize", directory / "in", directory / "out", "--group", 32, "--emb4", directory / "emb4"
    )
    return directory, source


TABLES = [f"{TEXT}embed_tokens", f"{TEXT}embed_tokens_per_layer", "lm_head"]


def test_emb4_twin_is_what_the_library_reads(emb4_twin, tmp_path):
    directory, source = emb4_twin
    twin = directory / "emb4"
    config = json.loads((twin / "config.json").read_text())
    assert (
        config["tie_word_embeddings"] is False
        and config["text_config"]["tie_word_embeddings"] is False
    )
    table = {"strategy": "group", "group_size": 32, "symmetric": True}
    expected = library_format_config(
        tmp_path,
        {
            "group_embed_tokens_per_layer": ([r"re:.*\.embed_tokens_per_layer$"], table),
            "group_embed_tokens": ([r"re:.*\.embed_tokens$"], table),
            "group_lm_head": (["re:^lm_head$"], table),
            "group_0": (["Linear"], table),
        },
        [r"re:model\.vision_tower\..*"],
    )
    assert config["quantization_config"] == expected

    stored = load_dir(twin)
    for name, tensor in load_dir(directory / "out").items():
        if "embed_tokens" not in name:
            assert torch.equal(stored[name], tensor), name
    for module in TABLES:
        assert f"{module}.weight" not in stored
        assert stored[f"{module}.weight_scale"].dtype == torch.float16
        assert f"{module}.weight_zero_point" not in stored
    for suffix in ("weight_packed", "weight_scale", "weight_shape"):
        assert torch.equal(stored[f"lm_head.{suffix}"], stored[f"{TEXT}embed_tokens.{suffix}"])

    library = CompressedTensorsDequantizer(str(twin), dtype=torch.float32).validate(dict(stored))
    for module in TABLES[:2]:
        original = source[f"{module}.weight"].double()
        theirs = library[f"{module}.weight"].double()
        scale = stored[f"{module}.weight_scale"].double().repeat_interleave(32, dim=1)
        # Symmetric, f32 arithmetic: half a step; the f16-rounded scale may sit 2^-11 below
        # amax / 7.5, so the group's extreme overshoots 7.5 steps by up to 8 * 2^-11 before the
        # clamp to 7; plus the f16 rounding of the product.
        bound = (0.5 + 8 * 2**-11) * scale + theirs.abs() * 2**-11
        assert torch.all((theirs - original).abs() <= bound), module


def test_emb4_twin_reads_back_through_our_reader(emb4_twin, tmp_path):
    directory, _ = emb4_twin
    twin = directory / "emb4"
    library = CompressedTensorsDequantizer(str(twin), dtype=torch.float32).validate(load_dir(twin))
    rows = [VOCAB - 1, 0, 17, 17]
    ours = dequant(twin, TABLES, tmp_path, "f32", rows)
    for module in TABLES:
        theirs = library[f"{module}.weight"]
        assert torch.equal(ours[module], theirs), module
        assert torch.equal(ours[f"{module}.rows"], theirs[rows]), module


def test_an_emb4_directory_without_int4_tables_is_refused(emb4_twin, cli):
    """--emb4 takes the int4 tables of the twin; a checkpoint holding only dense ones (the dense
    source, or the W4A16 output) would have its tables replace the model's, silently."""
    directory, _ = emb4_twin
    ids = "2,5,9"
    for dense in (directory / "in", directory / "out"):
        proc = subprocess.run(
            [cli.path, "generate", "--model", directory / "out", "--emb4", dense, "--ids", ids,
             "--max-new", "1", "--json"],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 1, proc.stderr  # a FormatError, as a damaged checkpoint's
        assert (
            f"--emb4 {dense} holds no int4 vocabulary table (embed_tokens, "
            "embed_tokens_per_layer or lm_head, packed): it takes the twin that quantize --emb4 "
            "writes"
        ) in proc.stderr, proc.stderr
    cli("generate", "--model", directory / "out", "--emb4", directory / "emb4", "--ids", ids,
        "--max-new", "1", "--json")


def test_a_refused_quantize_leaves_no_output(tmp_path):
    """Groups that do not fit are found before anything is written; a failure once OUT is made
    (an --emb4 directory that cannot be) removes it; --emb4 cannot be OUT or inside it."""
    (tmp_path / "in").mkdir()
    dense_model(tmp_path / "in")

    def refused(*args):
        result = subprocess.run(
            [_tool(), "quantize", tmp_path / "in", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode != 0, result.stderr
        return result.stderr

    assert "input columns are not a multiple of the group size 48" in refused(
        tmp_path / "q", "--group", "48"
    )
    (tmp_path / "file").write_text("")
    assert "cannot create --emb4 directory" in refused(
        tmp_path / "q", "--emb4", tmp_path / "file" / "emb4"
    )
    assert "must be apart" in refused(tmp_path / "q", "--emb4", tmp_path / "q")
    assert "must be apart" in refused(tmp_path / "q", "--emb4", tmp_path / "q" / "emb4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "in"]


def test_quantize_refuses_a_non_empty_output_and_a_quantized_input(tmp_path):
    (tmp_path / "in").mkdir()
    dense_model(tmp_path / "in")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    result = subprocess.run(
        [_tool(), "quantize", tmp_path / "in", tmp_path / "busy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "exists and is not an empty directory" in result.stderr
    run_tool("quantize", tmp_path / "in", tmp_path / "q")
    result = subprocess.run(
        [_tool(), "quantize", tmp_path / "q", tmp_path / "q2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "already quantized" in result.stderr


def refused_quantize(source, out):
    """quantize's stderr, once it has refused `source` as a FormatError (exit 1)."""
    result = subprocess.run(
        [_tool(), "quantize", source, out], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def set_text_config(directory, **fields):
    """Sets (or, for None, removes) fields of the checkpoint's text_config."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in fields.items():
        if value is None:
            del config["text_config"][key]
        else:
            config["text_config"][key] = value
    path.write_text(json.dumps(config))


# (text_config fields set, the first tensor that contradicts them, its shape, and what
# config.json implies, naming the fields behind each contradicted dimension).
CONTRADICTIONS = {
    "hidden_size": (
        {"hidden_size": 72},
        "embed_tokens.weight",
        "[300, 64]",
        "[300, 72] (text_config.hidden_size = 72)",
    ),
    "intermediate_size": (
        {"intermediate_size": 128},
        "layers.0.mlp.down_proj.weight",
        "[64, 96]",
        "[64, 128] (text_config.intermediate_size = 128)",
    ),
    "num_attention_heads": (
        {"num_attention_heads": 4},
        "layers.0.self_attn.o_proj.weight",
        "[64, 160]",
        "[64, 80] (text_config.num_attention_heads * text_config.head_dim = 4 * 20 = 80)",
    ),
    "vocab_size": (
        {"vocab_size": 256},
        "embed_tokens.weight",
        "[300, 64]",
        "[256, 64] (text_config.vocab_size = 256)",
    ),
    "num_hidden_layers": (
        {"num_hidden_layers": 1, "layer_types": ["full_attention"]},
        "embed_tokens_per_layer.weight",
        "[300, 64]",
        "[300, 32] (text_config.num_hidden_layers * text_config.hidden_size_per_layer_input"
        " = 1 * 32 = 32)",
    ),
    "hidden_size_absent": (
        {"hidden_size": None},
        "embed_tokens.weight",
        "[300, 64]",
        "[300, 2304] (text_config.hidden_size = 2304, transformers' default: config.json does"
        " not set it)",
    ),
}


@pytest.mark.parametrize("case", CONTRADICTIONS.values(), ids=CONTRADICTIONS.keys())
def test_quantize_refuses_a_config_the_tensor_shapes_contradict(tmp_path, case):
    """The loader's own shape check, before anything is written: OUT is never created."""
    fields, tensor, shape, implied = case
    (tmp_path / "in").mkdir()
    dense_model(tmp_path / "in")
    set_text_config(tmp_path / "in", **fields)
    error = refused_quantize(tmp_path / "in", tmp_path / "q")
    file = tmp_path / "in" / "model.safetensors"
    assert error == (
        f"error: tensor {TEXT}{tensor} in {file} has shape {shape} but config.json implies "
        f"{implied}\n"
    )
    assert not (tmp_path / "q").exists()


def test_quantize_refuses_a_tensor_the_config_does_not_imply_or_lacks_one_it_does(tmp_path):
    """A text tensor beyond the config's layers, or one of its layers' tensors missing, is
    refused by name, and an empty OUT is left empty. (Tensors outside the text model, such as
    dense_model's vision tower, are their towers' to check: quantize copies them.)"""
    (tmp_path / "in").mkdir()
    source = dense_model(tmp_path / "in")
    file = tmp_path / "in" / "model.safetensors"
    (tmp_path / "q").mkdir()

    extra = f"{TEXT}layers.2.mlp.up_proj.weight"
    save_file(source | {extra: torch.zeros(FF, HIDDEN, dtype=torch.bfloat16)}, str(file))
    assert refused_quantize(tmp_path / "in", tmp_path / "q") == (
        f"error: checkpoint {tmp_path / 'in'} has tensor {extra} [{FF}, {HIDDEN}] in {file}, "
        "which config.json does not imply (text_config.num_hidden_layers = 2)\n"
    )
    missing = f"{TEXT}layers.1.mlp.up_proj.weight"
    save_file({k: v for k, v in source.items() if k != missing}, str(file))
    assert refused_quantize(tmp_path / "in", tmp_path / "q") == (
        f"error: checkpoint {tmp_path / 'in'} has no tensor {missing}, which config.json "
        "implies\n"
    )
    assert list((tmp_path / "q").iterdir()) == []
