"""Prompts with images and audio clips (issue #19): the engine's greedy tokens against
transformers' Gemma4ForConditionalGeneration on a tiny random checkpoint with both towers,
saved by save_pretrained. The reference's inputs come from transformers' own
Gemma4ImageProcessor and Gemma4AudioFeatureExtractor and Gemma4Processor's placeholder
expansion; ours from the engine's C++ path (decoding, preprocessing, expansion), through the
`torchtpu-cpp generate` command and through the Python module."""

import io
import json
import pathlib
import shutil
import wave

import hf_tiny
import numpy as np
import pytest
import torch
import torchtpu_cpp
from hf_tiny import N_NEW, TOL
from PIL import Image, ImageOps
from safetensors.numpy import load_file
from test_audio import AUDIO_CONFIGS, _processor_soft_tokens, _speechlike
from test_audio import _randomize as randomize_audio
from test_vision import encode, random_image, vision_config
from transformers import (
    Gemma4AudioConfig,
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4Processor,
    Gemma4VideoProcessor,
    PreTrainedTokenizerFast,
)

REPO_DIR = pathlib.Path(__file__).resolve().parents[2]
IMAGE_TOKENS = 70
# Multimodal ids inside the tiny vocabulary (transformers' defaults lie past it).
IDS = {
    "image_token_id": 500,
    "boi_token_id": 501,
    "eoi_token_id": 502,
    "audio_token_id": 503,
    "boa_token_id": 504,
    "eoa_token_index": 505,
}
VOCAB = 512


@torch.no_grad()
def make_checkpoint(
    out_dir, *, seed, vision=True, audio=True, vocab=VOCAB, ids=IDS, ple=32
):
    text = hf_tiny.text_config(
        layer_types=[hf_tiny.S, hf_tiny.S, hf_tiny.F, hf_tiny.S, hf_tiny.F],
        shared=2,
        window=16,
        vocab=vocab,
        ple=ple,
    )
    config = Gemma4Config(
        text_config=text.to_dict(),
        vision_config=vision_config().to_dict() if vision else None,
        audio_config=(
            Gemma4AudioConfig(
                **AUDIO_CONFIGS["e2b-geometry-clipped"]["audio"]
            ).to_dict()
            if audio
            else None
        ),
        **ids,
    )
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config)
    hf_tiny._randomize(model, seed)
    if audio:
        randomize_audio(model, seed + 1)
    if vision:
        tower = model.model.vision_tower
        g = torch.Generator().manual_seed(seed + 2)
        table = tower.patch_embedder.position_embedding_table
        table.copy_(torch.randn(table.shape, generator=g))
        for name, b in tower.named_buffers():
            if name.endswith(("input_min", "output_min")):
                b.fill_(-2.0)
            elif name.endswith(("input_max", "output_max")):
                b.fill_(2.0)
    model.save_pretrained(out_dir)
    return str(out_dir)


def wav_bytes(seconds, seed):
    """A 16 kHz mono 16-bit WAV file and the float samples a reader gets back from it."""
    pcm = np.clip(np.round(_speechlike(seconds, seed) * 32767), -32768, 32767).astype(
        "<i2"
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return out.getvalue(), pcm.astype(np.float32) / 32768


def png_bytes(width, height, seed):
    return encode(random_image(width, height, seed), "PNG")


def text_ids(n, seed):
    rng = np.random.RandomState(seed)
    return [int(t) for t in rng.randint(4, 400, size=n)]


class Reference:
    """transformers' side: processor outputs, the expanded prompt and greedy decoding."""

    def __init__(self, model_dir):
        self.model = hf_tiny.load(model_dir)

    def inputs(self, ids, images, clips):
        kwargs = {}
        expanded = []
        image_soft, clip_soft = [], []
        if images:
            batch = Gemma4ImageProcessor()(
                images=[Image.open(io.BytesIO(b)) for b in images],
                max_soft_tokens=IMAGE_TOKENS,
                return_tensors="pt",
            )
            kwargs["pixel_values"] = batch["pixel_values"]
            kwargs["image_position_ids"] = batch["image_position_ids"]
            image_soft = [int(n) for n in batch["num_soft_tokens_per_image"]]
        if clips:
            out = Gemma4AudioFeatureExtractor()(clips, return_tensors="pt")
            kwargs["input_features"] = out["input_features"]
            kwargs["input_features_mask"] = out["input_features_mask"]
            clip_soft = [_processor_soft_tokens(m) for m in out["input_features_mask"]]
        # Gemma4Processor.replace_image_token / replace_audio_token, on ids.
        for t in ids:
            if t == IDS["image_token_id"]:
                n = image_soft.pop(0)
                expanded += [IDS["boi_token_id"]] + [t] * n + [IDS["eoi_token_id"]]
            elif t == IDS["audio_token_id"]:
                n = clip_soft.pop(0)
                expanded += [IDS["boa_token_id"]] + [t] * n + [IDS["eoa_token_index"]]
            else:
                expanded.append(t)
        return expanded, kwargs

    @torch.no_grad()
    def logits(self, ids, kwargs):
        out = self.model(input_ids=torch.tensor([ids]), use_cache=False, **kwargs)
        return out.logits[0].double().numpy()

    def greedy(self, ids, kwargs, n):
        seq = list(ids)
        for _ in range(n):
            seq.append(int(np.argmax(self.logits(seq, kwargs)[-1])))
        return seq[len(ids) :]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("media"), seed=41)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return Reference(checkpoint)


@pytest.fixture(scope="module")
def media_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    image = png_bytes(200, 130, seed=5)
    # Inverted: random_image's gradients are the same for every seed.
    other = encode(ImageOps.invert(random_image(200, 130, seed=6)), "PNG")
    clip, samples = wav_bytes(1.3, seed=7)
    for name, data in (("a.png", image), ("b.png", other), ("a.wav", clip)):
        (d / name).write_bytes(data)
    return {"image": image, "other": other, "clip": clip, "samples": samples, "dir": d}


IMAGE, AUDIO = IDS["image_token_id"], IDS["audio_token_id"]
PROMPTS = {
    "text+image+audio": lambda: (
        [2] + text_ids(5, 1) + [IMAGE] + text_ids(4, 2) + [AUDIO] + text_ids(6, 3)
    ),
    "image-only": lambda: [2, IMAGE] + text_ids(7, 4),
    "audio-only": lambda: [2] + text_ids(3, 5) + [AUDIO] + text_ids(5, 6),
}


def _media_of(ids, files):
    images = [files["image"]] if IMAGE in ids else []
    clips = [files["clip"]] if AUDIO in ids else []
    return images, clips


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_cli_greedy_matches_transformers(
    name, checkpoint, reference, media_files, cli, tmp_path, report
):
    ids = PROMPTS[name]()
    images, clips = _media_of(ids, media_files)
    expanded, kwargs = reference.inputs(
        ids, images, [media_files["samples"]] * len(clips)
    )
    args = [
        "generate",
        "--model",
        checkpoint,
        "--ids",
        ",".join(map(str, ids)),
        "--max-new",
        N_NEW,
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--json",
        "--ignore-eos",
        "--chunk",
        16,  # soft tokens split across prompt chunks
        "--dump-logits",
        tmp_path / "logits.safetensors",
    ]
    if images:
        args += ["--image-tokens", IMAGE_TOKENS]  # refused without an image
    for _ in images:
        args += ["--image", media_files["dir"] / "a.png"]
    for _ in clips:
        args += ["--audio", media_files["dir"] / "a.wav"]
    out = json.loads(cli(*args).stdout)
    assert out["prompt_ids"] == expanded
    tokens = reference.greedy(expanded, kwargs, N_NEW)
    want = reference.logits(expanded + tokens, kwargs)
    summary = hf_tiny.check_run(
        name, out, load_file(str(tmp_path / "logits.safetensors")), tokens, want, TOL
    )
    report(f"engine f32 vs transformers f32 with media [{name}]: {summary}")


def test_cli_chat_prompt_matches_the_processor(
    tmp_path, media_files, cli, test_tokenizer_dir
):
    """`generate --chat --image --audio` builds the prompt Gemma4Processor.apply_chat_template
    builds for the same message (images, then clips, then the text, after the system turn): the
    real vocabulary's multimodal tokens, the chat template and the placeholder expansion."""
    # transformers' Gemma4Config defaults: the real checkpoint's multimodal ids.
    checkpoint = make_checkpoint(
        tmp_path / "real-vocab", seed=43, vocab=262144, ids={}, ple=8
    )
    template = (REPO_DIR / "data" / "gemma4" / "chat_template.jinja").read_text()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(test_tokenizer_dir / name, checkpoint)
    (pathlib.Path(checkpoint) / "chat_template.jinja").write_text(template)
    # The published tokenizer_config.json names the multimodal tokens as these attributes.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(test_tokenizer_dir / "tokenizer.json"),
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
        image_processor=Gemma4ImageProcessor(max_soft_tokens=IMAGE_TOKENS),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(),
        chat_template=template,
        image_seq_length=IMAGE_TOKENS,
    )
    image = Image.open(io.BytesIO(media_files["image"]))
    want = processor.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "image", "image": image},
                    {"type": "audio", "audio": media_files["samples"]},
                    {"type": "text", "text": "What do you see and hear?"},
                ],
            },
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][0]
    out = json.loads(
        cli(
            "generate",
            "--model",
            checkpoint,
            "--chat",
            "--system",
            "Be brief.",
            "--prompt",
            "What do you see and hear?",
            "--image",
            media_files["dir"] / "a.png",
            "--image",
            media_files["dir"] / "a.png",
            "--audio",
            media_files["dir"] / "a.wav",
            "--image-tokens",
            IMAGE_TOKENS,
            "--max-new",
            2,
            "--dtype",
            "float32",
            "--json",
        ).stdout
    )
    assert out["prompt_ids"] == list(want)
    assert len(out["tokens"]) == 2


def test_python_greedy_matches_transformers(checkpoint, reference, media_files, report):
    ids = PROMPTS["text+image+audio"]()
    expanded, kwargs = reference.inputs(
        ids, [media_files["image"]], [media_files["samples"]]
    )
    engine = torchtpu_cpp.Engine(
        checkpoint, dtype="float32", context=1024, prefill_chunk=16
    )
    assert engine.has_vision and engine.has_audio
    media = engine.media(
        images=[media_files["image"]],
        audio=[media_files["clip"]],
        image_tokens=IMAGE_TOKENS,
    )
    assert [m.kind for m in media] == ["image", "audio"]
    ours = engine.expand_media(ids, media)
    assert ours == expanded
    result = engine.decode(ours, N_NEW, stop=[], media=media)
    tokens = reference.greedy(expanded, kwargs, N_NEW)
    want = reference.logits(expanded + tokens, kwargs)
    hf_tiny.check_greedy("python", result.tokens, tokens, want[len(expanded) - 1 : -1])
    got = engine.logits(ours, media=media).numpy()
    delta = float(np.abs(got - want[: len(expanded)]).max())
    assert delta <= TOL
    report(
        f"Engine.decode with media vs transformers: greedy 64/64, prompt |dlogit| {delta:.2e}"
    )


def test_w4a16_checkpoint_reads_media_as_transformers_does(
    checkpoint, media_files, cli, tmp_path, report
):
    """Quantized as the published W4A16 checkpoints are (the text model's linears packed int4,
    the towers kept dense by the ignore list), a checkpoint reads an image and a clip as
    transformers does on the weights compressed-tensors decompresses from it."""
    cli("quantize", checkpoint, tmp_path / "q", "--group", 32)
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    ignore = set(config["quantization_config"]["ignore"])
    assert {r"re:model\.vision_tower\..*", r"re:model\.audio_tower\..*"} <= ignore, (
        ignore
    )
    hf_tiny.dense_from_quantized(tmp_path / "q", tmp_path / "hf")
    reference = Reference(str(tmp_path / "hf"))
    ids = PROMPTS["text+image+audio"]()
    expanded, kwargs = reference.inputs(
        ids, [media_files["image"]], [media_files["samples"]]
    )
    engine = torchtpu_cpp.Engine(str(tmp_path / "q"), dtype="float32", context=1024)
    assert "int4" in next(
        s["format"] for s in engine.report()["storage"] if s["family"] == "linears"
    )
    media = engine.media(
        images=[media_files["image"]],
        audio=[media_files["clip"]],
        image_tokens=IMAGE_TOKENS,
    )
    got = engine.logits(engine.expand_media(ids, media), media=media).numpy()
    delta = float(np.abs(got - reference.logits(expanded, kwargs)).max())
    report(
        f"W4A16 with media vs transformers on the decompressed weights: |dlogit| {delta:.2e}"
    )
    assert delta <= TOL


def test_python_takes_tensors_as_bytes_give_them(checkpoint, media_files):
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=1024)
    rgb = torchtpu_cpp.decode_image(media_files["image"])
    from_bytes = engine.media(
        images=[media_files["image"]], audio=[media_files["clip"]]
    )
    from_tensors = engine.media(
        images=[rgb], audio=[torch.from_numpy(media_files["samples"])]
    )
    assert [m.digest for m in from_bytes] == [m.digest for m in from_tensors]
    assert [m.soft_tokens for m in from_bytes] == [m.soft_tokens for m in from_tensors]


def test_digests_tell_images_apart(checkpoint, media_files):
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=1024)
    a, a_again, b = engine.media(
        images=[media_files["image"], media_files["image"], media_files["other"]]
    )
    assert a.digest == a_again.digest
    assert a.digest != b.digest


def test_a_different_image_gives_a_different_answer(checkpoint, media_files):
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=1024)
    ids = [2] + text_ids(3, 11) + [IMAGE] + text_ids(2, 12)
    answers = []
    for image in (media_files["image"], media_files["other"]):
        media = engine.media(images=[image], image_tokens=IMAGE_TOKENS)
        answers.append(
            engine.decode(engine.expand_media(ids, media), 16, stop=[], media=media)
        )
    assert answers[0].tokens != answers[1].tokens


def test_an_asleep_engine_checks_media_and_answers_them_once_awake(checkpoint, media_files):
    """Asleep (the server's --sleep-idle-seconds), the engine still preprocesses and checks
    images, since the towers' configuration stays; reading them needs wake(), after which the
    answer is the one of before."""
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=1024)
    ids = [2] + text_ids(3, 11) + [IMAGE] + text_ids(2, 12)
    media = engine.media(images=[media_files["image"]], image_tokens=IMAGE_TOKENS)
    expanded = engine.expand_media(ids, media)
    before = engine.decode(expanded, 8, stop=[], media=media).tokens
    engine.sleep()
    asleep = engine.media(images=[media_files["image"]], image_tokens=IMAGE_TOKENS)
    assert asleep[0].digest == media[0].digest
    with pytest.raises(ValueError, match="soft-token positions"):
        engine.decode(ids, 8, stop=[], media=media)
    with pytest.raises(RuntimeError, match="the engine is asleep"):
        engine.decode(expanded, 8, stop=[], media=media)
    engine.wake()
    assert engine.decode(expanded, 8, stop=[], media=media).tokens == before


# Errors -------------------------------------------------------------------------------


def test_media_refuses_a_clip_with_a_sample_that_is_not_finite(checkpoint):
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=256)
    clip = torch.zeros(16000)
    clip[5] = float("nan")
    with pytest.raises(ValueError, match=r"^audio sample 5 is not finite \(NaN\)"):
        engine.media(audio=[clip])


def test_media_for_a_checkpoint_without_the_tower(tmp_path, media_files):
    path = make_checkpoint(tmp_path / "text", seed=42, vision=False, audio=False)
    engine = torchtpu_cpp.Engine(path, dtype="float32", context=256)
    with pytest.raises(
        ValueError, match=r"has no image tower \(config.json has no vision_config\)"
    ):
        engine.media(images=[media_files["image"]])
    with pytest.raises(
        ValueError, match=r"has no audio tower \(config.json has no audio_config\)"
    ):
        engine.media(audio=[media_files["clip"]])
    # Text alone still decodes on it.
    assert len(engine.decode([2] + text_ids(6, 9), 4, stop=[]).tokens) == 4


def test_media_for_a_disabled_tower(checkpoint, media_files, cli):
    engine = torchtpu_cpp.Engine(
        checkpoint, dtype="float32", context=256, no_vision=True
    )
    assert not engine.has_vision and engine.has_audio
    with pytest.raises(
        ValueError, match=r"loaded without its image tower \(no_vision\)"
    ):
        engine.media(images=[media_files["image"]])
    with pytest.raises(
        AssertionError, match=r"loaded without its audio tower \(no_audio\)"
    ):
        cli(
            "generate",
            "--model",
            checkpoint,
            "--ids",
            f"2,{AUDIO},7",
            "--no-audio",
            "--audio",
            media_files["dir"] / "a.wav",
        )


def test_placeholder_and_media_counts_must_agree(checkpoint, media_files):
    engine = torchtpu_cpp.Engine(checkpoint, dtype="float32", context=1024)
    media = engine.media(images=[media_files["image"]], image_tokens=IMAGE_TOKENS)
    with pytest.raises(
        ValueError,
        match=r"the prompt has 2 image placeholders \(token id 500\) but 1 image",
    ):
        engine.expand_media([2, IMAGE, 7, IMAGE], media)
    with pytest.raises(
        ValueError,
        match=r"the prompt has 1 image soft-token positions \(token id 500\) but its 1 image "
        r"items fill \d+",
    ):
        engine.decode([2, IMAGE, 7], 4, stop=[], media=media)
    with pytest.raises(ValueError, match=r"at most 32 are allowed"):
        engine.expand_media([2], media * 33)
    with pytest.raises(ValueError, match=r"Batch.decode_many takes no media"):
        engine.batch().decode_many([[2, 7]], 4, media=media)


# The prefix cache ----------------------------------------------------------------------


def test_prefix_cache_reuses_an_image_and_tells_two_apart(checkpoint, media_files):
    engine = torchtpu_cpp.Engine(
        checkpoint, dtype="float32", context=1024, prefill_chunk=16
    )
    ids = [2] + text_ids(3, 11) + [IMAGE] + text_ids(2, 12)
    first_soft = 5  # bos, 3 tokens, boi
    fresh, cached = {}, {}
    for name in ("image", "other"):
        media = engine.media(images=[media_files[name]], image_tokens=IMAGE_TOKENS)
        prompt = engine.expand_media(ids, media)
        fresh[name] = engine.decode(prompt, 16, stop=[], media=media).tokens
    batch = engine.batch(rows=1, cache_mb=64, cache_block=4)
    for name in ("image", "image", "other"):
        media = engine.media(images=[media_files[name]], image_tokens=IMAGE_TOKENS)
        result = _run(batch, engine.expand_media(ids, media), media)
        cached.setdefault(name, []).append(result)
    first, again = cached["image"]
    [other] = cached["other"]
    assert first.tokens == again.tokens == fresh["image"]
    assert first.cached_tokens == 0
    assert again.cached_tokens > first_soft + 8  # past the image's soft tokens
    # The other image shares only the tokens before its soft tokens with what is cached.
    assert other.cached_tokens <= first_soft
    assert other.tokens == fresh["other"]
    assert fresh["image"] != fresh["other"]


def _run(batch, prompt, media):
    sequence = batch.submit(prompt, 16, stop=[], media=media)
    while True:
        if sequence in batch.step():
            return batch.result(sequence)
