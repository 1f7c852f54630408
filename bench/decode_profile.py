"""Where a decode step's time goes: the engine under torch.profiler, grouped by the model's own
profiler scopes (gemma4::inputs, ::attention, ::mlp, ::per_layer_input, ::head, engine::sample).

    python bench/decode_profile.py --model DIR [--emb4 DIR] [--prompt-tokens 19] [--steps 32]
        [--rows 1] [--int4-activation-bits 16]

With --rows N above 1, N sequences decode together in one Batch (issue #17), each step making N
tokens. Prints, per scope, milliseconds per decode step split into the linears
(torchtpu::int4_linear and aten::linear/mm with everything under them) and the rest, each with
its share of the step, then the ten costliest ATen ops outside the linears. The profiler adds a
few microseconds to every op, so shares are what this measures; the plain rate comes from
`torchtpu-cpp bench`. Last line: the same as JSON."""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import time

LINEARS = ("torchtpu::int4_linear", "aten::linear", "aten::mm", "aten::addmm")
SCOPES = (
    "gemma4::inputs",
    "gemma4::attention",
    "gemma4::mlp",
    "gemma4::per_layer_input",
    "gemma4::head",
    "engine::sample",
)


def _scope_of(event):
    while event is not None:
        if event.name in SCOPES:
            return event.name
        event = event.cpu_parent
    return "other"


def _under_linear(event):
    event = event.cpu_parent
    while event is not None:
        if event.name in LINEARS:
            return True
        event = event.cpu_parent
    return False


def _batch_steps(batch, ids, args, around) -> float:
    """Seconds of --steps decode steps of --rows sequences, timed (and wrapped in `around`) once
    every row has read its prompt and is decoding."""
    started = set()
    for row in range(args.rows):
        batch.submit(
            ids,
            args.steps + 2,
            stop=(),
            on_tokens=lambda tokens, row=row: started.add(row) or True,
        )
    while len(started) < args.rows:
        batch.step()
    with around:
        begin = time.perf_counter()
        for _ in range(args.steps):
            batch.step()
        seconds = time.perf_counter() - begin
    while not batch.idle:
        batch.step()
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--emb4")
    parser.add_argument("--prompt-tokens", type=int, default=19)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--int4-activation-bits", type=int, default=16, choices=(16, 8))
    args = parser.parse_args(argv)

    import torch
    import torchtpu_cpp
    from torch.profiler import ProfilerActivity, profile

    engine = torchtpu_cpp.Engine(
        args.model,
        args.emb4,
        context=args.context,
        threads=args.threads,
        int4_activation_bits=args.int4_activation_bits,
    )
    ids = [2] + [1000 + i for i in range(args.prompt_tokens - 1)]
    if args.rows == 1:
        engine.decode(ids, 4)
        plain_s = engine.decode(ids, args.steps + 1).decode_s
        # Only the decode steps: the prompt is read before the profiler starts.
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            begin = time.perf_counter()
            result = engine.decode(ids, args.steps + 1)
            wall = time.perf_counter() - begin - result.read_s
        decode_s = result.decode_s
        steps = len(result.tokens) - 1
    else:
        batch = engine.batch(rows=args.rows)
        plain_s = _batch_steps(batch, ids, args, contextlib.nullcontext())
        prof = profile(activities=[ProfilerActivity.CPU])
        decode_s = wall = _batch_steps(batch, ids, args, prof)
        steps = args.steps
    del torch

    linear = collections.Counter()
    rest = collections.Counter()
    ops = collections.Counter()
    for event in prof.events():
        if event.name in SCOPES or _under_linear(event):
            continue
        # Self time: each microsecond counts once, in the innermost op that spent it.
        us = event.self_cpu_time_total
        scope = _scope_of(event)
        if event.name in LINEARS:
            linear[scope] += us
        else:
            rest[scope] += us
            ops[event.name] += us
    total = sum(linear.values()) + sum(rest.values())
    rows = []
    for scope in (*SCOPES, "other"):
        rows.append(
            {
                "scope": scope,
                "linear_ms": linear[scope] / 1e3 / steps,
                "rest_ms": rest[scope] / 1e3 / steps,
                "share": (linear[scope] + rest[scope]) / total,
            }
        )
    print(
        f"{steps} decode steps of {args.rows} rows after a {len(ids)}-token prompt, threads"
        f" {engine.report()['threads']}, {os.cpu_count()} CPUs; unprofiled"
        f" {steps * args.rows / plain_s:.2f} tok/s, profiled"
        f" {steps * args.rows / decode_s:.2f} tok/s"
    )
    print(f"{'scope':26s} {'linears ms':>11s} {'rest ms':>9s} {'share':>7s}")
    for r in rows:
        print(
            f"{r['scope']:26s} {r['linear_ms']:11.2f} {r['rest_ms']:9.2f} {r['share']:7.1%}"
        )
    print(
        f"{'step':26s} {sum(linear.values()) / 1e3 / steps:11.2f}"
        f" {sum(rest.values()) / 1e3 / steps:9.2f}"
    )
    print("costliest ops outside the linears (ms per step):")
    top = ops.most_common(10)
    for name, us in top:
        print(f"  {name:32s} {us / 1e3 / steps:6.2f}")
    print(
        json.dumps(
            {
                "steps": steps,
                "rows": args.rows,
                "prompt_tokens": len(ids),
                "threads": engine.report()["threads"],
                "unprofiled_tok_s": steps * args.rows / plain_s,
                "profiled_wall_s": wall,
                "scopes": rows,
                "top_ops_ms": {name: us / 1e3 / steps for name, us in top},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
