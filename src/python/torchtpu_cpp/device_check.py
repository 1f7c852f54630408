"""The stand-in device's checks, run on any device: `python -m torchtpu_cpp.device_check --device
tpu --import torch_tpu` on a TPU VM (the rig's smoke stage), `--library LIB --device standin` in
the tests.

On a tiny float32 checkpoint written on the spot (torchtpu_cpp.make_tiny) it checks what the
engine promises a device (docs/ARCHITECTURE.md, "The TorchTPU path on a stand-in device"):

- tokens: greedy float32 tokens on the device equal the CPU's;
- host reads: a steady decode reads the host once per read_every window, prompt reading once per
  chunk at most;
- programs: every steady decode step dispatches the same ops with the same shapes, dtypes and
  constants (one program for a compiling device), a window of read_every steps is that step
  read_every times plus one device->host copy, and nothing goes up from the host in a greedy step.

The ops are seen through a TorchDispatchMode: the engine's C++ calls into ATen pass the
dispatcher's Python key on the calling thread, whatever the device, so this needs no help from the
backend. Prints one line per check and exits 1 when any fails; --json prints the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchtpu_cpp

MARK = "|"  # cuts the record where on_tokens ran: after each batch read back


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type != "cpu" else "@cpu"
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}{where}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    return repr(value)


def _device_of(value) -> str | None:
    return value.device.type if isinstance(value, torch.Tensor) else None


def _direction(source: str | None, target: str | None) -> str | None:
    """ "read" for a copy to the host from elsewhere, "upload" for the reverse, else None."""
    if source == target:
        return None
    return "read" if target == "cpu" else ("upload" if source == "cpu" else None)


def _transfer(func, args, kwargs) -> str | None:
    """ "read" for a device->host copy or scalar read, "upload" for host->device, else None."""
    name = func._schema.name
    if name == "aten::_local_scalar_dense":
        return "read" if _device_of(args[0]) != "cpu" else None
    if name in ("aten::_to_copy", "aten::to"):
        source = _device_of(args[0])
        target = kwargs.get("device")
        target = next((a for a in args[1:] if isinstance(a, torch.device)), target)
        return _direction(
            source, torch.device(target).type if target is not None else source
        )
    if name in ("aten::copy_", "aten::_copy_from"):
        return _direction(_device_of(args[1]), _device_of(args[0]))
    return None


class Recorder(TorchDispatchMode):
    """Every op as "name(args)"; device->host and host->device copies prefixed "read " / "upload
    "; MARK where mark() was called."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def mark(self):
        self.lines.append(MARK)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _transfer(func, args, kwargs)
        described = ", ".join(
            [_describe(a) for a in args]
            + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
        )
        self.lines.append(f"{kind + ' ' if kind else ''}{func}({described})")
        return func(*args, **kwargs)


def split(lines: list[str]) -> list[list[str]]:
    """The record cut at each MARK."""
    parts: list[list[str]] = [[]]
    for line in lines:
        if line == MARK:
            parts.append([])
        else:
            parts[-1].append(line)
    return parts


def count(part: list[str], kind: str) -> int:
    return sum(line.startswith(kind + " ") for line in part)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    figures: dict = field(default_factory=dict)


def check_reads(batches: list[list[str]], chunks: int, read_every: int) -> Check:
    """batches: the record cut at on_tokens, from a decode of a prompt read in `chunks` chunks
    with read_every > 1: the first part holds the prompt and first token, each later full part a
    window, the last part what followed the final batch."""
    reads = [count(b, "read") for b in batches]
    windows = reads[1:-1]
    ok = (
        len(windows) >= 2
        and reads[0] <= chunks + 1
        and all(r == 1 for r in windows)
        and reads[-1] == 0
    )
    return Check(
        "host reads",
        ok,
        f"prompt ({chunks} chunks) + first token: {reads[0]}, then per window of {read_every}: "
        f"{sorted(set(windows))}, after the last: {reads[-1]}",
        {"prompt_reads": reads[0], "reads_per_window": windows},
    )


def check_programs(
    steps: list[list[str]], windows: list[list[str]], read_every: int
) -> Check:
    """steps: steady steps of read_every=1 decodes (each ends with its read); windows: full
    windows of a read_every decode. One program: every step without its read is the same, and
    every window without its one read is one step's ops read_every times, the same in each."""
    programs = {
        tuple(line for line in s if not line.startswith("read ")) for s in steps
    }
    uploads = sum(count(s, "upload") for s in steps)
    unread = [[line for line in w if not line.startswith("read ")] for w in windows]
    step_of = [w[: len(w) // read_every] for w in unread]
    windows_ok = (
        bool(windows)
        and all(count(w, "read") == 1 for w in windows)
        and all(w == s * read_every for w, s in zip(unread, step_of))
        and len({tuple(s) for s in step_of}) == 1
    )
    ops = len(next(iter(programs))) if programs else 0
    ok = len(programs) == 1 and ops > 0 and uploads == 0 and windows_ok
    return Check(
        "programs",
        ok,
        f"{len(programs)} distinct step program(s) over {len(steps)} steps ({ops} ops each), "
        f"{uploads} host->device copies in greedy steps; {len(windows)} windows of {read_every} "
        f"{'are' if windows_ok else 'are NOT'} one step {read_every} times plus one read",
        {"distinct_programs": len(programs), "steps": len(steps), "ops_per_step": ops},
    )


def recorded_decode(engine, ids, max_new, read_every):
    """The ops of a greedy decode, cut where on_tokens ran (split)."""
    recorder = Recorder()

    def on_tokens(_batch):
        recorder.mark()
        return True  # go on

    with recorder:
        engine.decode(ids, max_new, stop=(), read_every=read_every, on_tokens=on_tokens)
    return split(recorder.lines)


def run(device: str, work: str, chunk: int = 16) -> list[Check]:
    torchtpu_cpp.make_tiny(work, preset="tiny", seed=5, dtype="f32")
    vocab = 512
    prompts = [[2], [2, 17, 33, 4, 9], [2] + [(7 * i + 3) % vocab for i in range(39)]]
    cpu = torchtpu_cpp.Engine(work, device="cpu", dtype="float32", context=512)
    engine = torchtpu_cpp.Engine(
        work, device=device, dtype="float32", context=512, prefill_chunk=chunk
    )
    checks = []

    mismatched = []
    for ids in prompts:
        want = cpu.generate(ids, 24)[0]
        got = engine.generate(ids, 24, read_every=8)[0]
        if got != want:
            mismatched.append({"prompt_tokens": len(ids), "cpu": want, device: got})
    checks.append(
        Check(
            "tokens",
            not mismatched,
            f"float32 greedy tokens equal the CPU's on {len(prompts) - len(mismatched)} of "
            f"{len(prompts)} prompts (24 tokens each)",
            {"mismatched": mismatched},
        )
    )

    if torch.device(device).type == "cpu":
        # The CPU is the host, and its step reads only the filled ring slots (shapes that grow).
        for name in ("host reads", "programs"):
            checks.append(
                Check(name, True, "not meaningful on the cpu itself (skipped)")
            )
        return checks

    batches = recorded_decode(engine, prompts[2], 65, 8)
    checks.append(check_reads(batches, -(-len(prompts[2]) // chunk), 8))
    # 256 tokens from position 4: the tiny preset's 8-slot sliding rings wrap 32 times.
    steps = recorded_decode(engine, [2, 5, 6, 7], 256, 1)[1:-1]
    # A new request on the same engine, with another prompt length: the same program.
    steps += recorded_decode(engine, prompts[2], 20, 1)[1:-1]
    windows = recorded_decode(engine, [2, 5, 6, 7, 8, 9], 65, 8)[
        1:-1
    ]  # 8 full windows
    checks.append(check_programs(steps, windows, 8))
    return checks


def load_backend(path: str) -> None:
    """Loads a shared library that registers a device as PrivateUse1 (the tests' stand-in), and
    gives torch's Python side the torch.<name> module it looks up when a tensor is made there."""
    ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
    backend = torch._C._get_privateuse1_backend_name()
    if not hasattr(torch, backend):
        torch._register_device_module(backend, types.ModuleType(backend))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchtpu_cpp.device_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--device", required=True, help="tpu, cuda:0, cpu, or a registered name"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="a module that registers the device first (torch_tpu)",
    )
    parser.add_argument(
        "--library",
        action="append",
        default=[],
        help="a shared library that registers the device as PrivateUse1 (the tests' stand-in)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    for name in args.imports:
        importlib.import_module(name)
    for path in args.library:
        load_backend(path)
    with tempfile.TemporaryDirectory(prefix="torchtpu-device-check-") as work:
        checks = run(args.device, work)
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
    if args.json:
        print(json.dumps({c.name: {"ok": c.ok, **c.figures} for c in checks}))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
