"""ChatTemplate (C++ over MiniJinja) against transformers' apply_chat_template(tokenize=False).

Every case is rendered by both; outputs must be byte-identical, and a template that raises must
raise in both (with the same text when it is the template's own raise_exception). The reference
is a local tokenizer object carrying the template, so no Hub download is involved.
"""

import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

DATA = Path(os.environ.get("GEMMA4_DATA", Path(__file__).parents[2] / "data/gemma4"))
RENDER = os.environ.get("CHAT_TEMPLATE_RENDER")
MAIN = DATA / "chat_template.jinja"
VARIANTS = sorted(p for p in DATA.glob("chat_template.*.jinja"))


def make_tokenizer(template, bos="<bos>", eos="<eos>"):
    vocab = {"<unk>": 0, bos: 1, eos: 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, chat_template=template
    )


def reference(tokenizer, case):
    """("rendered", text), ("raised", message) from raise_exception, or ("error", message)."""
    kwargs = dict(case.get("kwargs") or {})
    try:
        return (
            "rendered",
            tokenizer.apply_chat_template(
                copy.deepcopy(case["messages"]),
                tools=copy.deepcopy(case.get("tools")),
                add_generation_prompt=case.get("add_generation_prompt", False),
                tokenize=False,
                **kwargs,
            ),
        )
    except jinja2.TemplateError as e:
        # raise_exception raises the base class; syntax and undefined errors are subclasses.
        return ("raised" if type(e) is jinja2.TemplateError else "error", str(e))
    except Exception as e:  # noqa: BLE001 - any failure in transformers must be a failure here
        return ("error", f"{type(e).__name__}: {e}")


def render_native(requests):
    """Runs the C++ renderer once over all requests."""
    assert RENDER, "CHAT_TEMPLATE_RENDER must name the chat_template_render executable"
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests)
    proc = subprocess.run(
        [RENDER], input=lines.encode(), capture_output=True, check=True, timeout=120
    )
    out = [json.loads(line) for line in proc.stdout.decode().split("\n") if line]
    assert len(out) == len(requests), proc.stderr.decode()
    return [
        ("rendered", o["rendered"]) if "rendered" in o else ("error", o["error"])
        for o in out
    ]


def request(template_path, case):
    return {
        "template_path": str(template_path),
        "messages": case["messages"],
        "tools": case.get("tools"),
        "add_generation_prompt": case.get("add_generation_prompt", False),
        "kwargs": case.get("kwargs") or {},
    }


def assert_same(case_name, ours, theirs):
    """Renderings byte-identical; the template's own raise_exception text identical; any other
    error in transformers (syntax, undefined, type) an error here too, worded by MiniJinja."""
    if theirs[0] == "rendered":
        assert ours == theirs, f"{case_name}: rendering differs"
    elif theirs[0] == "raised":
        assert ours == ("error", theirs[1]), f"{case_name}: raise_exception differs"
    else:
        assert ours[0] == "error", (
            f"{case_name}: transformers failed ({theirs[1]}), we rendered"
        )


def cross_check(template_path, cases):
    tokenizer = make_tokenizer(template_path.read_text(encoding="utf-8"))
    theirs = [reference(tokenizer, c) for c in cases]
    ours = render_native([request(template_path, c) for c in cases])
    for case, o, t in zip(cases, ours, theirs):
        assert_same(case["name"], o, t)
    return theirs


def stored_cases(cases):
    """rendered_examples.json puts add_generation_prompt and bos_token into kwargs."""
    out = []
    for c in cases:
        kwargs = dict(c["kwargs"])
        agp = kwargs.pop("add_generation_prompt", False)
        out.append({**c, "kwargs": kwargs, "add_generation_prompt": agp})
    return out


# ---------------------------------------------------------------------------------------------
# Generated conversations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a place.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "object",
                    "description": "Where to look.",
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "country": {"type": "string", "enum": ["FR", "DE", "JP"]},
                        "coords": {
                            "type": "array",
                            "description": "Latitude and longitude",
                            "items": {"type": "number"},
                        },
                    },
                    "required": ["city"],
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {
                    "type": "integer",
                    "description": "Forecast days",
                    "nullable": True,
                },
                "fields": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "precision": {"type": "integer"},
                        },
                        "required": ["name"],
                    },
                },
            },
            "required": ["location", "unit"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": 'Search the web for "exact" phrases & <tags>.',
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Query text"},
                "limit": {"type": "integer"},
                "safe": {"type": "boolean"},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["news", "blog"]},
                },
            },
            "required": ["query"],
        },
        "response": {"type": "object", "description": "Search results"},
    },
}
NOW = {
    "type": "function",
    "function": {"name": "now", "description": "The current time.", "parameters": None},
}
TOOLS = [WEATHER, SEARCH, NOW]

WEATHER_ARGS = {
    "location": {"city": "Paris", "country": "FR", "coords": [48.8566, 2.3522]},
    "unit": "celsius",
    "days": None,
    "fields": [{"name": "temp", "precision": 1}, {"name": "wind"}],
}
SEARCH_ARGS = {
    "query": 'naïve "quotes" <|"|> & 日本',
    "limit": 10,
    "safe": False,
    "ratio": 1e-05,
}


def call(id_, name, args):
    return {
        "id": id_,
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def conversations():
    thought = "<|channel>thought\nLet me think about this.<channel|>"
    convs = {
        "user_only": [u("Hello")],
        # Text that cannot cross a C string whole: the rendering keeps the NUL.
        "control_characters": [u("a\x00b\x07c\r\nd\u2028e")],
        "system": [{"role": "system", "content": "Be brief."}, u("Hi")],
        "developer": [
            {"role": "developer", "content": "  Answer in French.  "},
            u("Hi"),
        ],
        "system_parts": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "Part one."},
                    {"type": "text", "text": "Two"},
                ],
            },
            u("Go"),
        ],
        "user_parts": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look at this: "},
                    {"type": "image", "url": "x.png"},
                    {"type": "text", "text": " and tell me."},
                ],
            }
        ],
        "many_turns": [
            m for i in range(6) for m in (u(f"Question {i}?"), a(f"Answer {i}."))
        ]
        + [u("Last one")],
        "thinking_stripped": [
            u("Hi"),
            a(thought + "Hello!"),
            u("And now?"),
            a(thought + "Ok."),
        ],
        "thinking_midcontent": [
            u("Q"),
            a("Pre <|channel>thought\nx<channel|> post"),
            u("Q2"),
        ],
        "reasoning_field": [
            u("Q1"),
            {"role": "assistant", "content": "A1", "reasoning_content": "hidden old"},
            u("Q2"),
            {"role": "assistant", "content": "A2", "reasoning_content": "visible new"},
        ],
        "thinking_key": [
            u("Q"),
            {"role": "assistant", "content": "A", "thinking": "T"},
        ],
        "unicode": [u("日本語で答えて 🙂👩‍👩‍👧 «ça»\ttab"), a("はい。\n\n  ")],
        "whitespace": [u("\n\n  spaced  \n"), a("  padded  ")],
        "tool_round": [
            u("Weather in Paris?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("c1", "get_weather", WEATHER_ARGS)],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "get_weather",
                "content": '{"temp": 21.5}',
            },
            a("It is 21.5 °C."),
        ],
        "tool_two_calls": [
            u("Search and weather"),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("a", "search", SEARCH_ARGS),
                    call(
                        "b",
                        "get_weather",
                        {"location": {"city": "Tokyo"}, "unit": "celsius"},
                    ),
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "a",
                "content": [{"type": "text", "text": "3 hits"}],
            },
            {
                "role": "tool",
                "tool_call_id": "b",
                "name": "get_weather",
                "content": "Sunny",
            },
        ],
        "tool_then_user": [
            u("Time?"),
            {"role": "assistant", "tool_calls": [call("t", "now", {})]},
            {"role": "tool", "tool_call_id": "t", "content": "12:00"},
            a("Noon."),
            u("Thanks"),
        ],
        "tool_pending": [
            u("Time?"),
            {"role": "assistant", "tool_calls": [call("t", "now", {})]},
        ],
        "tool_args_none": [
            u("Time?"),
            {"role": "assistant", "tool_calls": [call("t", "now", None)]},
            {"role": "tool", "tool_call_id": "t", "name": "now", "content": "12:00"},
        ],
        "tool_args_string": [
            u("Time?"),
            {"role": "assistant", "tool_calls": [call("t", "now", "{}")]},
        ],
        "tool_numbers": [
            u("Numbers"),
            {
                "role": "assistant",
                "tool_calls": [
                    call(
                        "n",
                        "search",
                        {"a": 3.0, "b": -2, "c": 1e20, "d": 0.1, "e": [1, 2.5, True]},
                    )
                ],
            },
            {"role": "tool", "tool_call_id": "n", "content": "ok"},
        ],
        "tool_with_reasoning": [
            u("Weather?"),
            {
                "role": "assistant",
                "reasoning_content": "Need the tool.",
                "tool_calls": [
                    call(
                        "w",
                        "get_weather",
                        {"location": {"city": "Oslo"}, "unit": "celsius"},
                    )
                ],
            },
            {"role": "tool", "tool_call_id": "w", "content": "Cold"},
        ],
        "legacy_tool_responses": [
            u("Weather?"),
            {
                "role": "assistant",
                "tool_calls": [call("w", "get_weather", {"unit": "celsius"})],
                "tool_responses": [
                    {"name": "get_weather", "response": {"temp": -3, "sky": "clear"}}
                ],
            },
        ],
        "ends_with_assistant": [u("Hi"), a("Hello")],
        "consecutive_assistant": [u("Hi"), a("Part 1"), a("Part 2"), u("ok")],
    }
    return convs


def generated_cases():
    cases = []
    for name, messages in conversations().items():
        with_tools = name.startswith(("tool", "legacy"))
        for agp in (True, False):
            for thinking in (None, True, False):
                kwargs = {} if thinking is None else {"enable_thinking": thinking}
                cases.append(
                    {
                        "name": f"{name}/agp={agp}/think={thinking}",
                        "messages": messages,
                        "tools": TOOLS if with_tools else None,
                        "add_generation_prompt": agp,
                        "kwargs": kwargs,
                    }
                )
    # Tools declared on conversations that use none, and preserve_thinking.
    for name in ("user_only", "system", "many_turns"):
        cases.append(
            {
                "name": f"{name}/tools",
                "messages": conversations()[name],
                "tools": TOOLS,
                "add_generation_prompt": True,
                "kwargs": {},
            }
        )
    cases.append(
        {
            "name": "tool_with_reasoning/preserve",
            "messages": conversations()["tool_with_reasoning"],
            "tools": TOOLS,
            "add_generation_prompt": True,
            "kwargs": {"preserve_thinking": True, "enable_thinking": True},
        }
    )
    return cases


# ---------------------------------------------------------------------------------------------
# Tests


def test_stored_examples_match_transformers_and_their_recorded_rendering():
    cases = stored_cases(
        json.loads((DATA / "rendered_examples.json").read_text(encoding="utf-8"))
    )
    theirs = cross_check(MAIN, cases)
    for case, t in zip(cases, theirs):
        if case["rendered"] is None:
            assert t == ("raised", case["error"].removeprefix("TemplateError: ")), case[
                "name"
            ]
        else:
            assert t == ("rendered", case["rendered"]), case["name"]


def test_generated_conversations_match_transformers():
    cases = generated_cases()
    assert len(cases) >= 50
    theirs = cross_check(MAIN, cases)
    assert sum(t[0] == "rendered" for t in theirs) >= 50


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda p: p.name)
def test_template_variants_match_transformers(variant):
    stored = json.loads(
        (DATA / "rendered_examples.variants.json").read_text(encoding="utf-8")
    )
    cases = stored_cases(stored.get(variant.name, []))
    subset = [c for c in generated_cases() if c["name"].endswith("agp=True/think=True")]
    subset += [
        c for c in generated_cases() if c["name"].startswith("tool_round/agp=False")
    ]
    theirs = cross_check(variant, cases + subset)
    for case, t in zip(cases, theirs):
        if case["rendered"] is not None:
            assert t == ("rendered", case["rendered"]), case["name"]


# Small templates that exercise where MiniJinja and Jinja2 could part ways: how values print,
# tojson's options, tests, Python methods, loop controls, whitespace control, generation blocks.
PROBES = {
    "numbers": "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 3 / 2 }} {{ 4 / 2 }} "
    "{{ 7 // 2 }} {{ 2 ** 10 }} {{ -7 % 3 }} {{ x.f }} {{ x.n }}",
    "containers": "{{ [1, 'a', none, true, 2.5] }} {{ {'a': 1, 'b': [1, 2]} }} {{ x }} {{ (1,) }}",
    "repr_quotes": "{{ [\"it's\", 'say \"hi\"', 'back\\\\slash', 'new\\nline'] }}",
    "scalars": "{{ none }}|{{ true }}|{{ undefined_name }}|{{ x.missing }}|{{ 'a' ~ true ~ none ~ 1.5 }}",
    "string_filter": "{{ true | string }} {{ [1, 'b'] | string }} {{ 2.0 | string }} {{ none | string }}",
    "tojson": "{{ x | tojson }}",
    "tojson_indent": "{{ x | tojson(indent=2) }}",
    "tojson_indent_str": "{{ x | tojson(indent='\\t') }}",
    "tojson_sorted": "{{ x | tojson(sort_keys=true) }}",
    "tojson_separators": "{{ x | tojson(separators=(',', ':')) }}",
    "tojson_ascii": "{{ x | tojson(ensure_ascii=true) }}",
    "tojson_positional": "{{ x | tojson(false, 1) }}",
    "tojson_scalars": "{{ 'a<b>&\\'' | tojson }} {{ none | tojson }} {{ 1.5 | tojson }} {{ [] | tojson(indent=2) }}",
    "tests": "{% for v in ['s', [1], {'k': 1}, none, 1, 1.5, true, undefined_name] %}"
    "{{ v is sequence }}{{ v is iterable }}{{ v is mapping }}{{ v is string }}{{ v is number }}"
    "{{ v is integer }}{{ v is float }}{{ v is boolean }}{{ v is none }}{{ v is defined }};{% endfor %}",
    "str_methods": "{{ 'Hello World'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }} "
    "{{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }} {{ 'abc'.startswith('a') }} "
    "{{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.upper() }} {{ 'a-b'.replace('-', '+') }} "
    "{{ 'hello world'.title() }} {{ 'abc'.find('c') }} {{ ','.join(['a', 'b']) }} "
    "{{ 'x'.rstrip() }} {{ 'l1\\nl2'.splitlines() }} {{ 'hello'.capitalize() }} {{ 'aaa'.count('a') }}",
    "dict_methods": "{% for k, v in x.items() %}{{ k }}={{ v }};{% endfor %} {{ x.keys() | list }} "
    "{{ x.get('n') }} {{ x.get('zz', 'dflt') }} {{ x.get('zz') }}",
    "dictsort": "{% for k, v in {'b': 1, 'A': 2, 'a': 3, 'C': 4} | dictsort %}{{ k }}{{ v }}{% endfor %}",
    "loop_controls": "{% for i in range(10) %}{% if i == 7 %}{% break %}{% endif %}"
    "{% if i is odd %}{% continue %}{% endif %}{{ i }}{{ loop.index }}{{ loop.last }}{% endfor %}",
    "namespace": "{% set ns = namespace(a=1, s='') %}{% for m in messages %}{% set ns.a = ns.a + 1 %}"
    "{% set ns.s = ns.s + m.role %}{% endfor %}{{ ns.a }}{{ ns.s }}",
    "whitespace": "  {% if true %}\n  yes\n  {% endif %}\n{%- for m in messages %}\n[{{ m.role }}]\n"
    "{% endfor %}\n  {{- 'trimmed' }}  \n{# comment #}\nend\n",
    "generation": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
    "filters": "{{ messages | length }} {{ 'héllo' | length }} {{ messages | map(attribute='role') | join(',') }} "
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ [3, 1, 2] | sort | join }} "
    "{{ [true, none, 1.0] | join('/') }} {{ 'a b' | title }} {{ '  t  ' | trim }} {{ 'x' | upper }} "
    "{{ messages[-1].content }} {{ messages[1:] | length }} {{ '%s-%d' | format('a', 3) }} "
    "{{ none | default('d') }} {{ '' | default('e', true) }} {{ [1, 2] | first }} {{ [1, 2] | last }} "
    "{{ 'abc' | reverse }} {{ range(3) | list }} {{ x.n | abs }} {{ 2.567 | round(1) }} {{ 5 | float }}",
    "slicing_and_in": "{{ 'abcdef'[1:4] }} {{ 'b' in 'abc' }} {{ 'k' in x }} {{ 2 in [1, 2] }} "
    "{{ messages[0]['role'] }} {{ x['n'] }} {{ x.u.nested.a }}",
    "macro": "{% macro f(a, b='d', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(1) }}{{ f(1, c=3) }}",
    "raise": "{{ raise_exception('custom failure: ' ~ messages[0].role) }}",
    "strftime": "{{ strftime_now('%Y') }}",
    "set_block": "{% set s %}\n  a {{ 1 }}\n{% endset %}[{{ s }}] {{ s | trim | length }}",
    "err_undefined_attr": "{{ undefined_name.attr }}",
    "err_missing_key_attr": "{{ x.missing.deeper }} {{ messages[10].role }}",
    "err_str_plus_int": "{{ 'a' + 1 }}",
    "err_length_of_int": "{{ 5 | length }}",
    "err_unknown_method": "{{ 'x'.nosuch() }}",
    "err_syntax": "{% if %}x{% endif %}",
    "err_unclosed": "{% for m in messages %}{{ m.role }}",
    "err_minijinja_only_test": "{{ 'a' is startingwith 'a' }}",
    "err_minijinja_only_filter": "{{ 'a b' | split | list }}",
    "err_list_append": "{% set l = [] %}{{ l.append(1) }}",
    "if_expr": "{{ 'y' if messages else 'n' }} {{ 'y' if [] else 'n' }} {{ 'y' if {} else 'n' }} "
    "{{ 'y' if 0.0 else 'n' }} {{ 'y' if '' else 'n' }} {{ messages[0].missing is defined }}",
}

PROBE_X = {
    "n": -3,
    "f": 2.5e-07,
    "s": 'é "q" \n\t\u0001 \u2028 日本 😀 </s>',
    "l": [1, 2.0, None, True, "x", [], {}],
    "u": {"nested": {"a": [{"z": 1, "a": 2}]}},
    "big": 12345678901234567890,
    "e": {},
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_jinja_semantics_probe_matches_transformers(name, tmp_path):
    path = tmp_path / f"{name}.jinja"
    path.write_text(PROBES[name], encoding="utf-8")
    case = {
        "name": name,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "bye"},
        ],
        "tools": None,
        "add_generation_prompt": False,
        "kwargs": {"x": PROBE_X},
    }
    cross_check(path, [case])


def save_checkpoint(tokenizer, directory, layout):
    tokenizer.save_pretrained(directory)
    root = Path(directory)
    if layout == "config_key":
        # The older layout: the template list inside tokenizer_config.json, no .jinja file.
        template = (root / "chat_template.jinja").read_text(encoding="utf-8")
        (root / "chat_template.jinja").unlink()
        config = json.loads(
            (root / "tokenizer_config.json").read_text(encoding="utf-8")
        )
        config["chat_template"] = [
            {"name": "default", "template": template},
            {"name": "tool_use", "template": "TOOLS:{{ tools | length }}" + template},
        ]
        (root / "tokenizer_config.json").write_text(
            json.dumps(config), encoding="utf-8"
        )
    elif layout == "special_tokens_map":
        # Legacy special_tokens_map.json, whose tokens win over the config's.
        tokens = {"bos_token": {"content": "<m>", "lstrip": False}, "eos_token": "</m>"}
        (root / "special_tokens_map.json").write_text(
            json.dumps(tokens), encoding="utf-8"
        )


@pytest.mark.parametrize("layout", ["jinja_file", "config_key", "special_tokens_map"])
def test_from_dir_matches_transformers_loading_the_same_directory(layout):
    template = MAIN.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as directory:
        tokenizer = make_tokenizer(template, bos="<s>", eos="</s>")
        save_checkpoint(tokenizer, directory, layout)
        loaded = AutoTokenizer.from_pretrained(directory)
        cases = [
            c for c in generated_cases() if c["name"].endswith("agp=True/think=None")
        ]
        theirs = [reference(loaded, c) for c in cases]
        requests = [{**request(MAIN, c), "model_dir": directory} for c in cases]
        ours = render_native(requests)
        for case, o, t in zip(cases, ours, theirs):
            assert_same(case["name"], o, t)
        bos = "<m>" if layout == "special_tokens_map" else "<s>"
        assert all(
            t[1].removeprefix("TOOLS:3").startswith(bos)
            for t in theirs
            if t[0] == "rendered"
        )
        if layout == "config_key":
            assert any(t[1].startswith("TOOLS:3") for t in theirs)
