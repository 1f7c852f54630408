"""The seeds' long-prompt check over `torchtpu-cpp generate`: numbered records, each with a random
code, then a question about one record, as a chat turn, at about 60, 4,000 and 32,000 tokens.

    python bench/long_prompt.py --cli build/torchtpu-cpp --model DIR [--emb4 DIR]
        [--targets 60,4000,32000] [--context 33024] [--new 16]

The checkpoint needs tokenizer.json and a chat template (make-tiny --tokenizer DIR). On synthetic
weights the answer is noise and only the speeds mean something; on real weights `found` checks
recall. Prints one JSON object: per prompt, tokens, read s, read tok/s, decode tok/s, answer, found.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from tokenizers import Tokenizer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from prompts import records_prompt


def records_for(tokenizer: Tokenizer, target: int, seed: int) -> int:
    """The record count whose prompt comes closest to `target` tokens (the chat turn's own
    dozen tokens come on top)."""
    per_record = len(tokenizer.encode(records_prompt(100, seed)[0]).ids) / 100
    count = max(1, round(target / per_record))
    for _ in range(4):
        length = len(tokenizer.encode(records_prompt(count, seed)[0]).ids)
        count = max(1, count + round((target - length) / per_record))
    return count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--emb4")
    parser.add_argument("--targets", default="60,4000,32000")
    parser.add_argument("--context", type=int, default=33024)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tokenizer = Tokenizer.from_file(str(pathlib.Path(args.model) / "tokenizer.json"))
    rows = []
    for target in (int(t) for t in args.targets.split(",")):
        count = records_for(tokenizer, target, args.seed)
        text, record, code = records_prompt(count, args.seed)
        cmd = [args.cli, "generate", "--model", args.model, "--prompt", text, "--chat"]
        cmd += ["--max-new", str(args.new), "--ignore-eos", "--json", "--dtype", args.dtype]
        cmd += ["--context", str(args.context)]
        if args.emb4:
            cmd += ["--emb4", args.emb4]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"generate failed ({proc.returncode}): {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout)
        tokens = out["prompt_tokens"]
        rows.append(
            {
                "records": count,
                "asked": record,
                "code": code,
                "prompt_tokens": tokens,
                "read_s": out["read_s"],
                "read_tok_s": tokens / out["read_s"],
                "decode_tok_s": (len(out["tokens"]) - 1) / out["decode_s"],
                "answer": out.get("text", ""),
                "found": code in out.get("text", ""),
                "peak_rss_bytes": out["peak_rss_bytes"],
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"context": args.context, "dtype": args.dtype, "prompts": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
