"""Writes a tiny Gemma 4 checkpoint with a vision and an audio encoder (random weights) with
transformers' own Gemma4ForConditionalGeneration.save_pretrained: the demo checkpoint's text
model, tokenizer and chat template, plus small towers. Used by tests/js (makeMultimodalCheckpoint in
server_helpers.mjs) and tests/python/test_serve_python.py.

usage: make_multimodal.py DEMO_DIR OUT_DIR"""

import json
import shutil
import sys

import torch
from transformers import (
    Gemma4AudioConfig,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4VisionConfig,
)

demo, out = sys.argv[1], sys.argv[2]
with open(f"{demo}/config.json") as f:
    text = json.load(f)["text_config"]
config = Gemma4Config(
    text_config=text,
    vision_config=Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        pooling_kernel_size=2,
        patch_size=4,
        position_embedding_size=64,
    ).to_dict(),
    audio_config=Gemma4AudioConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        subsampling_conv_channels=[128, 8],
        output_proj_dims=48,
    ).to_dict(),
)
torch.manual_seed(0)
Gemma4ForConditionalGeneration(config).save_pretrained(out)
for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
    shutil.copy(f"{demo}/{name}", f"{out}/{name}")
