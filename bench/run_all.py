"""All the E2B benchmarks in one run, on one synthetic checkpoint, with a table at the end.

    python bench/run_all.py --cli build/torchtpu-cpp [--work /tmp/torchtpu-bench] [--repeats 3]
        [--skip compile,long] [--out bench/results] [--device cpu|cuda:N]

Makes (once; reused when present) the synthetic E2B checkpoint (make-tiny --preset e2b, bf16, with
the test tokenizer), its W4A16 form and int4 vocabulary twin (quantize --group 32 --emb4), and
GGUF exports in BF16 and Q4_0 (bench/gguf_export.py, the Q4_0 repacked from the same int4 values).
Then, one after another, in fresh processes: our engine (`torchtpu-cpp bench`) on bf16 and on
W4A16 weights, llama.cpp (bench/llamacpp_run.mjs) on BF16 and Q4_0, transformers eager and under
torch.compile (bench/hf_run.py), and the long-prompt check (bench/long_prompt.py). It also
measures the machine's memory read bandwidth, to give each row its "machine limit": the decode
rate at which reading the weights once per token would take all the bandwidth.

With --device other than the CPU, our engine and transformers run there, the read bandwidth is the
device's, and the CPU-only rows (llama.cpp, the long-prompt check) and the GGUF exports they need
are left out; without a GGUF there is no bytes-per-token figure, so no machine limit either.

Writes results-<date>.json and results-<date>.md into --out and prints the markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
REPO = BENCH.parent
PY = sys.executable
TOKENIZER = REPO / ".cache" / "gemma4-test-tokenizer"
GIB = 2**30


def log(*parts):
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def run_json(name, cmd, timeout):
    """Runs a driver that prints one JSON object last; returns it, or {"error": ...}."""
    log("run", name, " ".join(map(str, cmd))[:200])
    load_before = os.getloadavg()[0]
    begin = time.time()
    try:
        proc = subprocess.run(
            list(map(str, cmd)),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        log(name, "timed out after", timeout, "s")
        return {"error": f"timed out after {timeout} s"}
    wall = time.time() - begin
    if proc.returncode != 0:
        log(name, "failed:", proc.stderr[-1500:])
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"no JSON on the last line of stdout: {proc.stdout[-300:]!r}"}
    out["wall_s"] = wall
    out["load_average"] = [load_before, os.getloadavg()[0]]
    log(name, f"done in {wall:.0f} s")
    return out


def machine(device: str):
    info = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    info["device"] = device
    if device.startswith("cuda"):
        import torch

        info["device_name"] = torch.cuda.get_device_name(device)
    lscpu = subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=False
    ).stdout
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Flags"):
            info[key.strip()] = value.strip()
    flags = info.pop("Flags", "").split()
    info["amx"] = [f for f in flags if f.startswith("amx")]
    info["avx512"] = "avx512f" in flags
    info["cores"] = os.cpu_count()
    with open("/proc/meminfo") as f:
        info["memory_gib"] = int(f.readline().split()[1]) / 2**20
    info["kernel"] = platform.release()
    info["load_average_start"] = os.getloadavg()
    return info


def read_bandwidth(threads: int, device: str, gib: float = 2.0, repeats: int = 7):
    """Bytes per second torch reads when summing a float32 tensor far larger than the caches,
    on `device` (on the CPU with the benchmark's thread count); the median of `repeats`
    passes."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * GIB) // 4, dtype=torch.float32, device=device)

    def total():
        x.sum()
        if x.device.type != "cpu":
            torch.accelerator.synchronize(x.device)

    total()
    rates = []
    for _ in range(repeats):
        begin = time.perf_counter()
        total()
        rates.append(x.numel() * 4 / (time.perf_counter() - begin))
    return {
        "median_bytes_s": statistics.median(rates),
        "passes_bytes_s": rates,
        "threads": threads,
        "device": device,
    }


def bytes_per_token(gguf_path: pathlib.Path):
    """Weight bytes one decode step reads: every matrix except the two lookup tables (token_embd
    rows are gathered, per_layer_token_embd too), plus the output head, which is token_embd when
    the model has no `output` tensor (tied)."""
    from gguf import GGUFReader

    # In a child process: the reader maps the file and would leave its pages in this process's
    # resident set (and, through fork, in every engine's ru_maxrss).
    code = (
        "import json, sys; from gguf import GGUFReader;"
        "print(json.dumps({t.name: int(t.n_bytes) for t in GGUFReader(sys.argv[1]).tensors}))"
    )
    tensors = json.loads(
        subprocess.run(
            [PY, "-c", code, str(gguf_path)], check=True, capture_output=True, text=True
        ).stdout
    )
    total = sum(
        n
        for name, n in tensors.items()
        if name not in ("token_embd.weight", "per_layer_token_embd.weight")
    )
    if "output.weight" not in tensors:
        total += tensors["token_embd.weight"]
    return total


def prepare(cli, work: pathlib.Path, ggufs_too: bool = True):
    work.mkdir(parents=True, exist_ok=True)
    dense, w4, emb4 = work / "e2b", work / "e2b-w4", work / "e2b-emb4"
    if not (dense / "config.json").exists():
        log("make-tiny e2b ->", dense)
        subprocess.run(
            [
                cli,
                "make-tiny",
                dense,
                "--preset",
                "e2b",
                "--seed",
                "0",
                "--prefix",
                "model.",
                # The benchmark reads token ids; the tokenizer only makes the checkpoint whole,
                # and a machine that runs the built engine alone (a lent GPU) may not have it.
                *(["--tokenizer", TOKENIZER] if TOKENIZER.is_dir() else []),
            ],
            check=True,
        )
    if not (w4 / "config.json").exists():
        log("quantize ->", w4, emb4)
        subprocess.run(
            [cli, "quantize", dense, w4, "--group", "32", "--emb4", emb4], check=True
        )
    if not ggufs_too:
        return dense, w4, emb4, {}
    sys.path.insert(0, str(BENCH))
    import gguf_export

    ggufs = {"bf16": work / "e2b-bf16.gguf", "q4_0": work / "e2b-q4_0.gguf"}
    if not ggufs["bf16"].exists():
        log("gguf bf16 ->", ggufs["bf16"])
        gguf_export.export(dense, ggufs["bf16"], "bf16")
    if not ggufs["q4_0"].exists():
        log("gguf q4_0 ->", ggufs["q4_0"])
        gguf_export.export(dense, ggufs["q4_0"], "q4_0", w4, emb4)
    return dense, w4, emb4, ggufs


def pick(result, key, length=None, read_every=None):
    if "error" in result:
        return None
    if key == "read":
        rows = [r for r in result["prompt_read"] if r["prompt_tokens"] == length]
        return rows[0]["median_tok_s"] if rows else None
    if key == "decode":
        rows = [r for r in result["decode"] if r["read_every"] == read_every]
        return rows[0]["median_tok_s"] if rows else None
    return result.get(key)


def fmt(value, digits=1):
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(results, info, bandwidth, limits, lengths):
    where = info.get("device", "cpu")
    rows = ROWS
    if where != "cpu":
        rows = {**ROWS, **OFF_CPU_ROWS}
        where = f"{where} ({info.get('device_name', '?')}) beside "
    else:
        where = ""
    lines = [
        f"Run {info['date']} on {where}{info.get('Model name', '?')}, {info['cores']} cores"
        f" ({', '.join(info['amx']) or 'no AMX'}), {info['memory_gib']:.1f} GiB;"
        f" load average {info['load_average_start'][0]:.1f} at the start,"
        f" {info['load_average_end'][0]:.1f} at the end (a shared machine: medians of"
        f" {info['repeats']} runs, and ratios from the same run)."
        f" Read bandwidth {bandwidth['median_bytes_s'] / 1e9:.1f} GB/s"
        f" ({bandwidth.get('device', 'cpu')}, {bandwidth['threads']} CPU threads,"
        f" torch sum over 2 GiB).",
        "",
        "| engine | weights | load s | first call s | read tok/s 512 | read tok/s 4096 |"
        " decode tok/s streamed | decode tok/s batched (8) | peak RSS GiB |"
        " machine limit tok/s | decode ÷ limit | load average (start → end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (label, weights, limit_key) in rows.items():
        r = results.get(name)
        if r is None:
            continue
        limit = limits.get(limit_key)
        streamed = pick(r, "decode", read_every=1)
        batched = pick(r, "decode", read_every=8)
        if "error" in r:
            lines.append(f"| {label} | {weights} | failed: {r['error'][:80]} |||||||||")
            continue
        lines.append(
            f"| {label} | {weights} | {fmt(r['load_s'])} | {fmt(r['first_call_s'])} |"
            f" {fmt(pick(r, 'read', 512))} | {fmt(pick(r, 'read', 4096))} | {fmt(streamed, 2)} |"
            f" {fmt(batched, 2)} | {fmt(r['peak_rss_bytes'] / GIB, 2)} | {fmt(limit, 1)} |"
            f" {fmt(streamed / limit if streamed and limit else None, 2)} |"
            f" {r['load_average'][0]:.1f} → {r['load_average'][1]:.1f} |"
        )
    base = results.get("ours-bf16", {})
    if base and "error" not in base:
        lines += [
            "",
            "Ratios, ours (bf16) ÷ peer: above 1 means ours is faster or smaller.",
            "",
            "| peer | decode streamed | read 512 | read 4096 | load s (peer ÷ ours) |"
            " peak RSS (peer ÷ ours) |",
            "|---|---|---|---|---|---|",
        ]
        for name, (label, weights, _) in rows.items():
            r = results.get(name)
            if name == "ours-bf16" or r is None or "error" in r:
                continue

            def ratio(a, b):
                return None if not a or not b else a / b

            lines.append(
                f"| {label} ({weights}) |"
                f" {fmt(ratio(pick(base, 'decode', read_every=1), pick(r, 'decode', read_every=1)), 2)} |"
                f" {fmt(ratio(pick(base, 'read', 512), pick(r, 'read', 512)), 2)} |"
                f" {fmt(ratio(pick(base, 'read', 4096), pick(r, 'read', 4096)), 2)} |"
                f" {fmt(ratio(r['load_s'], base['load_s']), 2)} |"
                f" {fmt(ratio(r['peak_rss_bytes'], base['peak_rss_bytes']), 2)} |"
            )
    packed, q4_0 = results.get("ours-w4a16", {}), results.get("llamacpp-q4_0", {})
    if packed and q4_0 and "error" not in packed and "error" not in q4_0:
        lines += [
            "",
            "Ours from packed int4 (W4A16 + int4 tables) ÷ llama.cpp Q4_0, the same int4 values:"
            " above 1 means ours is faster or smaller.",
            "",
            "| decode streamed | read 512 | read 4096 | load s (peer ÷ ours) |"
            " peak RSS (peer ÷ ours) |",
            "|---|---|---|---|---|",
            f"| {fmt(pick(packed, 'decode', read_every=1) / pick(q4_0, 'decode', read_every=1), 2)} |"
            f" {fmt(pick(packed, 'read', 512) / pick(q4_0, 'read', 512), 2)} |"
            f" {fmt(pick(packed, 'read', 4096) / pick(q4_0, 'read', 4096), 2)} |"
            f" {fmt(q4_0['load_s'] / packed['load_s'], 2)} |"
            f" {fmt(q4_0['peak_rss_bytes'] / packed['peak_rss_bytes'], 2)} |",
        ]
    long = results.get("long")
    if long and "error" not in long:
        lines += [
            "",
            f"Long prompts (ours, bf16, context {long['context']}; synthetic weights, so the"
            " answers are noise and only the speeds count):",
            "",
            "| prompt tokens | records | read s | read tok/s | decode tok/s | answer | found |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in long["prompts"]:
            answer = p["answer"].replace("|", "\\|").replace("\n", " ")[:40]
            lines.append(
                f"| {p['prompt_tokens']} | {p['records']} | {p['read_s']:.1f} |"
                f" {p['read_tok_s']:.1f} | {p['decode_tok_s']:.2f} | `{answer}` |"
                f" {'yes' if p['found'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


# name -> (engine label, weights label, which bytes-per-token figure bounds it). Our int4 rows read
# the same bytes per token as Q4_0 (0.5625 B per weight: group 32 with 16-bit scales).
ROWS = {
    "ours-bf16": ("torchtpu-cpp", "bf16", "bf16"),
    "ours-w4a16": ("torchtpu-cpp", "W4A16 + int4 tables, packed (int4_linear)", "q4_0"),
    "ours-bf16-q4": ("torchtpu-cpp", "bf16 file, --quantize int4 at load", "q4_0"),
    "ours-w4a16-dequantized": (
        "torchtpu-cpp",
        "W4A16 + int4 tables, dequantized at load",
        "bf16",
    ),
    "ours-bf16-emb4": ("torchtpu-cpp", "bf16 linears + int4 tables", "bf16"),
    "llamacpp-bf16": ("llama.cpp", "BF16", "bf16"),
    "llamacpp-q4_0": ("llama.cpp", "Q4_0 (same int4 values)", "q4_0"),
    "hf-eager": ("transformers eager", "bf16", "bf16"),
    "hf-compile": ("transformers torch.compile", "bf16", "bf16"),
}


# Off the CPU, `--int4 auto` expands int4 linears and the head on the device at load (the packed
# kernel is the CPU's); the int4 tables stay packed there and are looked up row by row.
OFF_CPU_ROWS = {
    "ours-w4a16": (
        "torchtpu-cpp",
        "W4A16 + int4 tables, linears dequantized on the device",
        "bf16",
    ),
}

# The drivers that run on the CPU whatever --device says: node-llama-cpp's prebuilt CPU llama.cpp
# and bench/long_prompt.py.
LLAMA_ROWS = {"llamacpp-bf16", "llamacpp-q4_0"}
CPU_ONLY = LLAMA_ROWS | {"long"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", required=True, type=pathlib.Path)
    parser.add_argument(
        "--work", type=pathlib.Path, default=pathlib.Path("/tmp/torchtpu-bench")
    )
    parser.add_argument("--out", type=pathlib.Path, default=BENCH / "results")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--prompt-tokens", default="19,512,4096")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument(
        "--skip", default="", help="comma list of: " + ",".join(ROWS) + ",long"
    )
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per engine")
    parser.add_argument(
        "--device", default="cpu", help="cpu | cuda[:N]: where ours and transformers run"
    )
    parser.add_argument(
        "--render", type=pathlib.Path, help="only print the tables of a results JSON"
    )
    args = parser.parse_args(argv)
    if args.render:
        report = json.loads(args.render.read_text())
        info = report["machine"]
        lengths = [int(x) for x in args.prompt_tokens.split(",")]
        print(
            markdown(
                report["results"],
                info,
                report["bandwidth"],
                report["machine_limit_tok_s"],
                lengths,
            )
        )
        return 0
    skip = set(filter(None, args.skip.split(",")))
    if args.device != "cpu":
        skip |= CPU_ONLY
        log("on", args.device, "leaving out the CPU-only rows:", ",".join(sorted(CPU_ONLY)))
    cli = str(args.cli.resolve())

    info = machine(args.device)
    info["repeats"] = args.repeats
    dense, w4, emb4, ggufs = prepare(cli, args.work, ggufs_too=not LLAMA_ROWS <= skip)
    log("measuring read bandwidth")
    bandwidth = read_bandwidth(args.threads, args.device)
    per_token = {kind: bytes_per_token(path) for kind, path in ggufs.items()}
    limits = {kind: bandwidth["median_bytes_s"] / n for kind, n in per_token.items()}

    common = [
        "--prompt-tokens",
        args.prompt_tokens,
        "--new",
        args.new,
        "--repeats",
        args.repeats,
    ]
    ours = [
        cli,
        "bench",
        "--device",
        args.device,
        "--context",
        args.context,
        "--read-every",
        "1,8",
        "--json",
        *common,
    ]
    node = shutil.which("node") or "node"
    llama = [
        node,
        BENCH / "llamacpp_run.mjs",
        "--bench",
        "--vocab",
        262144,
        "--threads",
        args.threads,
        "--context",
        args.context,
        *common,
    ]
    hf = [
        PY,
        BENCH / "hf_run.py",
        "--model",
        dense,
        "--context",
        args.context,
        "--device",
        args.device,
        *common,
    ]
    # Most telling first, the slowest (torch.compile's compile) last.
    commands = {
        "ours-bf16": [*ours, "--model", dense],
        # Made only where a llama.cpp row runs (prepare): no GGUF, no llama.cpp rows.
        **{f"llamacpp-{kind}": [*llama, "--model", path] for kind, path in ggufs.items()},
        "ours-w4a16": [*ours, "--model", w4, "--emb4", emb4],
        "ours-bf16-q4": [*ours, "--model", dense, "--quantize", "int4"],
        "ours-w4a16-dequantized": [
            *ours,
            "--model",
            w4,
            "--emb4",
            emb4,
            "--int4",
            "dequantized",
        ],
        "ours-bf16-emb4": [*ours, "--model", dense, "--emb4", emb4],
        "hf-eager": [*hf, "--mode", "eager"],
        "long": [
            PY,
            BENCH / "long_prompt.py",
            "--cli",
            cli,
            "--model",
            dense,
            "--context",
            33024,
        ],
        "hf-compile": [*hf, "--mode", "compile"],
    }
    results = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, cmd in commands.items():
        if name not in skip:
            results[name] = run_json(name, cmd, args.timeout)
            # Kept as it comes: a later failure or interruption loses nothing measured.
            (args.out / "partial.json").write_text(json.dumps(results, indent=1))
    info["load_average_end"] = os.getloadavg()

    report = {
        "machine": info,
        "bandwidth": bandwidth,
        "bytes_per_decode_token": per_token,
        "machine_limit_tok_s": limits,
        "results": results,
    }
    lengths = [int(x) for x in args.prompt_tokens.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = info["date"][:16].replace(":", "")
    # The measurements are kept before the tables are made: a table's bug loses nothing.
    (args.out / f"results-{stamp}.json").write_text(json.dumps(report, indent=1))
    (args.out / "partial.json").unlink(missing_ok=True)
    table = markdown(results, info, bandwidth, limits, lengths)
    (args.out / f"results-{stamp}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
