"""Sampling in the engine (issue #11) through torchtpu_cpp.Engine.decode on a tiny checkpoint.

The reference is computed here with numpy from the engine's own logits (Engine.logits): softmax
of logits / temperature, then top_k, top_p and min_p as transformers' warpers apply them. The
first sampled token over 2000 seeds is compared with it by Pearson's chi-square test at a fixed
significance of 0.001 (bins with an expected count under 5 pooled); the seeds are fixed, so the
verdict is reproducible, and a draw outside the kept set fails at once.
"""


import numpy as np
import pytest
import torch



import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not

DRAWS = 2000
SIGNIFICANCE = 1e-3
PROMPT = [2, 17, 301, 44, 9, 250]


@pytest.fixture(scope="module")
def engine(cli, tmp_path_factory):
    # The `tiny` preset: vocab 512, random weights at f32 so decode and logits agree closely.
    tiny = cli.make_tiny(tmp_path_factory.mktemp("tiny"), seed=11, dtype="f32")
    return tt.Engine(tiny, context=64, dtype="float32")


@pytest.fixture(scope="module")
def logits(engine):
    return engine.logits(PROMPT)[-1].double().numpy()


def reference(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution a sampler with these settings draws from (transformers' order)."""
    x = logits / temperature
    if top_k > 0:
        kth = np.sort(x)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        p = np.exp(x[order] - x[order][0])
        p /= p.sum()
        before = np.cumsum(p) - p  # mass of the more likely tokens
        drop = np.zeros_like(x, dtype=bool)
        drop[order] = before >= top_p
        x = np.where(drop, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if min_p > 0.0:
        p = np.where(p < min_p * p.max(), 0.0, p)
        p /= p.sum()
    return p


def chi_square_p_value(counts, expected):
    """Pearson's test; bins expecting fewer than 5 draws are pooled into one."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(exp) - 1
    # Upper tail of chi-square(dof) = Q(dof/2, stat/2), the regularised upper incomplete gamma.
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def first_tokens(engine, **sampling):
    return np.array(
        [
            engine.decode(PROMPT, 1, stop=[], seed=seed, **sampling).tokens[0]
            for seed in range(DRAWS)
        ]
    )


@pytest.mark.parametrize(
    "sampling",
    [
        # The tiny checkpoint's logits are peaked (top logit ~12), hence the high temperatures.
        dict(temperature=1.0, top_k=30),
        dict(temperature=2.0, top_p=0.6),
        dict(temperature=3.0, min_p=0.15),
        dict(temperature=2.5, top_k=40, top_p=0.9, min_p=0.02),
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_first_token_follows_the_filtered_softmax_of_the_engine_logits(engine, logits, sampling):
    expected_p = reference(logits, **sampling)
    kept = np.flatnonzero(expected_p > 0)
    # Enough candidates for the test to mean something, few enough for 2000 draws to fill them.
    assert 10 <= len(kept) <= 60, f"{len(kept)} candidates kept; choose other settings"
    tokens = first_tokens(engine, **sampling)
    outside = sorted(set(tokens.tolist()) - set(kept.tolist()))
    assert not outside, f"drew tokens the filters remove: {outside}"
    counts = np.bincount(tokens, minlength=len(logits))[kept].astype(float)
    p_value = chi_square_p_value(counts, DRAWS * expected_p[kept])
    assert p_value > SIGNIFICANCE, (p_value, sampling)


def test_a_wrong_distribution_fails_the_same_test(engine, logits):
    """The test has power: draws at temperature 1 are rejected against the temperature-2 law."""
    tokens = first_tokens(engine, temperature=1.0, top_k=30)
    expected_p = reference(logits, temperature=1.5, top_k=30)
    kept = np.flatnonzero(expected_p > 0)
    counts = np.bincount(tokens, minlength=len(logits))[kept].astype(float)
    assert chi_square_p_value(counts, DRAWS * expected_p[kept]) < SIGNIFICANCE


def test_a_seed_reproduces_the_tokens_and_other_seeds_differ(engine):
    settings = dict(temperature=1.0, top_k=64, top_p=0.95)
    runs = [engine.decode(PROMPT, 24, stop=[], seed=5, **settings).tokens for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0]) == 24
    others = {tuple(engine.decode(PROMPT, 24, stop=[], seed=s, **settings).tokens) for s in (6, 7)}
    assert tuple(runs[0]) not in others


def test_temperature_zero_is_the_argmax_whatever_the_other_knobs(engine, logits):
    tokens = engine.decode(PROMPT, 1, stop=[], temperature=0.0, top_k=3, top_p=0.1, seed=1).tokens
    assert tokens == [int(np.argmax(logits))]


def test_logit_bias_forces_a_token(engine, logits):
    target = int(np.argmin(logits))
    tokens = engine.decode(PROMPT, 1, stop=[], temperature=1.0, logit_bias={target: 100.0}, seed=3)
    assert tokens.tokens == [target]


@pytest.mark.parametrize(
    "bad",
    [dict(top_p=0.0), dict(temperature=-1.0), dict(min_p=2.0), dict(logit_bias={100000: 1.0})],
)
def test_out_of_range_values_raise_value_error_naming_them(engine, bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        engine.decode(PROMPT, 1, **{"temperature": 1.0, **bad})
