"""Engine.batch from Python (issue #17): Batch.decode_many and submit/step give each sequence the
tokens Engine.decode gives it alone; bad input is ValueError; the GIL is released during a step;
the owner-thread rule covers the batch; a callback's exception ends its sequence and is raised."""

import random

import hf_tiny  # conftest puts tests/python on sys.path
import pytest
import torchtpu_cpp as tt  # conftest finds the build tree when PYTHONPATH does not
from threads import in_thread, ticks_while

CONTEXT = 128


@pytest.fixture(scope="module")
def tiny(cli, tmp_path_factory):
    """The `tiny` preset at f32: 7 layers, sliding window 8, the last 3 KV-shared."""
    return cli.make_tiny(tmp_path_factory.mktemp("tiny"), seed=7, dtype="f32")


@pytest.fixture(scope="module")
def engine(tiny):
    return tt.Engine(
        tiny, context=CONTEXT, dtype="float32", prefill_chunk=16, threads=1
    )


def _prompt(n, seed=1):
    return hf_tiny.prompt(512, n, seed)


def test_decode_many_gives_each_prompt_its_tokens_alone(engine):
    prompts = [_prompt(n, seed) for seed, n in enumerate([1, 9, 30, 4, 45, 17])]
    batch = engine.batch(rows=4)
    for kwargs in ({}, {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 11}):
        results = batch.decode_many(prompts, 24, stop=(), **kwargs)
        assert [r.finish for r in results] == ["length"] * len(prompts)
        for prompt, result in zip(prompts, results):
            alone = engine.decode(prompt, 24, stop=(), **kwargs)
            assert result.tokens == alone.tokens
            assert result.prompt_tokens == len(prompt)
    assert batch.idle


def test_eight_bit_activations_give_each_row_its_tokens_alone(cli, tmp_path):
    """The 8-bit mode of the int4 kernel (bf16, packed int4) keeps every row's numerics its own:
    with prompt chunks of 4 every forward pass has at most 4 + rows = 8 rows, so the kernel streams
    all of them (up to 16), alone as in the batch, and a row's bits cannot depend on the others."""
    dense = cli.make_tiny(tmp_path / "dense", seed=7, dtype="bf16", ple=32)
    cli("quantize", dense, tmp_path / "q", "--group", 32)
    engine = tt.Engine(
        str(tmp_path / "q"),
        context=CONTEXT,
        dtype="bfloat16",
        prefill_chunk=4,
        threads=1,
        int4_activation_bits=8,
    )
    prompts = [_prompt(n, seed) for seed, n in enumerate([1, 9, 30, 4, 17])]
    batch = engine.batch(rows=4)
    for kwargs in ({}, {"temperature": 0.8, "top_k": 40, "seed": 5}):
        results = batch.decode_many(prompts, 16, stop=(), **kwargs)
        for prompt, result in zip(prompts, results):
            assert result.tokens == engine.decode(prompt, 16, stop=(), **kwargs).tokens


def test_submit_and_step_with_joins_and_cancels_at_random_steps(engine):
    rng = random.Random(3)
    batch = engine.batch(rows=3, step_tokens=12)
    jobs, results, cancelled = {}, {}, set()
    while len(jobs) < 10 or not batch.idle:
        if len(jobs) < 10 and rng.random() < 0.4:
            prompt = _prompt(rng.randint(1, 40), seed=len(jobs))
            kwargs = {
                "stop": (),
                "seed": len(jobs),
                "temperature": rng.choice([0.0, 0.7]),
            }
            max_new = rng.randint(1, 30)
            jobs[batch.submit(prompt, max_new, **kwargs)] = (prompt, max_new, kwargs)
        live = [i for i in jobs if i not in results and i not in cancelled]
        if live and rng.random() < 0.08:
            victim = rng.choice(live)
            batch.cancel(victim)
            cancelled.add(victim)
        for done in batch.step():
            results[done] = batch.result(done)
    assert cancelled
    for seq, (prompt, max_new, kwargs) in jobs.items():
        alone = engine.decode(prompt, max_new, **kwargs).tokens
        got = results[seq]
        if got.finish == "cancelled":
            assert got.tokens == alone[: len(got.tokens)]
        else:
            assert got.tokens == alone, seq


def test_on_tokens_streams_each_sequence_and_a_falsy_return_cancels_it(engine):
    prompts = [_prompt(5, 1), _prompt(7, 2)]
    seen = {0: [], 1: []}

    def on_tokens(index, tokens):
        seen[index].extend(tokens)
        return index == 0 or len(seen[1]) < 3

    results = engine.batch(rows=2).decode_many(
        prompts, 10, stop=(), on_tokens=on_tokens
    )
    assert seen[0] == results[0].tokens and len(seen[0]) == 10
    assert results[1].finish == "cancelled" and seen[1] == results[1].tokens
    assert len(results[1].tokens) == 3


@pytest.mark.parametrize(
    "call,words",
    [
        (lambda e: e.batch(rows=0), ["at least 1 row", "0"]),
        (lambda e: e.batch(rows=4, step_tokens=3), ["step_tokens (3)", "rows (4)"]),
        (lambda e: e.batch(pass_rows=-1), ["pass_rows must be at least 0, got -1"]),
        (lambda e: e.batch().submit([], 4), ["empty"]),
        (lambda e: e.batch().submit([2, 512], 4), ["512", "vocabulary"]),
        (lambda e: e.batch().submit([2, 5], 0), ["max_new", "0"]),
        (lambda e: e.batch().submit([2, 5], 4, temperature=-1), ["temperature"]),
        (lambda e: e.batch().cancel(3), ["sequence 3", "not queued or running"]),
        (lambda e: e.batch().result(0), ["sequence 0", "no result"]),
        # Past int64 pybind answered a TypeError listing the signature; True was taken as id 1.
        (
            lambda e: e.batch().cancel(2**70),
            ["Batch.cancel: id must be an int that Batch.submit returned, got " + str(2**70)],
        ),
        (lambda e: e.batch().result(True), ["Batch.result: id must be an int", "got True"]),
        (lambda e: e.batch().decode_many("abc", 4), ["prompts", "str"]),
        (
            lambda e: e.batch().decode_many([[2, 5], [2, "x"]], 4),
            ["prompts[1][1]", "'x'"],
        ),
    ],
)
def test_bad_input_is_value_error(engine, call, words):
    with pytest.raises(ValueError) as info:
        call(engine)
    for word in words:
        assert word in str(info.value)


def test_a_callback_exception_ends_its_sequence_and_is_raised_from_step(engine):
    batch = engine.batch(rows=2)

    def boom(tokens):
        raise KeyError("from the callback")

    failing = batch.submit(_prompt(4), 8, stop=(), on_tokens=boom)
    other = batch.submit(_prompt(6), 8, stop=())
    with pytest.raises(KeyError, match="from the callback"):
        while not batch.idle:
            batch.step()
    while not batch.idle:
        batch.step()
    assert batch.result(failing).finish == "cancelled"
    assert batch.result(other).tokens == engine.decode(_prompt(6), 8, stop=()).tokens


def test_a_decode_many_left_by_an_exception_leaves_the_batch_as_it_was(engine):
    """A refused prompt queues nothing; a callback's exception ends the call's other sequences
    too; a sequence someone submitted beside the call goes on; the next call gets its own."""
    batch = engine.batch(rows=2)
    beside = batch.submit(_prompt(6), 8, stop=())
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        batch.decode_many([_prompt(4), [2, "x"]], 4, stop=())
    assert batch.stats()["queued"] == 1

    def boom(index, tokens):
        if index == 1:
            raise KeyError("from the callback")
        return True

    with pytest.raises(KeyError, match="from the callback"):
        batch.decode_many([_prompt(5, 2), _prompt(3, 3)], 30, stop=(), on_tokens=boom)
    finished = []
    while not batch.idle:
        finished += batch.step()
    assert finished in ([beside], [])
    assert batch.result(beside).tokens == engine.decode(_prompt(6), 8, stop=()).tokens
    again = batch.decode_many([_prompt(9, 4)], 5, stop=())
    assert again[0].tokens == engine.decode(_prompt(9, 4), 5, stop=()).tokens


def test_the_batch_belongs_to_the_engines_owner_thread(engine):
    batch = engine.batch(rows=2)
    batch.submit(_prompt(4), 3)
    for call in (batch.step, lambda: batch.submit([2, 5], 3), batch.stats):
        box = in_thread(call)
        assert type(box.get("error")) is RuntimeError, box
        assert "intruder" in str(box["error"]) and "Batch." in str(box["error"])

    def reenter(tokens):
        engine.decode([2, 5], 2)

    batch.submit(_prompt(4), 3, on_tokens=reenter)
    with pytest.raises(RuntimeError, match="decoding"):
        while not batch.idle:
            batch.step()


NO_CACHE = dict.fromkeys(
    ("hits", "misses", "reused_tokens", "saves", "evictions", "states", "bytes"), 0
)


def test_stats_count_queued_reading_and_decoding_rows(engine):
    batch = engine.batch(rows=2, step_tokens=6, pass_rows=1)
    for n in (3, 40, 5):
        batch.submit(_prompt(n), 4, stop=())
    assert batch.stats() == {
        "rows": 2,
        "queued": 3,
        "reading": 0,
        "decoding": 0,
        "steps": 0,
        "prompt_passes": 0,
        "prompt_tokens": 0,
        "step_tokens": 6,
        "pass_rows": 1,
        "positions": 0,
        "capacity": 2 * CONTEXT,
        "cache": NO_CACHE,
    }
    batch.step()
    # Each prompt read in a pass of its own (pass_rows 1): row 0 read its 3 tokens and fed
    # its first generated one (4 positions); row 1 read 13 of its 40 (the rest of the step's
    # prefill_chunk of 16), which count whole (the row holds them once read); the third waits.
    assert batch.stats() == {
        "rows": 2,
        "queued": 1,
        "reading": 1,
        "decoding": 1,
        "steps": 1,
        "prompt_passes": 2,
        "prompt_tokens": 3 + 13,
        "step_tokens": 6,
        "pass_rows": 1,
        "positions": 4 + 40,
        "capacity": 2 * CONTEXT,
        "cache": NO_CACHE,
    }


def test_stats_give_the_defaults_in_effect(engine):
    # The step's budget: min(prefill_chunk 16, 128) + rows; on the CPU a pass per prompt.
    assert {k: engine.batch(rows=3).stats()[k] for k in ("step_tokens", "pass_rows")} == {
        "step_tokens": 16 + 3,
        "pass_rows": 1,
    }


def test_prompts_read_together_keep_their_tokens(engine):
    prompts = [_prompt(n, seed) for seed, n in enumerate((13, 14, 12))]
    batch = engine.batch(rows=3, step_tokens=60, pass_rows=64)
    results = batch.decode_many(prompts, 6, stop=())
    # One pass of 3 x 8 (the window), then one of the last 5, 6 and 4 padded to 6.
    assert batch.stats()["prompt_passes"] == 2
    assert [r.tokens for r in results] == [engine.decode(p, 6, stop=()).tokens for p in prompts]


def test_gil_released_during_steps(tiny):
    engine = tt.Engine(tiny, context=512, dtype="float32", threads=1)
    batch = engine.batch(rows=4)
    _, during, _, _ = ticks_while(
        lambda: batch.decode_many([_prompt(8, s) for s in range(4)], 200, stop=())
    )
    assert len(during) > 1000


def test_a_second_turn_reuses_the_first_from_the_prefix_cache(engine):
    batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
    first_prompt = _prompt(37, 4)
    first = batch.decode_many([first_prompt], 10, stop=())[0]
    assert first.cached_tokens == 0
    second_prompt = first_prompt + first.tokens + _prompt(6, 5)[1:]
    second = batch.decode_many([second_prompt], 12, stop=())[0]
    # The reply's last token was sampled but not fed: the rings held the prompt and 9 tokens.
    assert second.cached_tokens == 37 + 9
    assert second.tokens == engine.decode(second_prompt, 12, stop=()).tokens
    cache = batch.stats()["cache"]
    assert cache["hits"] == 1 and cache["reused_tokens"] == 46
    assert cache["states"] >= 2 and cache["bytes"] > 0
    with pytest.raises(ValueError, match="cache_mb"):
        engine.batch(cache_mb=-1)
    for cache_mb in (1, 0):  # whether or not the cache is on
        with pytest.raises(ValueError, match="block must be at least 1 position, got 0"):
            engine.batch(cache_mb=cache_mb, cache_block=0)


def test_a_slots_state_in_a_file_gives_another_engine_the_next_turn(engine, tiny, cli, tmp_path):
    """llama-server's slot save and restore: a second engine on the same weights (a restarted
    host) starts the next turn from the file, with the tokens of reading it all."""
    batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
    first_prompt = _prompt(37, 8)
    first = batch.decode_many([first_prompt], 10, stop=())[0]  # in row 0, the first free
    path = tmp_path / "turn.safetensors"
    assert batch.save_slot(0, str(path)) == {"tokens": 46, "bytes": path.stat().st_size}
    with pytest.raises(ValueError, match="slot 1 has no state to save"):
        batch.save_slot(1, str(tmp_path / "none"))

    other = tt.Engine(tiny, context=CONTEXT, dtype="float32", prefill_chunk=16, threads=1)
    restored = other.batch(rows=2, cache_mb=16, cache_block=16)
    assert restored.restore_slot(1, str(path)) == {"tokens": 46, "bytes": path.stat().st_size}
    second_prompt = first_prompt + first.tokens + _prompt(6, 9)[1:]
    second = restored.decode_many([second_prompt], 8, stop=())[0]
    assert second.cached_tokens == 46
    assert second.tokens == engine.decode(second_prompt, 8, stop=()).tokens
    assert restored.erase_slot(1) == 46
    assert restored.erase_slot(1) == 0
    with pytest.raises(FileNotFoundError):
        restored.restore_slot(0, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="slot 2 does not exist: the slots are 0 to 1"):
        restored.restore_slot(2, str(path))
    bf16 = tt.Engine(tiny, context=CONTEXT, dtype="bfloat16", prefill_chunk=16, threads=1)
    with pytest.raises(ValueError, match="where this engine's rings hold BF16"):
        bf16.batch(cache_mb=16).restore_slot(0, str(path))
    with pytest.raises(ValueError, match="prefix cache is off"):
        engine.batch(rows=1).save_slot(0, str(path))
    # A sliding ring holds min(window, context) slots: a state saved under a context past a
    # window of 32 does not fit an engine whose context is below it, and the refusal says why.
    wide = cli.make_tiny(tmp_path / "wide", seed=7, dtype="f32", window=32)
    saving = tt.Engine(wide, context=64, dtype="float32", threads=1).batch(rows=1, cache_mb=16)
    saving.decode_many([_prompt(6, 3)], 4, stop=())
    saving.save_slot(0, str(tmp_path / "wide.safetensors"))
    short = tt.Engine(wide, context=24, dtype="float32", threads=1).batch(rows=1, cache_mb=16)
    with pytest.raises(ValueError, match="the state was saved with another context"):
        short.restore_slot(0, str(tmp_path / "wide.safetensors"))


def _run(batch, prompt, max_new, via, **kwargs):
    """One prompt through `batch` alone, by decode_many or by submit and step."""
    if via == "decode_many":
        return batch.decode_many([prompt], max_new, stop=(), **kwargs)[0]
    seq = batch.submit(prompt, max_new, stop=(), **kwargs)
    while not batch.idle:
        batch.step()
    return batch.result(seq)


@pytest.mark.parametrize("via", ["submit", "decode_many"])
def test_the_prefix_cache_shares_states_only_between_sequences_of_one_salt(engine, via):
    batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
    first_prompt = _prompt(37, 10)
    first = _run(batch, first_prompt, 10, via, cache_salt="alice")
    assert first.cached_tokens == 0
    second_prompt = first_prompt + first.tokens + _prompt(6, 11)[1:]
    alone = engine.decode(second_prompt, 12, stop=()).tokens
    for salt in ("bob", None):
        other = _run(batch, second_prompt, 12, via, cache_salt=salt)
        assert (salt, other.cached_tokens) == (salt, 0)
        assert other.tokens == alone
    same = _run(batch, second_prompt, 12, via, cache_salt="alice")
    # The first prompt and 9 of its reply's 10 tokens (the last was sampled, not fed).
    assert same.cached_tokens == 37 + 9
    assert same.tokens == alone


@pytest.mark.parametrize("via", ["submit", "decode_many"])
def test_a_prompt_that_parts_at_a_reuse_point_reuses_everything_before_it(engine, via):
    """Two conversations after the same 27-token system prompt: with a reuse point at 27 the
    second starts from the state saved there, without one from the last block end (16)."""
    shared = _prompt(27, 12)
    first_prompt = shared + _prompt(14, 13)[1:]
    second_prompt = shared + _prompt(12, 14)[1:]
    assert first_prompt[27] != second_prompt[27]
    alone = engine.decode(second_prompt, 8, stop=()).tokens
    for points, reused in (((27,), 27), ((), 16)):
        batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
        assert _run(batch, first_prompt, 8, via, reuse_points=points).cached_tokens == 0
        second = _run(batch, second_prompt, 8, via)
        assert (points, second.cached_tokens) == (points, reused)
        assert second.tokens == alone


def test_decode_many_saves_at_a_reuse_point_that_fits_every_prompt(engine):
    shared = _prompt(20, 15)
    prompts = [shared + _prompt(n, seed)[1:] for seed, n in ((16, 9), (17, 4))]
    batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
    results = batch.decode_many(prompts, 6, stop=(), reuse_points=[20, 22])
    for prompt, result in zip(prompts, results):
        assert result.tokens == engine.decode(prompt, 6, stop=()).tokens
    later = shared + _prompt(8, 18)[1:]
    assert _run(batch, later, 6, "submit").cached_tokens == 20


@pytest.mark.parametrize(
    "call,kind,words",
    [
        (
            lambda b: b.submit([2, 5, 6], 4, cache_salt=""),
            ValueError,
            ["cache_salt must not be empty: leave it out (None) for no salt"],
        ),
        (
            lambda b: b.decode_many([[2, 5, 6]], 4, cache_salt=""),
            ValueError,
            ["cache_salt must not be empty"],
        ),
        (
            lambda b: b.submit([2, 5, 6], 4, reuse_points=[1, "x"]),
            ValueError,
            ["reuse_points[1] is 'x' (str)"],
        ),
        (
            lambda b: b.submit([2, 5, 6], 4, reuse_points=2),
            ValueError,
            ["reuse_points must be a sequence", "got int"],
        ),
        (
            lambda b: b.submit([2, 5, 6], 4, reuse_points=[0]),
            ValueError,
            ["reuse_points[0] is 0, outside the positions [1, 3) of ids (3 ids)"],
        ),
        (
            lambda b: b.submit([2, 5, 6], 4, reuse_points=[1, 3]),
            ValueError,
            ["reuse_points[1] is 3, outside the positions [1, 3) of ids (3 ids)"],
        ),
        (
            lambda b: b.decode_many([[2, 5, 6, 7], [2, 5]], 4, reuse_points=[1, 2]),
            ValueError,
            [
                "reuse_points[1] is 2, outside the positions [1, 2) of prompts[1] (2 ids)",
                "one list serves every prompt, so each point must lie inside each",
            ],
        ),
        (lambda b: b.submit([2, 5, 6], 4, cache_salt=5), TypeError, ["cache_salt"]),
        (lambda b: b.submit([2, 5, 6], 4, None, 1, None, "s"), TypeError, ["submit()"]),
    ],
)
def test_bad_cache_arguments_are_refused_and_queue_nothing(engine, call, kind, words):
    batch = engine.batch(rows=2, cache_mb=16, cache_block=16)
    with pytest.raises(kind) as info:
        call(batch)
    assert type(info.value) is kind
    for word in words:
        assert word in str(info.value)
    assert batch.stats()["queued"] == 0 and batch.idle


@pytest.mark.parametrize("kwargs", [{"cache_salt": "alice"}, {"reuse_points": [1]}])
def test_engine_decode_keeps_no_cache_and_takes_no_cache_arguments(engine, kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        engine.decode([2, 5, 6], 4, **kwargs)
