"""Writes a random Gemma 4 assistant (transformers' Gemma4AssistantForCausalLM, through
tests/python/hf_tiny.make_assistant) that fits the demo checkpoint: its width, vocabulary, KV
heads, head sizes and window. Used by tests/js (makeAssistantCheckpoint in server_helpers.mjs).

usage: make_assistant.py DEMO_DIR OUT_DIR"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hf_tiny  # noqa: E402

demo, out = sys.argv[1], sys.argv[2]
with open(f"{demo}/config.json") as f:
    text = json.load(f)["text_config"]
hf_tiny.make_assistant(
    out,
    seed=0,
    backbone=text["hidden_size"],
    vocab=text["vocab_size"],
    kv_heads=text["num_key_value_heads"],
    head_dim=text["head_dim"],
    global_head_dim=text["global_head_dim"],
    window=text["sliding_window"],
    ordered=True,
)
