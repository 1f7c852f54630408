"""What a LoRA adapter (`serve --lora`, Engine(lora=...)) costs a decode on this machine.

    python bench/lora.py --model DIR [--emb4 DIR] [--rank 16] [--new 48] [--rounds 3]
        [--streams 4] [--threads 0] [--int4-activation-bits 16] [--adapters DIR]
        [--llamacpp GGUF]

Writes two random adapters in PEFT's format for the checkpoint (every text layer's q/k/v/o and
gate/up/down projections at --rank, the linears' shapes read from its tensors) into --adapters
(a temporary directory when not given), loads the engine with both, and per round measures,
alternating so that the machine's drift falls on every measure alike:

- one stream's decode rate (Engine.decode, greedy, no stop ids) without an adapter, with one
  (scale 1) and with both (scales 1 and 0.5): the adapter's cost is its rate over plain's;
- the aggregate rate of --streams sequences decoded together (Batch.decode_many, wall time, short
  prompts included) all without adapters, all with the first, and half with each adapter (rows
  of one pass with different adapters);
- with --llamacpp (the same weights as GGUF, bench/gguf_export.py): llama.cpp's one-stream decode
  rate through node-llama-cpp without and with the first adapter (exported by
  gguf_export.export_lora, applied by llama.cpp's own adapter code).

Prints one JSON object with medians and every round's figures; docs/BENCHMARKS.md, "LoRA
adapters", has them.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

import torchtpu_cpp as tt

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import gguf_export  # noqa: E402

MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def linear_shapes(model_dir):
    """{module path: (out, in)} of the text layers' linears named in MODULES, from the checkpoint's
    tensors: `weight` of a dense linear, `weight_shape` of a pack-quantized one."""
    ckpt = gguf_export.Checkpoint(pathlib.Path(model_dir))
    shapes = {}
    for layer in range(ckpt.text["num_hidden_layers"]):
        for name in MODULES:
            module = f"{ckpt.prefix}layers.{layer}.{name}"
            if ckpt.has(module + ".weight_shape"):
                shapes[module] = tuple(int(v) for v in ckpt.get(module + ".weight_shape").tolist())
            elif ckpt.has(module + ".weight"):
                shapes[module] = tuple(ckpt.shape(module + ".weight"))
    return shapes


def write_adapter(out_dir, shapes, rank, seed):
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (out, inp) in shapes.items():
        key = "base_model.model." + module
        a = torch.randn(rank, inp, generator=g) / inp**0.5
        tensors[key + ".lora_A.weight"] = a.bfloat16()
        tensors[key + ".lora_B.weight"] = (torch.randn(out, rank, generator=g) * 0.01).bfloat16()
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": [m.split(".")[-1] for m in MODULES]}, f)
    return out_dir


def decode_rate(engine, prompt, new, lora):
    r = engine.decode(prompt, new, stop=(), lora=lora)
    return (len(r.tokens) - 1) / r.decode_s


def batch_rate(engine, prompts, new, loras):
    batch = engine.batch(rows=len(prompts))
    start = time.perf_counter()
    ids = [batch.submit(p, new, stop=(), lora=l) for p, l in zip(prompts, loras)]
    done = {}
    while len(done) < len(ids):
        for i in batch.step():
            done[i] = batch.result(i)
    seconds = time.perf_counter() - start
    return sum(len(r.tokens) for r in done.values()) / seconds


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} CPUs"
    return platform.machine()


def llamacpp_rate(gguf, new, threads, lora=None):
    """llama.cpp's one-stream decode rate (tok/s) after a 32-token prompt."""
    cmd = ["node", str(BENCH / "llamacpp_run.mjs"), "--model", gguf, "--bench", "--vocab",
           "262144", "--prompt-tokens", "32", "--new", str(new), "--repeats", "1",
           "--threads", str(threads)]
    if lora:
        cmd += ["--lora", lora]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["decode"][0]["median_tok_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--emb4")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--int4-activation-bits", type=int, default=16)
    p.add_argument("--adapters")
    p.add_argument("--llamacpp", help="the model as GGUF: llama.cpp's decode beside ours")
    args = p.parse_args()

    load_before = os.getloadavg()
    root = args.adapters or tempfile.mkdtemp(prefix="torchtpu-lora-bench-")
    shapes = linear_shapes(args.model)
    dirs = [write_adapter(os.path.join(root, f"a{i}"), shapes, args.rank, seed=i) for i in (1, 2)]
    adapter_bytes = os.path.getsize(os.path.join(dirs[0], "adapter_model.safetensors"))
    engine = tt.Engine(args.model, args.emb4, context=1024, threads=args.threads,
                       int4_activation_bits=args.int4_activation_bits, lora=dirs)
    prompt = [2] + [1000 + 7 * i for i in range(31)]
    prompts = [[2] + [1000 + 11 * i + s for i in range(31)] for s in range(args.streams)]
    one = {"none": {}, "one": {"a1": 1}, "two": {"a1": 1, "a2": 0.5}}
    half = [{"a1": 1} if s % 2 == 0 else {"a2": 1} for s in range(args.streams)]
    many = {"none": [{}] * args.streams, "one": [{"a1": 1}] * args.streams, "mixed": half}
    decode_rate(engine, prompt, 8, {"a1": 1})  # warm-up
    rounds = []
    lora_gguf = None
    if args.llamacpp:
        lora_gguf = str(gguf_export.export_lora(dirs[0], os.path.join(root, "a1.gguf")))
    threads = args.threads or os.cpu_count()
    for _ in range(args.rounds):
        r = {f"decode_{k}": decode_rate(engine, prompt, args.new, v) for k, v in one.items()}
        r.update({f"batch_{k}": batch_rate(engine, prompts, args.new, v) for k, v in many.items()})
        if args.llamacpp:
            r["llamacpp_none"] = llamacpp_rate(args.llamacpp, args.new, threads)
            r["llamacpp_one"] = llamacpp_rate(args.llamacpp, args.new, threads, lora_gguf)
        rounds.append(r)

    def median(key):
        return statistics.median(r[key] for r in rounds)

    out = {
        "machine": cpu_name(),
        "load_average_before": load_before,
        "rank": args.rank,
        "adapter_bytes": adapter_bytes,
        "streams": args.streams,
        "int4_activation_bits": args.int4_activation_bits,
        "medians": {k: median(k) for k in rounds[0]},
        "ratios": {
            "decode_one_over_none": median("decode_one") / median("decode_none"),
            "decode_two_over_none": median("decode_two") / median("decode_none"),
            "batch_one_over_none": median("batch_one") / median("batch_none"),
            "batch_mixed_over_none": median("batch_mixed") / median("batch_none"),
        },
        "rounds": rounds,
    }
    if args.llamacpp:
        out["ratios"]["llamacpp_one_over_none"] = median("llamacpp_one") / median("llamacpp_none")
        out["ratios"]["ours_over_llamacpp_with_adapter"] = (
            median("decode_one") / median("llamacpp_one")
        )
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))



if __name__ == "__main__":
    main()
