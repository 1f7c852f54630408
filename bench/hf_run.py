"""Hugging Face transformers as the peer: the same measurements and prompt ids as
`torchtpu-cpp bench`, with `generate` (greedy, EOS ignored) eagerly or under torch.compile.

    python bench/hf_run.py --model DIR [--mode eager|compile] [--prompt-tokens 19,512,4096]
        [--new 64] [--repeats 3] [--seed 0] [--context 8192] [--device cpu|cuda:N]

Prints one JSON object. A multimodal-layout checkpoint (model.language_model.*) loads into
Gemma4ForCausalLM from its text config, with the prefix mapped. `compile` uses a static cache, on
which transformers compiles the decode step (CompileConfig, all devices allowed, mode "default");
prompts are read uncompiled, as transformers does. Timings come from a streamer: the prompt is
read when the first new token arrives, decoding is the time after that; on an accelerator each
timestamp waits for the device first, so that it is the time the token exists, not when its work
was queued.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
from transformers import CompileConfig, Gemma4ForCausalLM, Gemma4TextConfig
from transformers.generation.streamers import BaseStreamer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from prompts import bench_prompt


class Clock(BaseStreamer):
    """Timestamps of each batch of tokens `generate` produces (the first put is the prompt)."""

    def __init__(self, device: torch.device):
        self.times = []
        self.device = device

    def put(self, value):
        if self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self):
        pass


def load(model_dir: pathlib.Path):
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") == "gemma4":
        text = Gemma4TextConfig(**config["text_config"])
        return Gemma4ForCausalLM.from_pretrained(
            model_dir,
            config=text,
            dtype=torch.bfloat16,
            key_mapping={r"^model\.language_model\.": "model."},
        )
    return Gemma4ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)


def peak_resident_bytes():
    """VmHWM of this process. Not getrusage's ru_maxrss: that survives fork + exec, so a child of a
    big parent would report the parent's peak."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def rates(values):
    return {
        "tok_s": values,
        "median_tok_s": statistics.median(values),
        "min_tok_s": min(values),
        "max_tok_s": max(values),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=pathlib.Path)
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--prompt-tokens", default="19,512,4096")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.prompt_tokens.split(",")]
    device = torch.device(args.device)

    start = time.perf_counter()
    model = load(args.model).to(device).eval()
    load_s = time.perf_counter() - start
    vocab = model.config.vocab_size

    extra = {}
    if args.mode == "compile":
        compile_config = CompileConfig(mode="default")
        compile_config._compile_all_devices = True
        extra = {"cache_implementation": "static", "compile_config": compile_config}

    @torch.inference_mode()
    def decode(prompt, count):
        clock = Clock(device)
        ids = torch.tensor([prompt], device=device)
        begin = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=count,
            min_new_tokens=count,
            do_sample=False,
            streamer=clock,
            max_length=None,
            **({"max_cache_len": args.context} if args.mode == "compile" else {}),
            **extra,
        )
        tokens = out[0, len(prompt) :].tolist()
        read_s = clock.times[1] - begin
        return tokens, read_s, clock.times[-1] - clock.times[1]

    short = bench_prompt(args.seed, lengths[0], vocab)
    start = time.perf_counter()
    _, first_read, first_decode = decode(short, args.new)
    result = {
        "peer": f"transformers ({args.mode})",
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "model": str(args.model),
        "load_s": load_s,
        "first_call_s": time.perf_counter() - start,
        "first_call": {"read_s": first_read, "decode_s": first_decode},
        "prompt_read": [],
    }
    for length in lengths:
        prompt = bench_prompt(args.seed, length, vocab)
        read = [decode(prompt, 1)[1] for _ in range(args.repeats)]
        result["prompt_read"].append(
            {
                "prompt_tokens": length,
                "read_s": read,
                "first_ids": prompt[:4],
                **rates([length / s for s in read]),
            }
        )
    decode_s, tokens = [], []
    for _ in range(args.repeats):
        tokens, _, seconds = decode(short, args.new)
        decode_s.append(seconds)
    result["decode"] = [
        {
            "read_every": 1,
            "decode_s": decode_s,
            **rates([(args.new - 1) / s for s in decode_s]),
        }
    ]
    result["tokens"] = tokens
    result["new"] = args.new
    result["repeats"] = args.repeats
    result["peak_rss_bytes"] = peak_resident_bytes()
    if device.type == "cuda":
        result["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
