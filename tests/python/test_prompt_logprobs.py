"""The prompt's own logprobs, as clients that score text ask for them: OpenAI's `echo` with
`logprobs` on /v1/completions (what lm-evaluation-harness's loglikelihood tasks send) and vLLM's
`prompt_logprobs` on completions and chat. Each prompt token's logprob, best alternatives and rank
are those of transformers' Gemma 4 on the same tokens at float32, with the prompt read in chunks
across sliding windows, beside other streams, and after the prefix cache holds the prompt (whose
restored positions would have no logits); lm-evaluation-harness's own client scores through
them as transformers does; malformed fields get a 400 naming them."""

import json
import threading

import hf_tiny
import numpy as np
import pytest
from test_serve_python import Server

TOL = 1e-3  # the parity suites' tolerance on f32 logits
PROMPT_LEN = 150  # > 2 chunks of 64 scored positions, > 4 sliding windows of 32


@pytest.fixture(scope="module")
def checkpoint(cli, tmp_path_factory, test_tokenizer_dir):
    """Tiny random f32 weights with the full Gemma 4 vocabulary, so the test tokenizer fits."""
    return cli.make_served_tiny(tmp_path_factory.mktemp("scored"), test_tokenizer_dir, 21, "f32")


@pytest.fixture(scope="module")
def server(cli, checkpoint):
    s = Server(
        [cli.path, "serve", "--model", checkpoint, "--port", "0", "--context", "512", "--dtype",
         "float32", "--parallel", "4"]
    )
    yield s
    s.stop()


def _log_softmax(logits):
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' log_softmax over the prompt, and its tokenizer."""
    from transformers import AutoTokenizer

    model = hf_tiny.load(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    # BOS, then random ordinary tokens: each shows as text of its own (no special tokens, no
    # bytes of a character split between tokens), so the echoed text and its offsets are exact.
    rng = np.random.RandomState(5)
    special = set(tokenizer.all_special_ids)
    ids = [2]
    while len(ids) < PROMPT_LEN:
        t = int(rng.randint(4, model.config.get_text_config().vocab_size))
        piece = tokenizer.decode([t])
        if t not in special and piece and "\ufffd" not in piece and not piece.startswith("<"):
            ids.append(t)
    return ids, _log_softmax(hf_tiny.logits(model, ids)), tokenizer


def _post(server, path, body):
    status, text = server.post(path, body)
    assert status == 200, text
    return json.loads(text)


def _echo(server, ids, **extra):
    body = {"prompt": ids, "echo": True, "logprobs": 5, "max_tokens": 1, "temperature": 0}
    return _post(server, "/v1/completions", dict(body, **extra))


def _check_echo(answer, reference):
    ids, want, tokenizer = reference
    lp = answer["choices"][0]["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == n + 1  # the prompt, then the one generated token
    assert lp["tokens"][0] == tokenizer.decode([ids[0]])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = np.array(lp["token_logprobs"][1:n])
    expected = want[np.arange(n - 1), ids[1:]]
    assert np.abs(got - expected).max() <= TOL
    assert abs(lp["token_logprobs"][n] - want[n - 1].max()) <= TOL  # greedy: the best token
    for i in range(1, n + 1):
        best = np.sort(want[i - 1])[::-1][:5]
        assert np.abs(np.sort(list(lp["top_logprobs"][i].values()))[::-1] - best).max() <= TOL
    # The text is the prompt's, then the answer's, and each prompt token's offset is where its
    # text starts in it, in characters (Python's str indexes), as OpenAI and vLLM count them.
    text = answer["choices"][0]["text"]
    pieces = [""] + [tokenizer.decode([t]) for t in ids[1:]]
    assert text.startswith("".join(pieces))
    assert lp["text_offset"][:n] == list(np.cumsum([0] + [len(p) for p in pieces[:-1]]))
    assert lp["text_offset"][n] == len("".join(pieces))
    return lp


def test_echo_logprobs_are_transformers_logprobs_of_the_prompt(server, reference):
    ids = reference[0]
    answer = _echo(server, ids)
    _check_echo(answer, reference)
    assert answer["usage"]["prompt_tokens"] == len(ids)
    # Echo alone (no logprobs) puts the prompt's text before each choice's.
    plain = _post(
        server,
        "/v1/completions",
        {"prompt": ids, "echo": True, "max_tokens": 3, "temperature": 0, "n": 2},
    )
    prompt_text = reference[2].decode(ids, skip_special_tokens=True)
    for choice in plain["choices"]:
        assert choice["text"].startswith(prompt_text) and len(choice["text"]) > len(prompt_text)
        assert choice["logprobs"] is None


def test_max_tokens_0_with_echo_scores_the_prompt_alone(server, reference):
    """OpenAI's legacy way to score a text, which older lm-evaluation-harness versions send."""
    ids, want, tokenizer = reference
    answer = _echo(server, ids, max_tokens=0, logprobs=1)
    choice = answer["choices"][0]
    assert choice["text"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    got = np.array(choice["logprobs"]["token_logprobs"][1:])
    assert np.abs(got - want[np.arange(len(ids) - 1), ids[1:]]).max() <= TOL
    assert answer["usage"]["completion_tokens"] == 0
    assert answer["usage"]["prompt_tokens"] == len(ids)


def test_a_prompt_the_prefix_cache_holds_is_scored_whole(server, reference):
    ids = reference[0]
    # A prompt's end is a reuse point for prompts that go on from it, as a chat's next turn does.
    _post(server, "/v1/completions", {"prompt": ids[:100], "max_tokens": 2, "temperature": 0})
    plain = _post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] >= 100  # the cache holds it
    _post(server, "/v1/completions", {"prompt": ids[:100], "max_tokens": 2, "temperature": 0})
    answer = _echo(server, ids)
    _check_echo(answer, reference)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert answer["choices"][0]["text"].endswith(plain["choices"][0]["text"])


def test_scored_beside_other_streams_as_alone(server, reference):
    ids = reference[0]
    alone = _echo(server, ids)["choices"][0]["logprobs"]
    results = {}

    def run(key, body):
        results[key] = _post(server, "/v1/completions", body)

    others = [
        threading.Thread(
            target=run,
            args=(k, {"prompt": f"Stream {k} goes on", "max_tokens": 40, "ignore_eos": True}),
        )
        for k in range(2)
    ]
    for t in others:
        t.start()
    scored = _echo(server, ids)["choices"][0]["logprobs"]
    for t in others:
        t.join()
    assert all(len(results[k]["choices"][0]["text"]) > 0 for k in range(2))
    assert scored["tokens"] == alone["tokens"]
    difference = np.array(scored["token_logprobs"][1:]) - alone["token_logprobs"][1:]
    assert np.abs(difference).max() <= 1e-5


def test_a_streamed_echo_sends_the_prompt_first(server, reference):
    ids = reference[0]
    whole = _echo(server, ids, max_tokens=4, logprobs=2)
    status, text = server.post(
        "/v1/completions",
        {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 4, "temperature": 0,
         "stream": True},
    )
    assert status == 200, text
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks]
    prompt_text = reference[2].decode(ids, skip_special_tokens=True)
    assert choices[0]["text"].startswith(prompt_text)
    assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        streamed = [x for c in choices if c["logprobs"] for x in c["logprobs"][key]]
        assert streamed == whole["choices"][0]["logprobs"][key], key


def _check_vllm_entries(entries, ids, want):
    """vLLM's prompt_logprobs: null, then per token {id: {logprob, rank, decoded_token}}."""
    assert entries[0] is None and len(entries) == len(ids)
    for i in range(1, len(ids)):
        row, token = want[i - 1], ids[i]
        entry = entries[i][str(token)]
        assert abs(entry["logprob"] - row[token]) <= TOL
        # Ranks count the tokens above, which near-ties within TOL may reorder.
        lo = int((row > row[token] + TOL).sum()) + 1
        hi = int((row > row[token] - TOL).sum()) + 1
        assert lo <= entry["rank"] <= hi
        # The token's own entry, and its 3 best alternatives, ranked 1 to 3.
        assert {1, 2, 3} <= {e["rank"] for e in entries[i].values()}
        values = sorted((e["logprob"] for e in entries[i].values()), reverse=True)[:3]
        assert np.abs(np.array(values) - np.sort(row)[::-1][:3]).max() <= TOL


def test_prompt_logprobs_as_vllm_gives_them(server, reference):
    ids, want, tokenizer = reference
    answer = _post(
        server,
        "/v1/completions",
        {"prompt": ids, "prompt_logprobs": 3, "max_tokens": 2, "temperature": 0},
    )
    entries = answer["choices"][0]["prompt_logprobs"]
    _check_vllm_entries(entries, ids, want)
    assert entries[1][str(ids[1])]["decoded_token"] == tokenizer.decode([ids[1]])
    assert answer["choices"][0]["logprobs"] is None  # only the prompt's were asked for

    # Chat: beside the choices, for the prompt the template rendered.
    messages = [{"role": "user", "content": "Score this prompt, token by token."}]
    chat = _post(
        server,
        "/v1/chat/completions",
        {"messages": messages, "prompt_logprobs": 2, "max_tokens": 2, "temperature": 0},
    )
    rendered = _post(server, "/apply-template", {"messages": messages})["prompt"]
    same = _post(
        server,
        "/v1/completions",
        {"prompt": rendered, "prompt_logprobs": 2, "max_tokens": 1, "temperature": 0},
    )
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert chat["prompt_logprobs"] == same["choices"][0]["prompt_logprobs"]


def _reused_tokens(server):
    """Prompt tokens restored from the prefix cache since the server started (/metrics)."""
    status, text = server.get("/metrics")
    assert status == 200, text
    name = "torchtpu_prefix_cache_reused_tokens_total "
    return int(next(line for line in text.splitlines() if line.startswith(name))[len(name):])


def test_every_choice_shows_the_prompts_scores(server, reference):
    """With n > 1 the choices share one scoring of the prompt (choice 0's): each shows the same
    entries, transformers' own, whole or streamed; usage counts the prompt once."""
    ids, want, _ = reference
    answer = _echo(server, ids, n=3)
    assert len(answer["choices"]) == 3
    prompts = []
    for choice in answer["choices"]:
        lp = _check_echo({"choices": [choice]}, reference)
        n = len(ids)
        prompts.append((lp["tokens"][:n], lp["token_logprobs"][:n], lp["top_logprobs"][:n]))
    assert prompts[1] == prompts[0] and prompts[2] == prompts[0]
    assert answer["usage"]["prompt_tokens"] == len(ids)

    # Streamed, every choice's first chunk echoes the prompt with those entries, and only choice 0
    # scores it: the others restore all but its last token from the prefix cache.
    reused = _reused_tokens(server)
    status, text = server.post(
        "/v1/completions",
        {"prompt": ids, "echo": True, "logprobs": 5, "max_tokens": 1, "temperature": 0, "n": 3,
         "stream": True},
    )
    assert status == 200, text
    streamed = {}  # index: the choice as a whole answer shows it
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        for chunk in json.loads(line[6:])["choices"]:
            choice = streamed.setdefault(chunk["index"], {"text": "", "logprobs": {}})
            choice["text"] += chunk["text"]
            for key, values in (chunk["logprobs"] or {}).items():
                choice["logprobs"].setdefault(key, []).extend(values)
    assert sorted(streamed) == [0, 1, 2]
    assert _reused_tokens(server) - reused == 2 * (len(ids) - 1)
    for choice in streamed.values():
        lp = _check_echo({"choices": [choice]}, reference)
        assert (lp["tokens"][:n], lp["token_logprobs"][:n], lp["top_logprobs"][:n]) == prompts[0]

    vllm = _post(
        server,
        "/v1/completions",
        {"prompt": ids, "prompt_logprobs": 3, "max_tokens": 2, "temperature": 0, "n": 2},
    )
    entries = [c["prompt_logprobs"] for c in vllm["choices"]]
    assert entries[1] == entries[0]
    _check_vllm_entries(entries[0], ids, want)


def test_engine_score_gives_transformers_logprobs_of_the_prompt(checkpoint, reference):
    """The Python module's Engine.score: every token after the first, scored and ranked as
    transformers scores it, with its best alternatives, across 64-position pieces and sliding
    windows; it leaves a decode after it as that decode alone; bad input is a ValueError."""
    import torchtpu_cpp as tt

    ids, want, _ = reference
    engine = tt.Engine(checkpoint, context=512, dtype="float32")
    alone = engine.decode(ids, max_new=4).tokens
    scores = engine.score(ids, top=3)
    assert len(scores) == len(ids) - 1
    for i, score in enumerate(scores, start=1):
        row, token = want[i - 1], ids[i]
        assert score.id == token and abs(score.logprob - row[token]) <= TOL
        # Ranks count the tokens above, which near-ties within TOL may reorder.
        assert int((row > row[token] + TOL).sum()) + 1 <= score.rank
        assert score.rank <= int((row > row[token] - TOL).sum()) + 1
        best = np.sort(row)[::-1][:3]
        assert np.abs(np.array([lp for _, lp in score.top]) - best).max() <= TOL
        assert all(abs(row[t] - lp) <= TOL for t, lp in score.top)
    plain = engine.score(ids)
    assert all(s.top == [] for s in plain)
    assert [s.logprob for s in plain] == [s.logprob for s in scores]
    assert engine.decode(ids, max_new=4).tokens == alone

    with pytest.raises(ValueError, match="scoring needs at least two token ids"):
        engine.score(ids[:1])
    with pytest.raises(ValueError, match=r"top must be in \[0, 262144\], got -1"):
        engine.score(ids, top=-1)
    with pytest.raises(ValueError, match="token id 262144 at position 1 is outside the vocabulary"):
        engine.score([2, 262144])


BETWEEN = "'prompt_logprobs' must be between 0 and 20, got "


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"prompt_logprobs": 21}, "prompt_logprobs", BETWEEN + "21"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", BETWEEN + "-1"),
        ({"prompt_logprobs": "3"}, "prompt_logprobs", "'prompt_logprobs' must be an integer"),
        (
            {"prompt_logprobs": 1, "stream": True},
            "prompt_logprobs",
            "'prompt_logprobs' cannot be combined with 'stream': true",
        ),
        ({"echo": "yes"}, "echo", "'echo' must be a boolean"),
        ({"max_tokens": 0}, "max_tokens", "'max_tokens' must be at least 1, got 0"),
        ({"max_tokens": -1, "echo": True}, "max_tokens", "'max_tokens' must be at least 0, got -1"),
    ],
)
def test_malformed_fields_are_a_400_naming_them(server, body, param, message):
    for path, base in (
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], 
         "max_tokens": 1}),
    ):
        if "echo" in body and path != "/v1/completions":
            continue  # chat has no echo
        status, text = server.post(path, dict(base, **body))
        assert status == 400, (path, text)
        error = json.loads(text)["error"]
        assert error["param"] == param and error["message"].startswith(message), error
    # The server goes on answering.
    assert server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200


def test_lm_evaluation_harness_scores_as_transformers(server, checkpoint, reference):
    """lm-evaluation-harness's own `local-completions` model, as `lm_eval --model
    local-completions` drives it for loglikelihood tasks: token-id prompts, echo, logprobs 1,
    several prompts a request (batch_size 3 over 4 requests). Each continuation's logprob and
    whether it is the greedy one are what transformers gives the same token ids."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    tokenizer = reference[2]
    model_id = json.loads(server.get("/v1/models")[1])["data"][0]["id"]
    lm = LocalCompletionsAPI(
        base_url=server.url + "/v1/completions",
        model=model_id,
        tokenizer_backend="huggingface",
        tokenizer=checkpoint,
        batch_size=3,
        max_length=512,
    )
    pairs = [
        ("The sea is", " deep and cold"),
        ("Once upon a time", " there was a lighthouse keeper"),
        ("Rain falls on", " the town"),
        ("Question: what is two plus two?\nAnswer:", " four"),
    ]
    requests = [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i)
        for i, pair in enumerate(pairs)
    ]
    got = lm.loglikelihood(requests, disable_tqdm=True)
    model = hf_tiny.load(checkpoint)
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
        n = len(tokenizer(context, add_special_tokens=False).input_ids)
        rows = _log_softmax(hf_tiny.logits(model, whole))[n - 1 : -1]
        targets = whole[n:]
        want = rows[np.arange(len(targets)), targets].sum()
        assert abs(logprob - want) <= TOL * len(targets), (context, logprob, want)
        assert greedy == all(rows.argmax(-1) == targets), context
