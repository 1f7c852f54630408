"""Our config.json reader against transformers' Gemma4 configs.

transformers writes the configs (`save_pretrained`, which in 5.x puts per-layer head dims in
`per_layer_config`) and is the reference for what they mean: per-layer head dims, MLP widths, K/V
sources, RoPE parameters. The C++ side is reached through the `config_dump` test tool (path in
$CONFIG_DUMP).
"""

import json
import os
import subprocess

import pytest
from transformers import (
    Gemma4AssistantConfig,
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4TextConfig,
    Gemma4VisionConfig,
    GenerationConfig,
)

DUMP = os.environ.get("CONFIG_DUMP", "")

E2B_LAYER_TYPES = (["sliding_attention"] * 4 + ["full_attention"]) * 7


def e2b_text(**overrides):
    kwargs = dict(
        vocab_size=262144, hidden_size=1536, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, intermediate_size=6144,
        use_double_wide_mlp=True, layer_types=E2B_LAYER_TYPES, final_logit_softcapping=30.0,
        num_kv_shared_layers=20, hidden_size_per_layer_input=256,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                               "partial_rotary_factor": 0.25},
        },
    )  # fmt: skip
    kwargs.update(overrides)
    return Gemma4TextConfig(**kwargs)


def tiny_text(**overrides):
    kwargs = dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, intermediate_size=128,
        use_double_wide_mlp=True, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=512, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    kwargs.update(overrides)
    return Gemma4TextConfig(**kwargs)


CASES = {
    "e2b_multimodal": lambda: Gemma4Config(text_config=e2b_text().to_dict(), eos_token_id=[1, 106]),
    "e2b_text_only": lambda: e2b_text(),
    "e2b_with_audio": lambda: Gemma4Config(
        text_config=e2b_text().to_dict(), audio_config=Gemma4AudioConfig().to_dict()
    ),
    "tiny_with_audio": lambda: Gemma4Config(
        text_config=tiny_text().to_dict(),
        audio_config=Gemma4AudioConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, hidden_act="gelu_pytorch_tanh",
            subsampling_conv_channels=[64, 8], attention_context_right=3, use_clipped_linears=False,
            output_proj_dims=24,
        ).to_dict(),
        audio_token_id=400, boa_token_id=401, eoa_token_index=402,
    ),  # fmt: skip
    "tiny_text_only": lambda: tiny_text(final_logit_softcapping=None),
    "tiny_multimodal": lambda: Gemma4Config(text_config=tiny_text(eos_token_id=[1, 106]).to_dict()),
    "tiny_no_sharing": lambda: tiny_text(num_kv_shared_layers=0, use_double_wide_mlp=False),
    "e2b_vision": lambda: Gemma4Config(
        text_config=e2b_text().to_dict(), vision_config=Gemma4VisionConfig().to_dict()
    ),
    "tiny_vision_clipped": lambda: Gemma4Config(
        text_config=tiny_text().to_dict(),
        vision_config=Gemma4VisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, pooling_kernel_size=2, patch_size=4,
            position_embedding_size=64, use_clipped_linears=True, standardize=True,
            rope_parameters={"rope_type": "axial", "rope_theta": 50.0},
        ).to_dict(),
        image_token_id=500, boi_token_id=501, eoi_token_id=502,
    ),  # fmt: skip
}


@pytest.fixture(scope="module", autouse=True)
def _dump_tool():
    assert DUMP and os.path.exists(DUMP), "set CONFIG_DUMP to the config_dump binary"


def dump(path):
    out = subprocess.run([DUMP, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def eos_list(v):
    return [] if v is None else [v] if isinstance(v, int) else list(v)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers(tmp_path, case):
    config = CASES[case]()
    config.save_pretrained(tmp_path)
    ours = dump(tmp_path)

    # What transformers makes of the saved file, read back as a model would.
    loaded = type(config).from_pretrained(tmp_path)
    text = loaded.get_text_config()
    n = text.num_hidden_layers
    assert ours["num_hidden_layers"] == n
    for field in ["vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                  "intermediate_size", "use_double_wide_mlp", "hidden_size_per_layer_input",
                  "vocab_size_per_layer_input", "sliding_window", "rms_norm_eps",
                  "num_kv_shared_layers", "hidden_activation", "max_position_embeddings",
                  "bos_token_id", "pad_token_id"]:  # fmt: skip
        assert ours[field] == getattr(text, field), field
    assert ours["final_logit_softcapping"] == (text.final_logit_softcapping or 0.0)
    assert ours["tie_word_embeddings"] == loaded.tie_word_embeddings

    modes = text.kv_sharing_modes
    first_shared = n - text.num_kv_shared_layers
    for i, layer in enumerate(ours["layers"]):
        per_layer = text.per_layer_config[i]
        assert layer["type"] == text.layer_types[i], i
        assert layer["head_dim"] == per_layer.head_dim, i
        assert per_layer.num_key_value_heads == ours["num_key_value_heads"], i
        assert layer["shared"] == (modes[i] == "reuse"), i
        mlp_width = text.intermediate_size * (2 if text.use_double_wide_mlp and layer["shared"] else 1)
        assert layer["mlp_width"] == mlp_width, i
        if layer["shared"]:
            # transformers' rule: the last non-shared layer of the same type.
            source = max(j for j in range(first_shared) if text.layer_types[j] == text.layer_types[i])
            assert layer["kv_source"] == source, i
            assert modes[source] == "store", i
        else:
            assert layer["kv_source"] == i, i

    for ours_key, layer_type in [("rope_sliding", "sliding_attention"), ("rope_full", "full_attention")]:
        ref = text.rope_parameters[layer_type]
        assert ours[ours_key]["rope_type"] == ref["rope_type"]
        assert ours[ours_key]["rope_theta"] == ref["rope_theta"]
        assert ours[ours_key]["partial_rotary_factor"] == ref.get("partial_rotary_factor", 1.0)

    audio = getattr(loaded, "audio_config", None)
    if audio is None:
        assert ours["audio_config"] is None
    else:
        for field, value in ours["audio_config"].items():
            assert value == getattr(audio, field), field
        for field in ["audio_token_id", "boa_token_id", "eoa_token_index"]:
            assert ours[field] == getattr(loaded, field), field

    expected_eos = []
    for v in eos_list(text.eos_token_id) + eos_list(getattr(loaded, "eos_token_id", None)):
        if v not in expected_eos:
            expected_eos.append(v)
    assert ours["eos_token_ids"] == expected_eos

    vision = getattr(loaded, "vision_config", None)
    assert ("vision" in ours) == (vision is not None)
    if vision is not None:
        for field in ["image_token_id", "boi_token_id", "eoi_token_id"]:
            assert ours[field] == getattr(loaded, field), field
        for field in ["hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim",
                      "hidden_activation", "rms_norm_eps", "pooling_kernel_size", "patch_size",
                      "position_embedding_size", "use_clipped_linears", "standardize"]:  # fmt: skip
            assert ours["vision"][field] == getattr(vision, field), field
        assert ours["vision"]["rope_theta"] == vision.rope_parameters["rope_theta"]


def test_e2b_per_layer_values(tmp_path):
    e2b_text().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "per_layer_config" in saved  # the transformers-5 layout is what we exercise here
    layers = dump(tmp_path)["layers"]
    assert [l["head_dim"] for l in layers] == [512 if i % 5 == 4 else 256 for i in range(35)]
    assert [l["kv_source"] for l in layers[15:]] == [14 if i % 5 == 4 else 13 for i in range(15, 35)]


def test_generation_config_eos_ids_are_added(tmp_path):
    Gemma4Config(text_config=e2b_text().to_dict(), eos_token_id=[1, 106]).save_pretrained(tmp_path)
    GenerationConfig(eos_token_id=[1, 106, 50], bos_token_id=2).save_pretrained(tmp_path)
    assert dump(tmp_path)["eos_token_ids"] == [1, 106, 50]


def assistant(**overrides):
    """A Gemma 4 assistant's config as transformers writes it: two layers that both read the
    target's K/V, no per-layer inputs, ordered embeddings over 16 clusters."""
    text = tiny_text(
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        num_kv_shared_layers=2, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        use_double_wide_mlp=False,
    )  # fmt: skip
    kwargs = dict(
        text_config=text.to_dict(), backbone_hidden_size=1536, use_ordered_embeddings=True,
        num_centroids=16, centroid_intermediate_top_k=4,
    )  # fmt: skip
    kwargs.update(overrides)
    return Gemma4AssistantConfig(**kwargs)


def test_assistant_matches_transformers(tmp_path):
    assistant().save_pretrained(tmp_path)
    ours = dump(tmp_path)
    loaded = Gemma4AssistantConfig.from_pretrained(tmp_path)
    for field in ["backbone_hidden_size", "use_ordered_embeddings", "num_centroids",
                  "centroid_intermediate_top_k"]:  # fmt: skip
        assert ours["assistant"][field] == getattr(loaded, field), field
    text = loaded.get_text_config()
    for field in ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "hidden_size_per_layer_input",
                  "sliding_window"]:  # fmt: skip
        assert ours[field] == getattr(text, field), field
    assert ours["num_kv_shared_layers"] == text.num_hidden_layers
    assert [l["shared"] for l in ours["layers"]] == [True, True]
    assert [l["head_dim"] for l in ours["layers"]] == [
        text.per_layer_config[i].head_dim for i in range(2)
    ]
    tiny_text().save_pretrained(tmp_path / "target")
    assert dump(tmp_path / "target")["assistant"] is None


def _set(section, key, value):
    def edit(config):
        (config[section] if section else config)[key] = value
        return config

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            _set("text_config", "hidden_size_per_layer_input", 8),
            "text_config.hidden_size_per_layer_input = 8 is not supported: an assistant has no "
            "per-layer inputs (0)",
        ),
        (
            _set("text_config", "num_kv_shared_layers", 1),
            "text_config.num_kv_shared_layers = 1 is not supported: every layer of an assistant "
            "reads the target's K/V (num_hidden_layers = 2)",
        ),
        (
            _set("text_config", "use_double_wide_mlp", True),
            "text_config.use_double_wide_mlp = true is not supported",
        ),
        (
            _set(None, "num_centroids", 10),
            "num_centroids = 10 must divide text_config.vocab_size = 512 and be at least "
            "centroid_intermediate_top_k = 4",
        ),
        (_set(None, "text_config", None), "text_config must be an object for model_type "
         "\"gemma4_assistant\""),  # fmt: skip
    ],
    ids=["per-layer-inputs", "unshared-layer", "double-wide", "centroids", "no-text-config"],
)
def test_assistant_errors_name_the_field(tmp_path, edit, message):
    assistant().save_pretrained(tmp_path)
    config = edit(json.loads((tmp_path / "config.json").read_text()))
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = subprocess.run([DUMP, str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert message in out.stderr
