"""Export a torchtpu-cpp checkpoint (Hugging Face Gemma 4 layout) to a GGUF for llama.cpp.

    python bench/gguf_export.py MODEL_DIR OUT.gguf --type f32|bf16
    python bench/gguf_export.py DENSE_DIR OUT.gguf --type q4_0 --quantized QDIR [--emb4 EDIR]
    python bench/gguf_export.py ADAPTER_DIR OUT.gguf --lora

The GGUF follows llama.cpp's `gemma4` architecture as its converter writes it
(conversion/gemma.py, Gemma4Model): nothing pre-scaled, norms as stored (Gemma 4 has no +1 shift),
`rope_freqs` expressing the proportional RoPE of full layers, per-layer feed-forward widths, and a
dummy SentencePiece vocabulary of the right size (callers feed token ids, never text).

Q4_0 is a repack, not a requantization: the group-32 symmetric int4 values of a compressed-tensors
pack-quantized checkpoint (`torchtpu-cpp quantize`) become Q4_0 blocks bit for bit. Both store
value = (nibble - 8) * scale per 32 input columns; only the nibble order differs. compressed-tensors
puts column 2k in the low and 2k+1 in the high nibble of byte k; Q4_0 puts element j in the low and
j+16 in the high nibble of byte j of a block, after an fp16 scale. Scales must survive fp16 exactly
(they do for the emb4 tables, stored f16; bf16 scales are checked one by one) or the export fails.
With --emb4 the vocabulary tables (embed_tokens, embed_tokens_per_layer, lm_head) are repacked from
the int4 twin too, which is what the engine runs with `--emb4`.

--lora writes a PEFT LoRA adapter of the text layers' linears as llama.cpp's adapter GGUF
(convert_lora_to_gguf.py's layout: general.type "adapter", adapter.type "lora",
adapter.lora.alpha, and each base tensor's `.lora_a` [r, in] and `.lora_b` [out, r] in f32),
for `llama-server --lora` or node-llama-cpp's `lora` option.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys

import gguf
import numpy as np
import torch
from safetensors import safe_open

Q4_BLOCK = 32
Q4_BLOCK_BYTES = 2 + Q4_BLOCK // 2


class Checkpoint:
    """Tensors of one checkpoint directory by name, over one or more safetensors files."""

    def __init__(self, directory: pathlib.Path):
        self.dir = pathlib.Path(directory)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self._where = {}
        self._handles = []
        for name in files:
            handle = safe_open(str(self.dir / name), framework="pt")
            self._handles.append(handle)
            for key in handle.keys():
                self._where[key] = handle
        config = json.loads((self.dir / "config.json").read_text())
        self.config = config
        self.text = config.get("text_config", config)
        prefixes = ("model.language_model.", "model.")
        self.prefix = next(
            (p for p in prefixes if any(k.startswith(p + "layers.") for k in self._where)), None
        )
        if self.prefix is None:
            raise ValueError(f"{self.dir}: no tensors under model.language_model. or model.")

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.dir}: no tensor {name}")
        return self._where[name].get_tensor(name)

    def shape(self, name: str) -> list[int]:
        return list(self._where[name].get_slice(name).get_shape())


def repack_q4_0(
    packed: torch.Tensor, scale: torch.Tensor, shape: list[int], name: str
) -> np.ndarray:
    """compressed-tensors int4 (I32 words, group-32 scales) -> Q4_0 blocks, [out, in/32*18] bytes."""
    out, cols = shape
    if cols % Q4_BLOCK:
        raise ValueError(f"{name}: {cols} input columns are not a multiple of {Q4_BLOCK}")
    if list(scale.shape) != [out, cols // Q4_BLOCK]:
        raise ValueError(
            f"{name}: weight_scale is {list(scale.shape)}, expected [{out}, {cols // Q4_BLOCK}]"
            " (Q4_0 needs group size 32, symmetric)"
        )
    d = scale.to(torch.float16)
    lost = (d.to(torch.float32) != scale.to(torch.float32)).sum().item()
    if lost:
        raise ValueError(f"{name}: {lost} scales are not exact in fp16; Q4_0 cannot hold them")
    raw = packed.contiguous().numpy().view(np.uint8).reshape(out, -1)[:, : cols // 2]
    nibbles = np.empty((out, cols), dtype=np.uint8)
    nibbles[:, 0::2] = raw & 0x0F
    nibbles[:, 1::2] = raw >> 4
    blocks = nibbles.reshape(out, cols // Q4_BLOCK, Q4_BLOCK)
    qs = blocks[:, :, :16] | (blocks[:, :, 16:] << 4)
    result = np.empty((out, cols // Q4_BLOCK, Q4_BLOCK_BYTES), dtype=np.uint8)
    result[:, :, :2] = d.contiguous().numpy().view(np.uint8).reshape(out, -1, 2)
    result[:, :, 2:] = qs
    return result.reshape(out, -1)


def dummy_vocab(writer: gguf.GGUFWriter, size: int, bos: int, eos: int) -> None:
    """SentencePiece-style tokens: <unk>, <eos>, <bos>, the 256 byte tokens, then placeholders."""
    tokens, types = [], []
    specials = {0: "<unk>", eos: "<eos>", bos: "<bos>"}
    byte_id = 0
    for i in range(size):
        if i in specials:
            tokens.append(specials[i])
            types.append(gguf.TokenType.CONTROL if i else gguf.TokenType.UNKNOWN)
        elif byte_id < 256 and i >= 3:
            tokens.append(f"<0x{byte_id:02X}>")
            types.append(gguf.TokenType.BYTE)
            byte_id += 1
        else:
            tokens.append(f"<tok{i}>")
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * size)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)


def add_hparams(writer: gguf.GGUFWriter, text: dict) -> None:
    layers = text["num_hidden_layers"]
    types = text["layer_types"]
    shared = text.get("num_kv_shared_layers", 0)
    ff = text["intermediate_size"]
    wide = text.get("use_double_wide_mlp", False)
    head_full = text.get("global_head_dim") or text["head_dim"]
    head_swa = text["head_dim"]
    rope = text["rope_parameters"]
    writer.add_context_length(text.get("max_position_embeddings", 131072))
    writer.add_embedding_length(text["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(
        [ff * 2 if wide and il >= layers - shared else ff for il in range(layers)]
    )
    writer.add_head_count(text["num_attention_heads"])
    kv_full = text.get("num_global_key_value_heads") or text["num_key_value_heads"]
    writer.add_head_count_kv(
        [text["num_key_value_heads"] if t == "sliding_attention" else kv_full for t in types]
    )
    writer.add_key_length(head_full)
    writer.add_value_length(head_full)
    writer.add_key_length_swa(head_swa)
    writer.add_value_length_swa(head_swa)
    writer.add_layer_norm_rms_eps(text.get("rms_norm_eps", 1e-6))
    writer.add_sliding_window(text["sliding_window"])
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(text.get("hidden_size_per_layer_input") or 0)
    writer.add_rope_dimension_count(head_full)
    swa_factor = rope["sliding_attention"].get("partial_rotary_factor", 1.0)
    writer.add_rope_dimension_count_swa(int(head_swa * swa_factor))
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if text.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(text["final_logit_softcapping"])


def rope_freqs(text: dict) -> np.ndarray:
    """Frequency divisors of full layers: 1 for rotated pairs, 1e30 (no rotation) for the rest."""
    full = text["rope_parameters"]["full_attention"]
    head_full = text.get("global_head_dim") or text["head_dim"]
    rotated = int(head_full * full.get("partial_rotary_factor", 1.0) / 2)
    return np.array([1.0] * rotated + [1e30] * (head_full // 2 - rotated), dtype=np.float32)


LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.k_norm.weight": "attn_k_norm",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
    "per_layer_input_gate.weight": "inp_gate",
    "per_layer_projection.weight": "proj",
    "post_per_layer_input_norm.weight": "post_norm",
    "layer_scalar": "layer_output_scale",
}
GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd",
    "embed_tokens_per_layer.weight": "per_layer_token_embd",
    "per_layer_model_projection.weight": "per_layer_model_proj",
    "per_layer_projection_norm.weight": "per_layer_proj_norm",
    "norm.weight": "output_norm",
}
VOCAB_TABLES = ("embed_tokens.weight", "embed_tokens_per_layer.weight")


def plan_tensors(dense: Checkpoint, text: dict) -> list[tuple[str, str]]:
    """(HF name, GGUF name) of every tensor to write, in the converter's order."""
    p = dense.prefix
    plan = [(p + hf, gg + ".weight") for hf, gg in GLOBAL_NAMES.items() if dense.has(p + hf)]
    if dense.has("lm_head.weight") and not text.get("tie_word_embeddings", True):
        plan.append(("lm_head.weight", "output.weight"))
    for il in range(text["num_hidden_layers"]):
        lp = f"{p}layers.{il}."
        for hf, gg in LAYER_NAMES.items():
            if dense.has(lp + hf):
                plan.append((lp + hf, f"blk.{il}.{gg}.weight"))
    return plan


@contextlib.contextmanager
def written_whole(out_path):
    """A path beside `out_path` to write, moved into its place when the block ends and removed if
    it raises: a refused export leaves no partial file where the GGUF was asked for."""
    out_path = pathlib.Path(out_path)
    partial = out_path.with_name(out_path.name + ".partial")
    try:
        yield partial
        partial.replace(out_path)
    finally:
        partial.unlink(missing_ok=True)


def export(
    model_dir,
    out_path,
    out_type: str = "f32",
    quantized_dir=None,
    emb4_dir=None,
) -> pathlib.Path:
    """Writes the GGUF; returns its path. `out_type` is f32, bf16 or q4_0 (needs quantized_dir)."""
    dense = Checkpoint(pathlib.Path(model_dir))
    text = dict(dense.text)
    text.setdefault("tie_word_embeddings", dense.config.get("tie_word_embeddings", True))
    quantized = Checkpoint(pathlib.Path(quantized_dir)) if quantized_dir else None
    emb4 = Checkpoint(pathlib.Path(emb4_dir)) if emb4_dir else None
    if out_type == "q4_0" and quantized is None:
        raise ValueError("--type q4_0 repacks int4 values: give --quantized DIR")
    if out_type not in ("f32", "bf16", "q4_0"):
        raise ValueError(f"unknown --type {out_type!r} (f32, bf16, q4_0)")

    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[out_type]
    with written_whole(out_path) as partial:
        writer = gguf.GGUFWriter(str(partial), "gemma4")
        writer.add_name(pathlib.Path(model_dir).name)
        writer.add_file_type(file_type)
        add_hparams(writer, text)
        eos = text.get("eos_token_id", 1)
        dummy_vocab(
            writer,
            text["vocab_size"],
            text.get("bos_token_id", 2),
            eos[0] if isinstance(eos, list) else eos,
        )

        def packed_source(hf_name: str):
            """(checkpoint, module) holding hf_name as int4, or None to write it from dense
            values."""
            if out_type != "q4_0" or not hf_name.endswith(".weight"):
                return None
            module = hf_name[: -len(".weight")]
            short = hf_name.removeprefix(dense.prefix)
            if emb4 is not None and (short in VOCAB_TABLES or hf_name == "lm_head.weight"):
                return (emb4, module)
            if quantized.has(module + ".weight_packed"):
                return (quantized, module)
            return None

        producers = []
        for hf_name, gg_name in plan_tensors(dense, text):
            source = packed_source(hf_name)
            shape = dense.shape(hf_name)
            if source is not None:
                ckpt, module = source
                if not ckpt.has(module + ".weight_packed"):
                    raise ValueError(f"{ckpt.dir}: {module} is not pack-quantized")
                nbytes = shape[0] * shape[1] // Q4_BLOCK * Q4_BLOCK_BYTES
                byte_shape = [shape[0], shape[1] // Q4_BLOCK * Q4_BLOCK_BYTES]
                writer.add_tensor_info(
                    gg_name, byte_shape, np.dtype(np.uint8), nbytes, gguf.GGMLQuantizationType.Q4_0
                )
                producers.append(
                    lambda ckpt=ckpt, module=module, shape=shape: repack_q4_0(
                        ckpt.get(module + ".weight_packed"),
                        ckpt.get(module + ".weight_scale"),
                        shape,
                        module,
                    )
                )
            elif out_type == "f32" or len(shape) < 2:
                numel = int(np.prod(shape))
                writer.add_tensor_info(gg_name, shape, np.dtype(np.float32), numel * 4)
                producers.append(
                    lambda n=hf_name: dense.get(n).to(torch.float32).contiguous().numpy()
                )
            else:
                numel = int(np.prod(shape))
                writer.add_tensor_info(
                    gg_name, shape, np.dtype(np.uint16), numel * 2, gguf.GGMLQuantizationType.BF16
                )
                producers.append(
                    lambda n=hf_name: (
                        dense.get(n)
                        .to(torch.bfloat16)
                        .contiguous()
                        .view(torch.int16)
                        .numpy()
                        .view(np.uint16)
                    )
                )
        freqs = rope_freqs(text)
        writer.add_tensor_info("rope_freqs.weight", freqs.shape, freqs.dtype, freqs.nbytes)
        producers.append(lambda: freqs)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for produce in producers:
            writer.write_tensor_data(produce())
        writer.close()
    return pathlib.Path(out_path)


# adapter_config.json's fields whose adapters llama.cpp's GGUF LoRA cannot hold (it applies
# B·A times one alpha over each pair's rank, and nothing else): written anyway, llama.cpp would
# apply them wrongly. The engine refuses the same ones.
UNEXPORTABLE = {
    "use_dora": "DoRA's magnitude vectors",
    "lora_bias": "LoRA biases",
    "alpha_pattern": "per-module alphas",
    "modules_to_save": "modules trained whole",
    "layer_replication": "replicated layers",
    "trainable_token_indices": "trained token rows",
}


def export_lora(adapter_dir, out_path) -> pathlib.Path:
    """Writes a PEFT adapter's GGUF for llama.cpp; returns its path. llama.cpp scales each pair by
    adapter.lora.alpha / rank, the rank its tensors give, where PEFT scales by lora_alpha / r (or
    lora_alpha / sqrt(r) with use_rslora), r rank_pattern's for its modules: alpha is written as
    lora_alpha * sqrt(r) under use_rslora, and each lora_B whose scaling that alpha does not give
    (a rank_pattern rank under use_rslora) is scaled by the difference. ValueError for an adapter
    llama.cpp cannot apply as PEFT does (UNEXPORTABLE)."""
    adapter_dir = pathlib.Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    for key, what in UNEXPORTABLE.items():
        if config.get(key):
            raise ValueError(f"{adapter_dir}: {key} ({what}) has no place in a GGUF LoRA")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{adapter_dir}: bias {config['bias']!r} (trained biases) has no place in "
                         "a GGUF LoRA")
    r, alpha = config["r"], float(config["lora_alpha"])
    rslora = bool(config.get("use_rslora"))
    written_alpha = alpha * r**0.5 if rslora else alpha

    def b_factor(rank: int) -> float:
        """PEFT's scaling of a pair of `rank` over the one llama.cpp gives it."""
        peft = alpha / rank**0.5 if rslora else alpha / rank
        return peft / (written_alpha / rank)

    tensors = {}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        for key in f.keys():
            tensors[key] = f.get_tensor(key).to(torch.float32)
    with written_whole(out_path) as partial:
        writer = gguf.GGUFWriter(str(partial), "gemma4")
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, written_alpha)
        for key in sorted(tensors):
            if ".lora_A." not in key:
                continue
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            layer, _, name = module.partition("layers.")[2].partition(".")
            gg = LAYER_NAMES.get(name + ".weight")
            if gg is None:
                raise ValueError(f"{adapter_dir}: {module} has no llama.cpp tensor")
            base = f"blk.{layer}.{gg}.weight"
            a, b = tensors[key], tensors[key.replace(".lora_A.", ".lora_B.")]
            factor = b_factor(a.shape[0])
            writer.add_tensor(base + ".lora_a", a.contiguous().numpy())
            writer.add_tensor(
                base + ".lora_b", (b if factor == 1.0 else b * factor).contiguous().numpy()
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return pathlib.Path(out_path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="dense checkpoint directory (make-tiny output)")
    parser.add_argument("out", help="GGUF file to write")
    parser.add_argument("--type", default="f32", choices=["f32", "bf16", "q4_0"])
    parser.add_argument("--quantized", help="pack-quantized checkpoint of the same model (q4_0)")
    parser.add_argument("--emb4", help="its int4 vocabulary twin (q4_0)")
    parser.add_argument("--lora", action="store_true", help="model is a PEFT LoRA adapter's dir")
    args = parser.parse_args(argv)
    if args.lora:
        path = export_lora(args.model, args.out)
        print(f"wrote {path} (LoRA adapter, f32)")
        return 0
    path = export(args.model, args.out, args.type, args.quantized, args.emb4)
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {args.type})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
