"""Prompts the benchmarks share: the random ids of `torchtpu-cpp bench` (bench_prompt in
src/cli/bench_command.cpp, benchPrompt in bench/llamacpp_run.mjs) and the long-prompt check's
numbered records."""

from __future__ import annotations

import random

MASK = (1 << 64) - 1


def bench_prompt(seed: int, length: int, vocab: int) -> list[int]:
    """`length` ids in [0, vocab): SplitMix64 seeded with seed * 2^32 + length, modulo vocab."""
    state = ((seed << 32) + length) & MASK
    ids = []
    for _ in range(length):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        ids.append(z % vocab)
    return ids


def records_prompt(count: int, seed: int = 0) -> tuple[str, int, str]:
    """The seeds' long-prompt check: `count` numbered records, each with a random six-digit code,
    and a question about one of them. Returns (prompt text, asked record, its code)."""
    rng = random.Random(seed)
    codes = [f"{rng.randrange(10**6):06d}" for _ in range(count)]
    asked = rng.randrange(count)
    lines = [f"Record {i + 1}: the code is {code}." for i, code in enumerate(codes)]
    question = f"\nWhat is the code of record {asked + 1}? Answer with the six digits only."
    return "\n".join(lines) + question, asked + 1, codes[asked]
