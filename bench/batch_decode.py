"""Aggregate decode speed of several streams in one Batch (issue #17), and the longest gap between
two tokens of a running stream while a long prompt is read beside it.

    python bench/batch_decode.py --model DIR [--emb4 DIR] [--streams 1,2,4,8] [--new 64]
        [--prompt 32] [--context 8192] [--dtype bfloat16] [--threads 0] [--int4-activation-bits 16]
        [--rounds 1] [--long-prompt 4096] [--step-tokens 0] [--pass-rows 0] [--turn-prompt 4000]
        [--cache-mb 1024] [--shared-prompt 1024] [--choices 4] [--llamacpp GGUF]
        [--llamacpp-threads 2]

Each stream count runs `streams` prompts of `--prompt` tokens through Batch.decode_many (greedy,
no stop ids, `--new` tokens each); the decode rate is that of every stream decoding at once:
between the last stream's first token and the first stream's last, each stream's tokens over its
time in that window, summed over the streams (streams start and end a few steps apart: counting
from the last first token to the last token put the ramp's tokens, made while prompts were still
read, in the time of the full batch and the tail's smaller steps against it), and the median and
the last stream's time to its first token are those of prompts that all arrive at once (read in
passes of up to --pass-rows rows, Engine.batch's pass_rows). `Engine.decode` alone gives the
single-stream baseline. With --rounds N the sweep runs N times one after the other: each stream
count reports the median of its rounds and, where the sweep has one stream, each round's rate
over that round's one stream and their median, so that a slow spell of a shared machine between
a one-stream run and a many-stream run moves one round's ratio, not the figure. With
--long-prompt N, one stream decodes while an N-token prompt is read in chunks within
--step-tokens; the longest gap between the running stream's tokens is reported beside its median
gap. With --turn-prompt N, a first turn of N prompt tokens and then a second
turn that repeats it, its reply and 19 more tokens run through a prefix cache of --cache-mb MiB,
then the first turn again (a regenerated reply); their times to first token are reported side
by side. With --shared-prompt N, --choices
sequences given one N-token prompt at once (a request's n choices) run through a Batch of that
many rows with the prefix cache and without: the time until every one has its first token and
the prompt tokens read, side by side. With --llamacpp, the same sweep (same
prompts, counts and rate) runs afterwards through llama.cpp's multi-sequence context
(bench/llamacpp_batch.mjs) on that GGUF, and a table of both goes to stderr. Prints one JSON
object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import torchtpu_cpp as tt


def prompt(length: int, seed: int, vocab: int) -> list[int]:
    """BOS and then ordinary ids spread over the vocabulary (synthetic weights: content is moot)."""
    return [2] + [
        4 + (seed * 7919 + i * 104729) % (vocab - 4) for i in range(length - 1)
    ]


def aggregate(engine, streams: int, args) -> dict:
    vocab = engine.vocab_size
    prompts = [prompt(args.prompt, s, vocab) for s in range(streams)]
    arrivals = {}  # stream -> [(time, tokens)], one entry per callback

    def on_tokens(index, tokens):
        arrivals.setdefault(index, []).append((time.perf_counter(), len(tokens)))
        return True

    batch = engine.batch(rows=streams, step_tokens=args.step_tokens, pass_rows=args.pass_rows)
    start = time.perf_counter()
    results = batch.decode_many(prompts, args.new, stop=(), on_tokens=on_tokens)
    end = time.perf_counter()
    rate = all_decoding_rate(list(arrivals.values()))
    waits = [a[0][0] - start for a in arrivals.values()]
    return {
        "streams": streams,
        "tokens": sum(len(r.tokens) for r in results),
        "wall_s": end - start,
        # All prompts arrive at once: how long the median and the last stream wait for a token.
        "first_token_s": statistics.median(waits),
        "last_first_token_s": max(waits),
        "aggregate_tok_s": rate,
        "per_stream_tok_s": rate / streams if rate else None,
    }


def all_decoding_rate(arrivals: list[list[tuple[float, int]]]) -> float | None:
    """Tokens per second while every stream decodes: between the last stream's first arrival and
    the first stream's last, each stream's tokens after its first arrival there over the time to
    its last one there, summed; None when the streams never decode all at once."""
    begin = max(a[0][0] for a in arrivals)
    end = min(a[-1][0] for a in arrivals)
    rate = 0.0
    for a in arrivals:
        inside = [(t, n) for t, n in a if begin <= t <= end]
        if len(inside) < 2:
            return None
        rate += sum(n for _, n in inside[1:]) / (inside[-1][0] - inside[0][0])
    return rate


def over_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Per stream count, the median of its rounds' rates and, where the sweep has one stream, each
    round's rate over that round's one stream."""
    ones = [next((b["aggregate_tok_s"] for b in r if b["streams"] == 1), None) for r in rounds]
    summary = []
    for i, first in enumerate(rounds[0]):
        first = dict(
            first,
            **{
                key: statistics.median(r[i][key] for r in rounds)
                for key in ("first_token_s", "last_first_token_s")
            },
        )
        rates = [r[i]["aggregate_tok_s"] for r in rounds]
        if None in rates:  # a single token per stream has no decode span
            summary.append(dict(first, aggregate_tok_s_rounds=rates))
            continue
        median = statistics.median(rates)
        entry = dict(first, aggregate_tok_s=median, per_stream_tok_s=median / first["streams"])
        entry["aggregate_tok_s_rounds"] = rates
        if all(ones):
            ratios = [rate / one for rate, one in zip(rates, ones)]
            entry["over_one_stream_rounds"] = ratios
            entry["over_one_stream"] = statistics.median(ratios)
        summary.append(entry)
    return summary


def long_prompt_gap(engine, args) -> dict:
    vocab = engine.vocab_size
    batch = engine.batch(rows=2, step_tokens=args.step_tokens)
    stamps = []
    running = batch.submit(
        prompt(args.prompt, 0, vocab),
        args.new + 4096,
        stop=(),
        on_tokens=lambda tokens: stamps.append(time.perf_counter()) or True,
    )
    for _ in range(4):
        batch.step()
    before = len(stamps)
    reader = batch.submit(prompt(args.long_prompt, 1, vocab), 1, stop=())
    read_start = time.perf_counter()
    while True:
        finished = batch.step()
        if reader in finished:
            break
    read_s = time.perf_counter() - read_start
    batch.cancel(running)
    while not batch.idle:
        batch.step()
    during = stamps[before - 1 :]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    return {
        "long_prompt_tokens": args.long_prompt,
        "read_s_beside_a_stream": read_s,
        "running_stream_tokens_meanwhile": len(gaps),
        "longest_gap_s": max(gaps) if gaps else None,
        "median_gap_s": statistics.median(gaps) if gaps else None,
    }


def second_turn(engine, args) -> dict:
    """A conversation's second turn through the prefix cache, and its first turn sent again (a
    regenerated reply): their times to first token against the first turn's."""
    vocab = engine.vocab_size
    batch = engine.batch(rows=1, step_tokens=args.step_tokens, cache_mb=args.cache_mb)
    first_prompt = prompt(args.turn_prompt, 2, vocab)
    first = batch.decode_many([first_prompt], args.new, stop=())[0]
    second_prompt = first_prompt + first.tokens + prompt(20, 3, vocab)[1:]
    second = batch.decode_many([second_prompt], args.new, stop=())[0]
    again = batch.decode_many([first_prompt], args.new, stop=())[0]
    return {
        "first_turn_prompt_tokens": len(first_prompt),
        "first_turn_ttft_s": first.read_s,
        "second_turn_prompt_tokens": len(second_prompt),
        "second_turn_cached_tokens": second.cached_tokens,
        "second_turn_ttft_s": second.read_s,
        "ttft_ratio": second.read_s / first.read_s,
        "regenerate_cached_tokens": again.cached_tokens,
        "regenerate_ttft_s": again.read_s,
        "regenerate_ttft_ratio": again.read_s / first.read_s,
        "cache": batch.stats()["cache"],
    }


def shared_prompt(engine, args) -> dict:
    """--choices sequences given one prompt at once: read once through the prefix cache (the
    others wait for the first, then start from its state), or by each without it."""
    vocab = engine.vocab_size
    shared = prompt(args.shared_prompt, 4, vocab)
    out = {"prompt_tokens": len(shared), "sequences": args.choices}
    for label, cache_mb in (("cache", args.cache_mb), ("no_cache", 0)):
        batch = engine.batch(rows=args.choices, step_tokens=args.step_tokens, cache_mb=cache_mb)
        start = time.perf_counter()
        batch.decode_many([shared] * args.choices, 1, stop=())
        out[label] = {
            "all_first_tokens_s": time.perf_counter() - start,
            "prompt_tokens_read": batch.stats()["prompt_tokens"],
        }
    out["time_ratio"] = out["cache"]["all_first_tokens_s"] / out["no_cache"]["all_first_tokens_s"]
    return out


def llamacpp_sweep(args, vocab: int) -> dict:
    """bench/llamacpp_batch.mjs over the same stream counts, prompts and token counts."""
    command = [
        shutil.which("node") or "node",
        pathlib.Path(__file__).with_name("llamacpp_batch.mjs"),
        *("--model", args.llamacpp, "--vocab", vocab, "--streams", args.streams),
        *("--new", args.new, "--prompt", args.prompt, "--context", args.context),
        *("--threads", args.llamacpp_threads),
    ]
    done = subprocess.run(
        [str(part) for part in command], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def side_by_side(ours: list[dict], peer: list[dict]) -> str:
    lines = ["streams  ours tok/s  llama.cpp tok/s  ours/llama.cpp"]
    for a, b in zip(ours, peer):
        ratio = a["aggregate_tok_s"] / b["aggregate_tok_s"]
        lines.append(
            f"{a['streams']:7d}  {a['aggregate_tok_s']:10.2f}  "
            f"{b['aggregate_tok_s']:15.2f}  {ratio:14.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--emb4")
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--int4-activation-bits", type=int, default=16, choices=(16, 8))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prefill-chunk", type=int, default=512)
    parser.add_argument("--step-tokens", type=int, default=0)
    parser.add_argument("--pass-rows", type=int, default=0)
    parser.add_argument("--long-prompt", type=int, default=0)
    parser.add_argument("--turn-prompt", type=int, default=0)
    parser.add_argument("--cache-mb", type=float, default=1024)
    parser.add_argument("--shared-prompt", type=int, default=0)
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--llamacpp")
    parser.add_argument("--llamacpp-threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    engine = tt.Engine(
        args.model,
        args.emb4,
        context=args.context,
        dtype=args.dtype,
        threads=args.threads,
        prefill_chunk=args.prefill_chunk,
        int4_activation_bits=args.int4_activation_bits,
    )
    alone = engine.decode(prompt(args.prompt, 0, engine.vocab_size), args.new, stop=())
    out = {
        "model": args.model,
        "emb4": args.emb4,
        "dtype": args.dtype,
        "context": args.context,
        "report": engine.report(),
        "alone_tok_s": (len(alone.tokens) - 1) / alone.decode_s,
    }
    rounds = []
    for _ in range(args.rounds):
        rounds.append([])
        for streams in (int(s) for s in args.streams.split(",")):
            rounds[-1].append(aggregate(engine, streams, args))
            print(json.dumps(rounds[-1][-1]), file=sys.stderr)
    out["batches"] = over_rounds(rounds)
    if args.long_prompt:
        out["long_prompt"] = long_prompt_gap(engine, args)
    if args.turn_prompt:
        out["second_turn"] = second_turn(engine, args)
    if args.shared_prompt:
        out["shared_prompt"] = shared_prompt(engine, args)
    if args.llamacpp:
        out["llamacpp"] = llamacpp_sweep(args, engine.vocab_size)
        print(side_by_side(out["batches"], out["llamacpp"]["batches"]), file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
