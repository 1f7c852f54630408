"""Writes a synthetic Gemma 4 assistant of E2B's shapes (transformers' Gemma4AssistantForCausalLM
as the E2B drafter is described: 4 layers of width 256, three sliding and one full, 4 query
heads on the target's one KV head, MLP 2048, ordered embeddings over 2,048 clusters of which 32
are scored, for a target of width 1536 and 262,144 tokens), in bf16, with transformers' own
random initialisation and its final norm zeroed: its head then sees zeros and it guesses the same
token after anything, which bench/speculative.py --draft-model forces the target to choose.

    python bench/make_assistant.py OUT
"""

import sys

import torch
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig


def main():
    out = sys.argv[1]
    text = Gemma4TextConfig(
        vocab_size=262144,
        vocab_size_per_layer_input=0,
        hidden_size=256,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        global_head_dim=512,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=512,
        num_kv_shared_layers=4,
        hidden_size_per_layer_input=0,
        use_double_wide_mlp=False,
    )
    config = Gemma4AssistantConfig(
        text_config=text.to_dict(),
        backbone_hidden_size=1536,
        use_ordered_embeddings=True,
        num_centroids=2048,
        centroid_intermediate_top_k=32,
    )
    torch.manual_seed(0)
    model = Gemma4AssistantForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.masked_embedding.token_ordering.copy_(torch.randperm(262144))
    model.to(torch.bfloat16).save_pretrained(out)
    print(out)


if __name__ == "__main__":
    main()
