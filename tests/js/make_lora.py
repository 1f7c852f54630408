"""Writes two LoRA adapters for the demo checkpoint with PEFT over transformers' Gemma 4, and the
tokens PEFT's model decodes greedily after a prompt with the first one, the reference the server
must reproduce. Used by tests/js (makeLoraAdapters in server_helpers.mjs).

usage: make_lora.py DEMO_DIR OUT_DIR
writes OUT_DIR/first, OUT_DIR/second (adapters) and OUT_DIR/expected.json:
{"prompt": ids, "tokens": PEFT's greedy ids with `first`, "base_tokens": transformers' without}"""

import json
import os
import sys

import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hf_tiny  # noqa: E402

demo, out = sys.argv[1], sys.argv[2]
# The text layers' linears only (the demo is a Gemma4ForConditionalGeneration).
TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
PROMPT = [2, 105, 2364, 107, 818, 5279, 529, 506, 9405, 236881, 106, 107, 105, 4368, 107]
NEW = 12

for seed, name in ((1, "first"), (2, "second")):
    torch.manual_seed(seed)
    model = get_peft_model(
        hf_tiny.load(demo),
        LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False),
    ).eval()
    model.save_pretrained(os.path.join(out, name))
    if name == "first":
        tokens = hf_tiny.greedy(model, PROMPT, NEW)
        with model.disable_adapter():
            base_tokens = hf_tiny.greedy(model, PROMPT, NEW)
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump({"prompt": PROMPT, "tokens": tokens, "base_tokens": base_tokens}, f)
