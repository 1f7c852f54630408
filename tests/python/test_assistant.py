"""Speculative decoding with a Gemma 4 assistant (multi-token prediction): the engine's drafts
are those of transformers' Gemma4AssistantForCausalLM fed the target's K/V, final hidden state
and embeddings as its Gemma4AssistantCandidateGenerator feeds them; decoding with the assistant
gives the tokens of decoding without it, alone and in a batch; an assistant that does not fit the
model is refused by name."""

import json
import shutil

import hf_tiny  # conftest puts tests/python on sys.path
import pytest
import torch
import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not
from transformers import Gemma4AssistantForCausalLM

S, F = hf_tiny.S, hf_tiny.F
TARGET = hf_tiny.HF_CONFIGS["causal-f32-shared"]  # 7 layers, window 8, the last 3 KV-shared
DRAFTS = 4


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    config = hf_tiny.text_config(**TARGET["config"])
    path = str(tmp_path_factory.mktemp("target"))
    hf_tiny.make(path, config, seed=TARGET["seed"])
    return path, config


@pytest.fixture(scope="module", params=[False, True], ids=["whole-vocabulary", "ordered"])
def assistant(request, target, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("assistant"))
    return hf_tiny.make_assistant(path, seed=5, layer_types=(S, S, F), ordered=request.param)


@pytest.fixture(scope="module")
def engine(target, assistant):
    return tt.Engine(
        target[0], context=96, dtype="float32", prefill_chunk=16, threads=1, draft_model=assistant
    )


@torch.no_grad()
def transformers_drafts(target_dir, assistant_dir, ids, count):
    """The target's greedy token after `ids`, then `count` drafts of transformers' assistant:
    the loop of Gemma4AssistantCandidateGenerator.get_candidates after the prompt, with the
    sliding layers' K/V cut to the window the target's own next position sees (its last
    sliding_window keys; the generator hands over what the target's cache returned)."""
    model = hf_tiny.load(target_dir)
    assistant = Gemma4AssistantForCausalLM.from_pretrained(
        assistant_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    out = model(
        input_ids=torch.tensor([ids]),
        use_cache=False,
        output_hidden_states=True,
        return_shared_kv_states=True,
    )
    window = model.config.sliding_window
    shared = {
        kind: (k[:, :, -window:], v[:, :, -window:]) if kind == S else (k, v)
        for kind, (k, v) in out.shared_kv_states.items()
    }
    token = out.logits[:, -1:].argmax(-1)
    hidden = out.hidden_states[-1][:, -1:]
    position = torch.tensor([[len(ids)]])
    tokens = [int(token)]
    for _ in range(count):
        x = torch.cat([model.get_input_embeddings()(token), hidden], -1)
        step = assistant(inputs_embeds=x, position_ids=position, shared_kv_states=shared)
        token = step.logits[:, -1:].argmax(-1)
        hidden = step.last_hidden_state
        tokens.append(int(token))
    return tokens


@pytest.mark.parametrize("length", [5, 21], ids=["inside-window", "past-window"])
def test_drafts_are_those_of_transformers_assistant(engine, target, assistant, length, report):
    ids = hf_tiny.prompt(512, length, 40 + length)
    ours = engine.draft(ids, DRAFTS)
    theirs = transformers_drafts(target[0], assistant, ids, DRAFTS)
    report(f"assistant drafts, prompt of {length}: engine {ours}, transformers {theirs}")
    assert ours == theirs


def _prompts():
    return [hf_tiny.prompt(512, n, seed) for seed, n in ((7, 6), (8, 19), (9, 30))]


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.9, "top_k": 40, "seed": 3}], ids=["greedy", "sampled"]
)
def test_decoding_with_the_assistant_gives_the_tokens_of_plain_decoding(engine, sampling, report):
    drafts = {"draft_max": 3, "draft_always": True}
    drafted = accepted = 0
    for ids in _prompts():
        plain = engine.decode(ids, 40, stop=(), **sampling)
        assisted = engine.decode(ids, 40, stop=(), **drafts, **sampling)
        assert assisted.tokens == plain.tokens
        assert plain.drafted == 0
        assert 0 < assisted.drafted and 0 <= assisted.accepted <= assisted.drafted
        drafted += assisted.drafted
        accepted += assisted.accepted
    many = engine.batch(rows=2).decode_many(_prompts(), 40, stop=(), **drafts, **sampling)
    for ids, result in zip(_prompts(), many):
        assert result.tokens == engine.decode(ids, 40, stop=(), **sampling).tokens
    assert sum(r.drafted for r in many) > 0
    report(f"assistant drafts kept alone ({sampling or 'greedy'}): {accepted} of {drafted}")


def _zero_final_norm(src, dst):
    """A copy of checkpoint `src` whose final norm is zeroed: its head sees zeros, so every
    logit is 0 and the greedy token is 0 whatever came before."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors["model.norm.weight"] = torch.zeros_like(tensors["model.norm.weight"])
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return str(dst)


def test_drafts_the_model_agrees_with_are_kept(target, tmp_path):
    """A model whose logits are all 0 decodes token 0 greedily forever, and an assistant whose
    head sees zeros guesses 0 every time: every draft is kept, and each sequence advances by
    whole drafts to exactly its budget, alone and in a batch with rows joining."""
    flat = _zero_final_norm(target[0], tmp_path / "flat")
    guess = _zero_final_norm(hf_tiny.make_assistant(str(tmp_path / "a"), seed=5), tmp_path / "g")
    engine = tt.Engine(flat, context=96, dtype="float32", threads=1, draft_model=guess)
    ids = hf_tiny.prompt(512, 9, 3)
    drafts = {"draft_max": 3, "draft_always": True}
    alone = engine.decode(ids, 30, stop=(), **drafts)
    assert (alone.tokens, alone.finish) == ([0] * 30, "length")
    assert alone.accepted == alone.drafted > 0
    many = engine.batch(rows=2).decode_many([ids, ids[:4], ids[:6]], 30, stop=(), **drafts)
    for result in many:
        assert (result.tokens, result.finish) == ([0] * 30, "length")
        assert result.accepted == result.drafted > 0


def test_an_assistant_that_does_not_fit_is_refused(target, assistant, tmp_path):
    path = target[0]
    with pytest.raises(ValueError, match="is not a Gemma 4 assistant"):
        tt.Engine(path, dtype="float32", threads=1, draft_model=path)
    # The other way round: the assistant as the model.
    with pytest.raises(ValueError, match=r"is a Gemma 4 assistant .*--draft-model"):
        tt.Engine(assistant, dtype="float32", threads=1)
    other = hf_tiny.make_assistant(str(tmp_path / "other"), seed=6, backbone=96)
    with pytest.raises(ValueError, match=r"backbone_hidden_size is 96, the model's 64"):
        tt.Engine(path, dtype="float32", threads=1, draft_model=other)
    broken = tmp_path / "broken"
    shutil.copytree(assistant, broken)
    with open(broken / "config.json") as f:
        meta = json.load(f)
    meta["text_config"]["num_kv_shared_layers"] = 1
    (broken / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"text_config\.num_kv_shared_layers = 1 is not supported"):
        tt.Engine(path, dtype="float32", threads=1, draft_model=str(broken))
    plain = tt.Engine(path, dtype="float32", threads=1)
    with pytest.raises(ValueError, match="drafts need a draft model"):
        plain.draft([2, 5, 6], 2)
    with pytest.raises(ValueError, match="count must be at least 1, got 0"):
        tt.Engine(path, dtype="float32", threads=1, draft_model=assistant).draft([2, 5], 0)
