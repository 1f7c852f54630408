"""Operator calls per decode step, as the dispatcher sees them: the host's share of a step on a
device, where each call is at least one kernel launch (docs/BENCHMARKS.md, "On a GPU").

    python bench/step_ops.py --model DIR [--emb4 DIR] [--device cpu|cuda:N|NAME]
        [--library LIB] [--dtype bfloat16] [--steps 16]

--library loads a backend first (the tests' stand-in, build/tests/libtorchtpu_standin.so, takes
the same composite kernels as CUDA). The steps are recorded by torchtpu_cpp.device_check's
recorder around a greedy decode; the first step and the last (prompt, final read) are left out.
Prints one JSON object: the calls of a steady step, and the most frequent.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torchtpu_cpp
from torchtpu_cpp.device_check import load_backend, recorded_decode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--emb4")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--library", action="append", default=[])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    for path in args.library:
        load_backend(path)
    engine = torchtpu_cpp.Engine(
        args.model, args.emb4, device=args.device, dtype=args.dtype, context=256
    )
    steps = recorded_decode(engine, [2, 5, 6, 7], args.steps + 2, 1)[1:-1]
    calls = [line.split("(", 1)[0].removeprefix("read ") for line in steps[-1]]
    print(
        json.dumps(
            {
                "model": args.model,
                "device": args.device,
                "dtype": args.dtype,
                "steps": len(steps),
                "calls_per_step": sorted({len(s) for s in steps}),
                "most_frequent": collections.Counter(calls).most_common(12),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
