"""torchtpu::dense_linear's CPU kernel against at::linear (BLAS) at float32, on E2B's MLP shapes
and the demo checkpoint's, at a Batch's row counts and a prompt chunk's: the medians of REPEATS
calls each, in ms, and ours over ATen's time. The same weights every call, as a decode step's
repeated layers are not, so a matrix that fits the last-level cache is read from it by both.

    PYTHONPATH=build/python .venv/bin/python bench/dense_linear.py [--repeats 15] [--threads 2]
"""
import argparse
import json
import platform
import statistics
import time

import torch

import torchtpu_cpp  # noqa: F401  (registers torch.ops.torchtpu)

SHAPES = [(1536, 6144), (6144, 1536), (64, 256)]  # (in, out)
ROWS = [1, 4, 8, 16, 132]


def cpu_name():
    """The CPU as /proc/cpuinfo names it, with its family and model (which tell the kinds apart)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.machine()
    return (f"{fields.get('model name', platform.machine())}, family {fields.get('cpu family')},"
            f" model {fields.get('model')}")


def median_ms(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours_op = torch.ops.torchtpu.dense_linear
    results = []
    print(f"{cpu_name()}, {args.threads} threads, float32")
    print(f"{'in x out':>12} {'rows':>5} {'ATen ms':>9} {'ours ms':>9} {'ours/ATen':>10}")
    for k, n in SHAPES:
        w = torch.randn(n, k)
        for m in ROWS:
            x = torch.randn(m, k)
            aten = median_ms(lambda: torch.nn.functional.linear(x, w), args.repeats)
            ours = median_ms(lambda: ours_op(x, w), args.repeats)
            results.append({"in": k, "out": n, "rows": m, "aten_ms": aten, "ours_ms": ours})
            print(f"{k:>5} x {n:<5} {m:>5} {aten:>9.3f} {ours:>9.3f} {ours / aten:>10.2f}")
    print(json.dumps({"cpu": cpu_name(), "threads": args.threads, "results": results}))


if __name__ == "__main__":
    main()
