"""LoRA adapters in PEFT's format: the engine's logits and tokens with an adapter are those of
PEFT's model over transformers' Gemma 4 (and, for several adapters at other scales, of
transformers with the scaled products merged into its weights); rows of one batch with different
adapters give their tokens alone; the prefix cache shares states only under the same adapters and
scales; adapters load and unload while the engine runs, a sequence keeping the adapter it started
with; what an adapter holds that the engine cannot apply is refused by name."""

import json
import os
import shutil

import hf_tiny  # conftest puts tests/python on sys.path
import pytest
import torch
import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

CASE = hf_tiny.HF_CONFIGS["causal-f32-shared"]  # 7 layers, window 8, the last 3 KV-shared
MODULES = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "per_layer_input_gate",
    "per_layer_projection",
]
PROMPT = [2, 17, 301, 44, 9, 120, 7, 88, 260, 31, 5, 77, 150, 12, 400, 63]


def _adapter(base_dir, out_dir, seed, **config):
    """Saves a PEFT adapter with random (not zero) B so that it changes the logits; returns PEFT's
    model over transformers' base, in eval mode."""
    torch.manual_seed(seed)
    model = hf_tiny.load(base_dir)
    settings = dict(r=4, lora_alpha=8, target_modules=MODULES, init_lora_weights=False)
    settings.update(config)
    peft_model = get_peft_model(model, LoraConfig(**settings)).eval()
    peft_model.save_pretrained(out_dir)
    return peft_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("base"))
    return hf_tiny.make(path, hf_tiny.text_config(**CASE["config"]), seed=CASE["seed"])


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    """Two adapters: `first` of every linear at r 4, `second` of the attention alone, rsLoRA."""
    root = tmp_path_factory.mktemp("adapters")
    first = _adapter(base, str(root / "first"), seed=11)
    second = _adapter(
        base,
        str(root / "second"),
        seed=12,
        r=8,
        lora_alpha=4,
        use_rslora=True,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    return {"first": (str(root / "first"), first), "second": (str(root / "second"), second)}


@pytest.fixture(scope="module")
def engine(base, adapters):
    return tt.Engine(
        base,
        context=96,
        dtype="float32",
        prefill_chunk=8,
        threads=1,
        lora=[adapters["first"][0], "two=" + adapters["second"][0]],
    )


@torch.no_grad()
def _peft_logits(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


@torch.no_grad()
def _merged(base_dir, parts):
    """transformers' model with s · scaling · B·A added to each adapted weight, for every
    (adapter directory, scale) in `parts`: the arithmetic of several scaled adapters, computed
    apart from the engine."""
    model = hf_tiny.load(base_dir)
    weights = dict(model.named_parameters())
    for directory, scale in parts:
        with open(os.path.join(directory, "adapter_config.json")) as f:
            config = json.load(f)
        tensors = load_file(os.path.join(directory, "adapter_model.safetensors"))
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            r = a.shape[0]
            scaling = config["lora_alpha"] / (r**0.5 if config["use_rslora"] else r)
            target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            weights[target] += scale * scaling * (b @ a)
    return model


def test_logits_are_peft_models(engine, adapters):
    for name, (_, peft_model) in adapters.items():
        want = _peft_logits(peft_model, PROMPT)
        named = "first" if name == "first" else "two"
        got = torch.as_tensor(engine.logits(PROMPT, lora={named: 1}))
        with peft_model.disable_adapter():
            plain = _peft_logits(peft_model, PROMPT)
        # The adapter moves the logits by far more than the engine's distance from PEFT's.
        assert (want - plain).abs().max() > 1.0
        torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
        # Engine.score reads the prompt under the adapter too: PEFT's log-probabilities.
        scored = torch.tensor(
            [s.logprob for s in engine.score(PROMPT, lora={named: 1})], dtype=torch.float64
        )
        expected = torch.log_softmax(want.double(), -1)[torch.arange(len(PROMPT) - 1), PROMPT[1:]]
        torch.testing.assert_close(scored, expected, atol=4e-4, rtol=0)


def test_scaled_adapters_together_are_the_merged_weights(engine, base, adapters):
    want = hf_tiny.logits(
        _merged(base, [(adapters["first"][0], 0.5), (adapters["second"][0], -1.25)]), PROMPT
    )
    got = engine.logits(PROMPT, lora={"first": 0.5, "two": -1.25})
    got = torch.as_tensor(got).double()
    torch.testing.assert_close(got, torch.as_tensor(want), atol=2e-4, rtol=0)


def test_no_adapter_and_zero_scales_are_the_base_model(engine, base):
    want = torch.as_tensor(hf_tiny.logits(hf_tiny.load(base), PROMPT))
    for lora in ({}, {"first": 0, "two": 0}):
        got = torch.as_tensor(engine.logits(PROMPT, lora=lora)).double()
        torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


def test_by_default_every_adapter_applies_at_its_load_scale(engine, base, adapters):
    want = hf_tiny.logits(
        _merged(base, [(adapters["first"][0], 1.0), (adapters["second"][0], 1.0)]), PROMPT
    )
    got = torch.as_tensor(engine.logits(PROMPT)).double()
    torch.testing.assert_close(got, torch.as_tensor(want), atol=2e-4, rtol=0)


def test_greedy_decoding_gives_peft_models_tokens(engine, adapters):
    peft_model = adapters["first"][1]
    want = hf_tiny.greedy(peft_model, PROMPT, 12)
    got = engine.decode(PROMPT, 12, stop=(), lora={"first": 1}).tokens
    assert got == want
    # Through drafts (prompt lookup) as well: the checking passes carry the adapter too.
    assert engine.decode(PROMPT, 12, stop=(), lora={"first": 1}, draft_max=3).tokens == want


def _prompt(i):
    return [2] + [(37 * i + 11 * j) % 500 + 3 for j in range(10 + 3 * i)]


LORAS = [{}, {"first": 1}, {"two": 1}, {"first": 0.5, "two": 2}, {"first": 1}, {}]


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=7)],
    ids=["greedy", "seeded"],
)
def test_rows_with_different_adapters_give_their_tokens_alone(engine, sampling):
    want = [
        engine.decode(_prompt(i), 10, stop=(), lora=lora, **sampling).tokens
        for i, lora in enumerate(LORAS)
    ]
    assert len({tuple(w) for w in want}) == len(want)
    batch = engine.batch(rows=3, step_tokens=12)
    ids = [
        batch.submit(_prompt(i), 10, stop=(), lora=lora, **sampling) for i, lora in enumerate(LORAS)
    ]
    results = {}
    while len(results) < len(ids):
        for done in batch.step():
            results[done] = batch.result(done)
    assert [results[i].tokens for i in ids] == want


def test_prefix_cache_shares_states_only_under_the_same_adapters(engine):
    batch = engine.batch(rows=1, cache_mb=16, cache_block=4)
    prefix = _prompt(5)
    longer = prefix + [99, 98, 97, 96, 95]

    def run(prompt, lora):
        results = batch.decode_many([prompt], 6, stop=(), lora=lora)
        return results[0]

    first = run(prefix, {"first": 1})
    assert first.cached_tokens == 0
    for lora in ({}, {"first": 0.5}, {"two": 1}, {"first": 1, "two": 1}):
        other = run(longer, lora)
        assert other.cached_tokens == 0, lora
        assert other.tokens == engine.decode(longer, 6, stop=(), lora=lora).tokens
    hit = run(longer, {"first": 1})
    assert hit.cached_tokens >= len(prefix) - 4
    assert hit.tokens == engine.decode(longer, 6, stop=(), lora={"first": 1}).tokens


def test_report_lists_the_adapters(engine, adapters):
    report = engine.report()["lora"]
    assert [a["name"] for a in report] == ["first", "two"]
    assert report[0]["path"] == adapters["first"][0]
    assert report[0]["r"] == 4 and report[0]["lora_alpha"] == 8 and not report[0]["use_rslora"]
    assert report[1]["targets"] == [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
    ]
    assert report[1]["use_rslora"] and report[1]["scale"] == 1.0
    families = {s["family"] for s in engine.report()["storage"]}
    assert {"lora first", "lora two"} <= families


def _broken(src, dst, config=None, tensors=None):
    """A copy of adapter `src` with its config updated by `config` and its tensors by `tensors`
    (a function of the dict)."""
    shutil.copytree(src, dst)
    if config is not None:
        path = os.path.join(dst, "adapter_config.json")
        with open(path) as f:
            data = json.load(f)
        data.update(config)
        with open(path, "w") as f:
            json.dump(data, f)
    if tensors is not None:
        path = os.path.join(dst, "adapter_model.safetensors")
        save_file(tensors(load_file(path)), path)
    return str(dst)


def _drop(key):
    def edit(t):
        del t[key]
        return t

    return edit


def _add(key, shape):
    def edit(t):
        t[key] = torch.zeros(shape)
        return t

    return edit


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "config, tensors, words",
    [
        ({"peft_type": "IA3"}, None, ['peft_type must be "LORA"', "IA3"]),
        ({"use_dora": True}, None, ["use_dora = true is not supported", "DoRA"]),
        ({"modules_to_save": ["lm_head"]}, None, ["modules_to_save", "lm_head", "not supported"]),
        ({"alpha_pattern": {"q_proj": 3}}, None, ["alpha_pattern", "not supported"]),
        ({"bias": "all"}, None, ['bias = "all" is not supported']),
        ({"r": 0}, None, ["r must be positive, got 0"]),
        # PEFT refuses an r its tensors contradict (unless rank_pattern gives their rank).
        ({"r": 3}, None, ["q_proj's lora_A is [", "but its adapter_config.json gives r 3"]),
        (
            None,
            lambda t: {k: v.to(torch.int32) for k, v in t.items()},
            ["has dtype I32, not a floating-point one"],
        ),
        (
            None,
            lambda t: {k: v.index_fill(0, torch.tensor([0]), float("nan")) for k, v in t.items()},
            ["q_proj's lora_A holds a value that is not finite"],
        ),
        (
            None,
            _drop(Q0 + ".lora_B.weight"),
            ["layers.0.self_attn.q_proj's lora_A but not its lora_B"],
        ),
        (None, _add(Q0 + ".lora_A.weight", (4, 48)), ["q_proj's lora_A is [4, 48]", "[r, 64]"]),
        (
            None,
            _add("base_model.model.model.embed_tokens.lora_embedding_A", (4, 512)),
            ["adapts base_model.model.model.embed_tokens.lora_embedding_A", "does not"],
        ),
        (
            None,
            _add("base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight", (4, 64)),
            ["layers.9", "the model has 7 layers"],
        ),
    ],
)
def test_what_cannot_be_applied_is_refused_by_name(
    base, adapters, tmp_path, config, tensors, words
):
    bad = _broken(adapters["first"][0], tmp_path / "bad", config, tensors)
    with pytest.raises(ValueError) as error:
        tt.Engine(base, context=32, dtype="float32", threads=1, lora=[bad])
    for word in words:
        assert word in str(error.value)


def test_an_adapter_of_per_layer_inputs_is_refused_by_a_model_without_them(adapters, tmp_path):
    config = hf_tiny.text_config(**{**CASE["config"], "ple": 0})
    no_ple = hf_tiny.make(str(tmp_path / "base"), config, seed=CASE["seed"])
    with pytest.raises(ValueError) as error:
        tt.Engine(no_ple, context=32, dtype="float32", threads=1, lora=[adapters["first"][0]])
    assert (
        "adapts layers.0.per_layer_input_gate, which the model does not have: its config.json "
        "gives no per-layer inputs (hidden_size_per_layer_input 0)"
    ) in str(error.value)


def test_missing_files_and_names_are_refused(engine, base, adapters, tmp_path):
    with pytest.raises(ValueError, match="has no adapter_config.json"):
        tt.Engine(base, context=32, dtype="float32", threads=1, lora=[str(tmp_path)])
    pickled = _broken(adapters["first"][0], tmp_path / "pickled")
    os.rename(
        os.path.join(pickled, "adapter_model.safetensors"),
        os.path.join(pickled, "adapter_model.bin"),
    )
    with pytest.raises(ValueError, match="adapter_model.bin, a pickle, is not read"):
        tt.Engine(base, context=32, dtype="float32", threads=1, lora=[pickled])
    with pytest.raises(ValueError, match="two LoRA adapters are named 'first'"):
        tt.Engine(
            base,
            context=32,
            dtype="float32",
            threads=1,
            lora=[adapters["first"][0], "first=" + adapters["second"][0]],
        )
    with pytest.raises(ValueError, match=r"\[NAME=\]DIR, got '=x'"):
        tt.Engine(base, context=32, dtype="float32", threads=1, lora=["=x"])
    with pytest.raises(ValueError, match="no LoRA adapter is named 'third'; loaded: first, two"):
        engine.decode(PROMPT, 2, lora={"third": 1})
    with pytest.raises(ValueError, match="no LoRA adapter is named 'third'"):
        engine.logits(PROMPT, lora={"third": 1})
    with pytest.raises(ValueError, match="'first' is given a scale that is not finite"):
        engine.decode(PROMPT, 2, lora={"first": float("nan")})
    # The engine goes on serving after every refusal.
    assert engine.decode(PROMPT, 2, stop=(), lora={"first": 1}).tokens == engine.decode(
        PROMPT, 2, stop=(), lora={"first": 1}
    ).tokens


def _run(batch, ids):
    results = {}
    while len(results) < len(ids):
        for done in batch.step():
            results[done] = batch.result(done)
    return [results[i] for i in ids]


def test_adapters_load_and_unload_while_the_engine_runs(base, adapters):
    eng = tt.Engine(base, context=96, dtype="float32", prefill_chunk=8, threads=1, max_lora=2)
    plain = torch.as_tensor(eng.logits(PROMPT))
    eng.load_lora(adapters["first"][0], scale=0)
    assert [(a["name"], a["scale"]) for a in eng.report()["lora"]] == [("first", 0)]
    assert "lora first" in {s["family"] for s in eng.report()["storage"]}
    torch.testing.assert_close(torch.as_tensor(eng.logits(PROMPT)), plain, atol=0, rtol=0)
    # Loaded at run time, it is PEFT's model as one loaded at construction is.
    want = _peft_logits(adapters["first"][1], PROMPT)
    got = torch.as_tensor(eng.logits(PROMPT, lora={"first": 1}))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
    eng.set_lora_scales({"first": 1})
    torch.testing.assert_close(torch.as_tensor(eng.logits(PROMPT)), want, atol=2e-4, rtol=0)

    with pytest.raises(ValueError, match="has no adapter_config.json"):
        eng.load_lora(base, name="two")
    eng.load_lora(adapters["second"][0], name="two")
    with pytest.raises(ValueError, match="two LoRA adapters are named 'two'"):
        eng.load_lora(adapters["first"][0], name="two")
    with pytest.raises(ValueError, match=r"3 LoRA adapters would be loaded, more than max_lora"):
        eng.load_lora(adapters["first"][0], name="three")
    with pytest.raises(ValueError, match="no LoRA adapter is named 'three'; loaded: first, two"):
        eng.unload_lora("three")
    with pytest.raises(ValueError, match="no LoRA adapter is named 'three'"):
        eng.set_lora_scales({"three": 1})
    assert [a["name"] for a in eng.report()["lora"]] == ["first", "two"]

    # A sequence that applies an adapter keeps it when it is unloaded mid-decode; later ones
    # cannot name it.
    alone = eng.decode(_prompt(1), 10, stop=(), lora={"first": 1}).tokens
    assert alone != eng.decode(_prompt(1), 10, stop=(), lora={}).tokens
    batch = eng.batch(rows=2, step_tokens=12)
    ids = [batch.submit(_prompt(1), 10, stop=(), lora={"first": 1})]
    for _ in range(3):
        batch.step()
    eng.unload_lora("first")
    assert [a["name"] for a in eng.report()["lora"]] == ["two"]
    with pytest.raises(ValueError, match="no LoRA adapter is named 'first'; loaded: two"):
        batch.submit(_prompt(2), 4, lora={"first": 1})
    ids.append(batch.submit(_prompt(2), 4, stop=()))
    results = _run(batch, ids)
    assert results[0].tokens == alone
    assert results[1].tokens == eng.decode(_prompt(2), 4, stop=(), lora={"two": 1}).tokens


def test_a_name_loaded_again_from_other_files_shares_no_cached_state(base, adapters):
    eng = tt.Engine(base, context=96, dtype="float32", prefill_chunk=8, threads=1)
    batch = eng.batch(rows=1, cache_mb=16, cache_block=4)
    prefix = _prompt(5)
    longer = prefix + [99, 98, 97, 96, 95]
    eng.load_lora(adapters["first"][0], name="x")
    assert batch.decode_many([prefix], 6, stop=(), lora={"x": 1})[0].cached_tokens == 0
    eng.unload_lora("x")
    eng.load_lora(adapters["second"][0], name="x")
    again = batch.decode_many([longer], 6, stop=(), lora={"x": 1})[0]
    assert again.cached_tokens == 0
    assert again.tokens == eng.decode(longer, 6, stop=(), lora={"x": 1}).tokens
    assert batch.decode_many([longer], 6, stop=(), lora={"x": 1})[0].cached_tokens > 0


def test_an_adapter_loaded_while_asleep_applies_after_the_wake(base, adapters):
    eng = tt.Engine(base, context=96, dtype="float32", prefill_chunk=8, threads=1)
    eng.load_lora(adapters["second"][0], name="two")
    eng.sleep()
    eng.load_lora(adapters["first"][0])
    assert [a["name"] for a in eng.report()["lora"]] == ["two", "first"]
    eng.wake()
    for name, (_, peft_model) in (("first", adapters["first"]), ("two", adapters["second"])):
        got = torch.as_tensor(eng.logits(PROMPT, lora={name: 1}))
        torch.testing.assert_close(got, _peft_logits(peft_model, PROMPT), atol=2e-4, rtol=0)


def test_hub_ids_load_the_model_and_adapters_from_the_hub(base, adapters, tmp_path, monkeypatch):
    """A Hub id in place of a directory (the model, lora=[...], load_lora) is downloaded into the
    Hub cache as `serve --model org/name` does, and gives what the directories give; download()
    returns the snapshot; offline, the cache alone serves; unreachable, a ConnectionError."""
    from pathlib import Path

    from hub_fixture import HubFixture, Repo

    def files(directory):
        return {p.name: p.read_bytes() for p in Path(directory).iterdir() if p.is_file()}

    for key in list(os.environ):
        if key.startswith(("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_")):
            monkeypatch.delenv(key)
    cache = tmp_path / "hub-cache"
    hub = HubFixture()
    try:
        hub.add(Repo("fixture-org/base", {"main": files(base)}))
        hub.add(Repo("fixture-org/first", {"main": files(adapters["first"][0])}))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        settings = dict(context=96, dtype="float32", prefill_chunk=8, threads=1)
        eng = tt.Engine("fixture-org/base", lora=["one=fixture-org/first"], **settings)
        want = _peft_logits(adapters["first"][1], PROMPT)
        torch.testing.assert_close(
            torch.as_tensor(eng.logits(PROMPT, lora={"one": 1})), want, atol=2e-4, rtol=0
        )
        local = tt.Engine(base, **settings)
        torch.testing.assert_close(
            torch.as_tensor(eng.logits(PROMPT, lora={})),
            torch.as_tensor(local.logits(PROMPT)),
            atol=0,
            rtol=0,
        )
        eng.load_lora("fixture-org/first", name="again")
        torch.testing.assert_close(
            torch.as_tensor(eng.logits(PROMPT, lora={"again": 1})), want, atol=2e-4, rtol=0
        )
        sha = hub.repos["fixture-org/base"].refs["main"].sha
        assert tt.download("fixture-org/base") == str(
            cache / "models--fixture-org--base" / "snapshots" / sha
        )
        with pytest.raises(FileNotFoundError, match="fixture-org/nope"):
            tt.Engine("fixture-org/nope", **settings)
        with pytest.raises(ValueError, match="'./nope' is not a Hub model id"):
            tt.download("./nope")
        requests = len(hub.log())
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        tt.Engine("fixture-org/base", lora=["one=fixture-org/first"], **settings)
        assert len(hub.log()) == requests
        # A Hub that cannot be reached, with nothing cached: ConnectionError, naming it.
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
        with pytest.raises(ConnectionError, match="cannot reach the Hub at http://127.0.0.1:9"):
            tt.download("fixture-org/elsewhere")
        with pytest.raises(ConnectionError, match="cannot reach the Hub at http://127.0.0.1:9"):
            eng.load_lora("fixture-org/elsewhere", name="unreachable")
    finally:
        hub.close()
