"""What scoring a prompt costs beside reading it: /v1/completions with echo and logprobs (the
prompt's logits at every position through the head, in chunks of 64) against the same prompt read
for its next token alone (max_tokens 1), through `torchtpu-cpp serve`. Every request has a text of
its own, so no prefix-cache state serves it.

    python bench/score_prompt.py --model DIR [--emb4 DIR] [--lengths 512,2048] [--rounds 3]
        [--context 8192] [--cli build/torchtpu-cpp]

Prints one JSON object: per prompt length, each round's seconds for a plain read, an echoed and
scored read (logprobs 1, max_tokens 1, as lm-evaluation-harness asks) and vLLM's prompt_logprobs
1, their medians and the scored/plain ratio. docs/BENCHMARKS.md, "Scoring prompts", has the
figures.
"""

import argparse
import json
import os
import statistics
import tempfile

from slot_restore import Server, completion

MODES = {
    "plain": {},
    "echo_logprobs": {"echo": True, "logprobs": 1},
    "prompt_logprobs": {"prompt_logprobs": 1},
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--emb4", default="")
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--cli", default="build/torchtpu-cpp")
    args = p.parse_args()
    server = Server(args, tempfile.mkdtemp(prefix="score-prompt-bench-"))
    out = {"load_average": os.getloadavg()[0], "lengths": {}}
    try:
        for length in map(int, args.lengths.split(",")):
            seconds = {mode: [] for mode in MODES}
            tokens = 0
            for index in range(args.rounds):
                for mode, extra in MODES.items():
                    # About `length` tokens of a text no other request starts with.
                    text = f"{mode} {length} {index}." + " Rain falls on the town." * (length // 6)
                    took, answer = completion(server.url, text, 1, **extra)
                    seconds[mode].append(round(took, 3))
                    tokens = answer["usage"]["prompt_tokens"]
            medians = {mode: statistics.median(s) for mode, s in seconds.items()}
            out["lengths"][length] = {
                "prompt_tokens": tokens,
                "seconds": seconds,
                "median_s": medians,
                "echo_over_plain": round(medians["echo_logprobs"] / medians["plain"], 3),
                "prompt_logprobs_over_plain": round(
                    medians["prompt_logprobs"] / medians["plain"], 3
                ),
                "scored_tokens_per_s": round(tokens / medians["echo_logprobs"], 1),
            }
    finally:
        server.stop()
    out["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
