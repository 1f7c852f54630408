"""Image- and audio-to-first-token on E2B shapes (issue #19): torchtpu-cpp against transformers'
Gemma4ForConditionalGeneration on the same random weights, and memory with and without towers.

    python bench/media_first_token.py --work /tmp/torchtpu-bench [--repeats 3] [--threads 2]
        [--image-tokens 280] [--clip-seconds 30] [--skip hf]

WORK/e2b is the bf16 text checkpoint of the side-by-side run (bench/run_all.py writes it).
WORK/e2b-mm is made from it once: its files linked, not copied, plus vision and audio towers
with random bf16 weights in the published geometry (transformers' Gemma4VisionConfig and
Gemma4AudioConfig defaults) in a shard of their own. Each measurement runs in a process of its
own, so that its peak RSS is its own. Timed: from the encoded JPEG or WAV bytes to the first
generated token (decoding, preprocessing, the tower, reading the prompt, one step), for the chat
prompt "<media> Describe this." rendered by each engine's own template code; the two engines'
prompt ids are compared. Prints a Markdown table and one JSON object per row.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time
import wave

import numpy as np

TEXT = "Describe this."
# The text checkpoint holds model.* names; transformers' multimodal class wants the text model's
# under model.language_model.
KEY_MAPPING = {
    r"^model\.(?!vision_tower|audio_tower|embed_vision|embed_audio|language_model)": (
        "model.language_model."
    )
}


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 2**20


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def make_multimodal(work: pathlib.Path) -> pathlib.Path:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, Gemma4AudioConfig, Gemma4Config, Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder

    text_dir, out = work / "e2b", work / "e2b-mm"
    if (out / "config.json").exists():
        return out
    if not (text_dir / "config.json").exists():
        sys.exit(f"{text_dir} missing: run bench/run_all.py first, which writes it")
    out.mkdir(exist_ok=True)
    for f in text_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors.index.json"):
            (out / f.name).unlink(missing_ok=True)
            (out / f.name).symlink_to(f.resolve())
    text = json.loads((text_dir / "config.json").read_text())
    config = Gemma4Config(
        text_config=text,
        vision_config=Gemma4VisionConfig().to_dict(),
        audio_config=Gemma4AudioConfig().to_dict(),
    )
    torch.manual_seed(0)
    towers = {
        "model.vision_tower.": AutoModel.from_config(config.vision_config),
        "model.audio_tower.": AutoModel.from_config(config.audio_config),
        "model.embed_vision.": Gemma4MultimodalEmbedder(config.vision_config, config.text_config),
        "model.embed_audio.": Gemma4MultimodalEmbedder(config.audio_config, config.text_config),
    }
    tensors = {}
    for prefix, module in towers.items():
        for name, t in module.state_dict().items():
            floating = t.is_floating_point() and torch.isfinite(t).all()
            tensors[prefix + name] = (t.to(torch.bfloat16) if floating else t).contiguous()
    save_file(tensors, str(out / "towers.safetensors"), metadata={"format": "pt"})
    index = json.loads((text_dir / "model.safetensors.index.json").read_text())
    index["weight_map"].update({name: "towers.safetensors" for name in tensors})
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config_dict = config.to_dict()
    config_dict["architectures"] = ["Gemma4ForConditionalGeneration"]
    (out / "config.json").write_text(json.dumps(config_dict, indent=1))
    return out


def photo_jpeg(width=1024, height=768) -> bytes:
    """A photo-like JPEG: smooth gradients, shapes and sensor noise (compresses as photos do)."""
    from PIL import Image

    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack(
        [
            128 + 100 * np.sin(x / 97 + y / 151),
            128 + 100 * np.cos(y / 83),
            128 + 80 * np.sin((x + y) / 211),
        ],
        axis=-1,
    )
    rgb += rng.normal(0, 6, rgb.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def speech_wav(seconds: float) -> bytes:
    """16 kHz mono 16-bit PCM: harmonics with a syllable-rate envelope, plus noise."""
    rng = np.random.default_rng(7)
    t = np.arange(int(16000 * seconds)) / 16000
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    samples = 0.3 * voice * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) + rng.normal(0, 0.01, t.size)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def run_ours(args, model: pathlib.Path, media: bytes | None) -> dict:
    import torchtpu_cpp as tt

    start = time.perf_counter()
    engine = tt.Engine(
        str(model),
        context=4096,
        threads=args.threads,
        no_vision=args.kind != "image",
        no_audio=args.kind != "audio",
    )
    row = {"load_s": time.perf_counter() - start, "rss_after_load_gib": rss_gib()}
    tokenizer = tt.Tokenizer(str(model / "tokenizer.json"))
    if media is None:
        # The text alone, so that peak RSS counts the text model's weights as the others do.
        text = tt.render_chat(
            [{"role": "user", "content": TEXT}], template=str(model)
        )
        engine.decode(tokenizer.encode(text), 1, stop=[])
    else:
        content = [{"type": args.kind}, {"type": "text", "text": TEXT}]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            items = (
                engine.media(images=[media], image_tokens=args.image_tokens)
                if args.kind == "image"
                else engine.media(audio=[media])
            )
            text = tt.render_chat([{"role": "user", "content": content}], template=str(model))
            ids = engine.expand_media(tokenizer.encode(text), items)
            engine.decode(ids, 1, stop=[], media=items)
            times.append(time.perf_counter() - start)
        row |= {"first_token_s": times, "prompt_ids": ids}
    return row | {"peak_rss_gib": peak_gib()}


def run_hf(args, model: pathlib.Path, media: bytes) -> dict:
    import torch
    from PIL import Image
    from transformers import (
        Gemma4AudioFeatureExtractor,
        Gemma4ForConditionalGeneration,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
        PreTrainedTokenizerFast,
    )

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    hf = Gemma4ForConditionalGeneration.from_pretrained(
        model, dtype=torch.bfloat16, key_mapping=KEY_MAPPING
    ).eval()
    row = {"load_s": time.perf_counter() - start, "rss_after_load_gib": rss_gib()}
    # The published tokenizer_config.json names the multimodal tokens as these attributes.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(model / "tokenizer.json"),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    )
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(max_soft_tokens=args.image_tokens),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=(model / "chat_template.jinja").read_text(),
        image_seq_length=args.image_tokens,
    )
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        if args.kind == "image":
            part = {"type": "image", "image": Image.open(io.BytesIO(media)).convert("RGB")}
        else:
            with wave.open(io.BytesIO(media)) as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            part = {"type": "audio", "audio": pcm.astype(np.float32) / 32768}
        inputs = processor.apply_chat_template(
            [{"role": "user", "content": [part, {"type": "text", "text": TEXT}]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        with torch.inference_mode():
            hf.generate(**inputs, max_new_tokens=1, do_sample=False)
        times.append(time.perf_counter() - start)
    ids = inputs["input_ids"][0].tolist()
    return row | {"first_token_s": times, "prompt_ids": ids, "peak_rss_gib": peak_gib()}


def child(args) -> None:
    model = pathlib.Path(args.model)
    media = None
    if args.kind == "image":
        media = photo_jpeg()
    elif args.kind == "audio":
        media = speech_wav(args.clip_seconds)
    run = run_ours if args.engine == "ours" else run_hf
    print(json.dumps(run(args, model, media)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/torchtpu-bench")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--image-tokens", type=int, default=280)
    p.add_argument("--clip-seconds", type=float, default=30)
    p.add_argument("--skip", default="", help="comma-separated: hf")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", choices=["ours", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--kind", choices=["image", "audio", "none"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return

    model = make_multimodal(pathlib.Path(args.work))
    with open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    print(
        f"Run {time.strftime('%Y-%m-%dT%H:%M:%S%z')} on {cpu}, {os.cpu_count()} CPUs, "
        f"{args.threads} threads; load average {os.getloadavg()[0]:.1f} at the start"
    )
    runs = [("ours", "none"), ("ours", "image"), ("ours", "audio")]
    if "hf" not in args.skip.split(","):
        runs += [("hf", "image"), ("hf", "audio")]
    rows = {}
    for engine, kind in runs:
        command = [sys.executable, __file__, "--child", "--engine", engine, "--kind", kind]
        command += ["--model", str(model), "--repeats", str(args.repeats)]
        command += ["--threads", str(args.threads), "--image-tokens", str(args.image_tokens)]
        command += ["--clip-seconds", str(args.clip_seconds)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows[engine, kind] = json.loads(out.strip().splitlines()[-1])
    for kind in ("image", "audio"):
        if ("hf", kind) in rows:
            same = rows["ours", kind]["prompt_ids"] == rows["hf", kind]["prompt_ids"]
            print(f"{kind} prompt: {len(rows['ours', kind]['prompt_ids'])} tokens, ", end="")
            print("the same ids in both engines" if same else "THE ENGINES' PROMPT IDS DIFFER")
    print()
    print("| engine | towers loaded | load s | RSS after load GiB | to first token s, median (best) "
          "| peak RSS GiB | prompt tokens |")
    print("|---|---|---|---|---|---|---|")
    names = {"ours": "torchtpu-cpp", "hf": "transformers eager (bf16)"}
    towers = {"none": "none (text prompt only)", "image": "vision", "audio": "audio"}
    for (engine, kind), row in rows.items():
        times = row.get("first_token_s")
        first = f"{statistics.median(times):.2f} (best {min(times):.2f})" if times else "—"
        label = f"{kind}: {first}" if kind != "none" else "—"
        tokens = len(row.get("prompt_ids", [])) or "—"
        print(
            f"| {names[engine]} | {towers[kind] if engine == 'ours' else 'vision + audio'} "
            f"| {row['load_s']:.1f} | {row['rss_after_load_gib']:.2f} | {label} "
            f"| {row['peak_rss_gib']:.2f} | {tokens} |"
        )
    for kind in ("image", "audio"):
        if ("hf", kind) in rows:
            ratio = statistics.median(rows["hf", kind]["first_token_s"]) / statistics.median(
                rows["ours", kind]["first_token_s"]
            )
            print(f"\n{kind} to first token, transformers ÷ ours: {ratio:.2f}")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    for key, row in rows.items():
        row.pop("prompt_ids", None)
        print(json.dumps({"engine": key[0], "kind": key[1], **row}))


if __name__ == "__main__":
    main()
