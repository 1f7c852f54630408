"""Images, issue #19: our decoders against Pillow (through transformers'
convert_to_rgb), our preprocessing against transformers' Gemma4ImageProcessor, and our
vision tower against Gemma4Model.get_image_features, on a tiny random
Gemma4ForConditionalGeneration saved by transformers' own save_pretrained."""

import io
import math

import hf_tiny
import numpy as np
import pytest
import torch
import torchtpu_cpp
from PIL import Image
from transformers import (
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4VisionConfig,
)
from transformers.image_transforms import convert_to_rgb

BUDGETS = (70, 140, 280, 560, 1120)
# (width, height): wide, tall, tiny (upscaled), 384 x 384 (the exact size for 70 soft
# tokens, so not resized at that budget), and odd sizes that round differently per side.
SIZES = [(300, 90), (80, 260), (20, 15), (384, 384), (517, 389), (49, 1000)]


def random_image(width, height, seed, mode="RGB"):
    """Smooth gradients plus noise: resizing has edges and flat parts to get right."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [127 + 120 * np.sin(x / (3 + c) + y / (5 + 2 * c) + c) for c in range(3)],
        axis=-1,
    )
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    if "A" not in mode:
        return Image.fromarray(pixels, "RGB").convert(mode)
    # Transparency from fully clear to opaque, with every value in between.
    alpha = rng.integers(0, 256, (height, width, 1), dtype=np.uint8)
    alpha[: height // 4] = 0
    alpha[-(height // 4) :] = 255
    return Image.fromarray(np.concatenate([pixels, alpha], -1), "RGBA").convert(mode)


def encode(image, fmt, **kwargs):
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def pillow_rgb(data):
    """What transformers' image processors see of the file opened by Pillow: its
    convert_to_rgb (Pillow's convert("RGB"), transparency composited onto white), as
    [3, H, W] uint8."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = convert_to_rgb(im, return_numpy=True)
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


# Decoding -----------------------------------------------------------------------------


def _png_cases():
    rgb = random_image(37, 23, seed=1)
    palette = rgb.quantize(colors=50)
    palette_alpha = palette.copy()
    palette_alpha.info["transparency"] = 3
    grey16 = np.random.default_rng(1).integers(0, 400, (23, 37)).astype(np.uint16)
    return {
        "rgb": encode(rgb, "PNG"),
        "rgb-interlaced": encode(rgb, "PNG", interlace=1),
        "rgba": encode(random_image(37, 23, seed=2, mode="RGBA"), "PNG"),
        "grey": encode(rgb.convert("L"), "PNG"),
        "grey-alpha": encode(random_image(37, 23, seed=3, mode="LA"), "PNG"),
        "grey-transparency": encode(rgb.convert("L"), "PNG", transparency=100),
        "rgb-transparency": encode(
            rgb, "PNG", transparency=tuple(rgb.getpixel((0, 0)))
        ),
        "grey-16bit": encode(Image.fromarray(grey16), "PNG"),
        "bilevel": encode(rgb.convert("1"), "PNG"),
        "palette": encode(palette, "PNG"),
        "palette-transparency": encode(palette_alpha, "PNG", transparency=3),
        "palette-4bit": encode(rgb.quantize(colors=16), "PNG", bits=4),
    }


PNG_CASES = _png_cases()


@pytest.mark.parametrize("case", sorted(PNG_CASES))
def test_png_decodes_to_pillows_pixels(case):
    data = PNG_CASES[case]
    ours = torchtpu_cpp.decode_image(data)
    assert ours.dtype == torch.uint8 and ours.shape == (3, 23, 37)
    assert torch.equal(ours, pillow_rgb(data))


@pytest.mark.parametrize(
    "case,kwargs",
    [
        ("rgb-q90", dict(quality=90)),
        ("rgb-q50-444", dict(quality=50, subsampling=0)),
        ("rgb-progressive", dict(quality=80, progressive=True)),
        ("grey", dict(quality=85)),
    ],
)
def test_jpeg_decodes_to_pillows_pixels(case, kwargs):
    image = random_image(61, 45, seed=3)
    if case == "grey":
        image = image.convert("L")
    data = encode(image, "JPEG", **kwargs)
    ours = torchtpu_cpp.decode_image(data)
    theirs = pillow_rgb(data)
    assert ours.shape == theirs.shape == (3, 45, 61)
    # Both are libjpeg-turbo with its default (islow) DCT and fancy upsampling: the same
    # pixels.
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_lossless_webp_decodes_to_pillows_pixels(mode):
    data = encode(random_image(40, 30, seed=4, mode=mode), "WEBP", lossless=True)
    assert torch.equal(torchtpu_cpp.decode_image(data), pillow_rgb(data))


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_lossy_webp_decodes_to_pillows_pixels(mode):
    # Debian's libwebp 1.2.4 and Pillow's bundled 1.6.0 decode to the same pixels
    # (measured); the decoder's output is specified by the format.
    data = encode(random_image(40, 30, seed=5, mode=mode), "WEBP", quality=80)
    assert torch.equal(torchtpu_cpp.decode_image(data), pillow_rgb(data))


def test_corrupt_png_is_a_value_error():
    data = bytearray(PNG_CASES["rgb"])
    idat = data.index(b"IDAT")
    for i in range(idat + 8, idat + 40):
        data[i] ^= 0x5A
    with pytest.raises(ValueError, match=r"^corrupt PNG image: "):
        torchtpu_cpp.decode_image(bytes(data))


def test_truncated_png_is_a_value_error():
    data = PNG_CASES["rgb"]
    with pytest.raises(ValueError, match=r"corrupt PNG image: the data ends early"):
        torchtpu_cpp.decode_image(data[: len(data) // 2])


def test_truncated_jpeg_is_a_value_error():
    data = encode(random_image(64, 64, seed=6), "JPEG", quality=90)
    with pytest.raises(
        ValueError,
        match=r"^truncated JPEG image: the data ends before the last scan line",
    ):
        torchtpu_cpp.decode_image(data[: len(data) // 2])


def test_truncated_webp_is_a_value_error():
    data = encode(random_image(64, 64, seed=6), "WEBP", quality=90)
    with pytest.raises(
        ValueError,
        match=r"^corrupt or truncated WebP image: its pixel data do not decode$",
    ):
        torchtpu_cpp.decode_image(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match=r"^truncated WebP image: the data ends inside its header$"
    ):
        torchtpu_cpp.decode_image(data[:20])


def test_corrupt_jpeg_header_is_a_value_error():
    with pytest.raises(ValueError, match=r"^corrupt JPEG image: "):
        torchtpu_cpp.decode_image(b"\xff\xd8\xff\xe0" + b"\x00" * 30)


@pytest.mark.parametrize("adobe", [True, False])
def test_cmyk_jpeg_decodes_to_pillows_pixels(adobe):
    # Pillow writes CMYK with Adobe's APP14 marker and the inks inverted, as Photoshop does,
    # and reads every CMYK JPEG's inks as inverted, with the marker or without. A random black
    # channel tests the rounding of its product with each ink.
    inks = 255 - np.asarray(random_image(29, 17, seed=7))
    black = np.random.default_rng(8).integers(0, 256, (17, 29, 1), dtype=np.uint8)
    image = Image.fromarray(np.concatenate([inks, black], -1), "CMYK")
    data = encode(image, "JPEG", quality=95)
    if not adobe:
        app14 = data.index(b"\xff\xee")
        length = int.from_bytes(data[app14 + 2 : app14 + 4], "big")
        data = data[:app14] + data[app14 + 2 + length :]
        assert Image.open(io.BytesIO(data)).info.get("adobe") is None
    ours = torchtpu_cpp.decode_image(data)
    assert ours.shape == (3, 17, 29)
    assert torch.equal(ours, pillow_rgb(data))


def test_gif_and_unknown_bytes_are_value_errors():
    gif = encode(random_image(8, 8, seed=7), "GIF")
    with pytest.raises(
        ValueError, match=r"^GIF images are not supported: send JPEG, PNG or WebP$"
    ):
        torchtpu_cpp.decode_image(gif)
    with pytest.raises(
        ValueError,
        match=r"^unrecognized image format \(first bytes 68 65 6c 6c 6f 20 77 6f\): "
        r"send JPEG, PNG or WebP$",
    ):
        torchtpu_cpp.decode_image(b"hello world")
    with pytest.raises(ValueError, match=r"^image data is empty$"):
        torchtpu_cpp.decode_image(b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_images_over_the_pixel_limit_are_value_errors(fmt):
    data = encode(random_image(30, 20, seed=8), fmt)
    assert torchtpu_cpp.decode_image(data, max_pixels=600).shape == (3, 20, 30)
    with pytest.raises(
        ValueError,
        match=rf"{'WebP' if fmt == 'WEBP' else fmt} image of 30 x 20 = 600 pixels is "
        r"over the limit of 599 pixels",
    ):
        torchtpu_cpp.decode_image(data, max_pixels=599)


def test_images_over_the_byte_limit_are_value_errors():
    data = PNG_CASES["rgb"]
    with pytest.raises(
        ValueError,
        match=rf"^image of {len(data)} bytes is over the limit of {len(data) - 1} "
        r"bytes$",
    ):
        torchtpu_cpp.decode_image(data, max_bytes=len(data) - 1)


# Preprocessing ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def processor():
    return Gemma4ImageProcessor()


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_preprocessing_matches_the_image_processor(processor, budget, size):
    data = encode(random_image(*size, seed=size[0] + budget), "PNG")
    ours = torchtpu_cpp.preprocess_image(data, budget)
    ref = processor(
        images=[Image.open(io.BytesIO(data))],
        max_soft_tokens=budget,
        return_tensors="pt",
    )
    n = ours.pixels.shape[0]
    assert ours.soft_tokens == ref["num_soft_tokens_per_image"][0]
    assert ours.pixels.dtype == torch.float32
    assert torch.equal(ours.pixels, ref["pixel_values"][0, :n])
    assert torch.equal(ours.positions, ref["image_position_ids"][0, :n])
    assert (ref["image_position_ids"][0, n:] == -1).all()


@pytest.mark.parametrize("case", ["rgba", "palette-transparency", "grey", "grey-16bit"])
def test_preprocessing_of_other_png_modes_matches_the_image_processor(processor, case):
    data = PNG_CASES[case]
    ours = torchtpu_cpp.preprocess_image(data, 70)
    ref = processor(
        images=[Image.open(io.BytesIO(data))], max_soft_tokens=70, return_tensors="pt"
    )
    assert torch.equal(ours.pixels, ref["pixel_values"][0, : ours.pixels.shape[0]])


def test_preprocessing_takes_a_uint8_tensor(processor):
    image = random_image(123, 77, seed=9)
    rgb = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
    ours = torchtpu_cpp.preprocess_image(rgb, 140)
    ref = processor(images=[image], max_soft_tokens=140, return_tensors="pt")
    assert torch.equal(ours.pixels, ref["pixel_values"][0, : ours.pixels.shape[0]])


def test_preprocessing_refuses_bad_arguments():
    rgb = torch.zeros(3, 10, 10, dtype=torch.uint8)
    with pytest.raises(
        ValueError,
        match=r"max_soft_tokens must be one of 70, 140, 280, 560, 1120, got 100",
    ):
        torchtpu_cpp.preprocess_image(rgb, 100)
    with pytest.raises(
        ValueError, match=r"image must be RGB uint8 \[3, height, width\], got Float"
    ):
        torchtpu_cpp.preprocess_image(rgb.float())
    with pytest.raises(
        TypeError, match=r"image \(bytes or an RGB uint8 tensor\) must be"
    ):
        torchtpu_cpp.preprocess_image("x.png")


# The vision tower ---------------------------------------------------------------------


def vision_config(**overrides):
    kwargs = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "pooling_kernel_size": 3,
        "patch_size": 16,
        "position_embedding_size": 1024,
        "use_clipped_linears": True,
        "standardize": True,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    }
    kwargs.update(overrides)
    return Gemma4VisionConfig(**kwargs)


@torch.no_grad()
def make_vision_checkpoint(out_dir, *, seed, dtype=torch.float32, **overrides):
    text = hf_tiny.text_config(
        layer_types=["sliding_attention", "full_attention"], hidden=96
    )
    config = Gemma4Config(
        text_config=text.to_dict(), vision_config=vision_config(**overrides).to_dict()
    )
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config)
    hf_tiny._randomize(model, seed)
    # Vision weights drawn so that every part matters: position tables of both signs,
    # clipping bounds that cut the tails of activations, and a standardization that
    # moves and scales.
    g = torch.Generator().manual_seed(seed + 100)
    tower = model.model.vision_tower
    tower.patch_embedder.position_embedding_table.copy_(
        torch.randn(tower.patch_embedder.position_embedding_table.shape, generator=g)
    )
    for name, b in tower.named_buffers():
        if name.endswith(("input_min", "output_min")):
            b.fill_(-1.5 - torch.rand((), generator=g).item())
        elif name.endswith(("input_max", "output_max")):
            b.fill_(1.5 + torch.rand((), generator=g).item())
    if tower.config.standardize:
        tower.std_bias.copy_(torch.randn(tower.std_bias.shape, generator=g))
        tower.std_scale.copy_(torch.rand(tower.std_scale.shape, generator=g) + 0.5)
    model.to(dtype).save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory):
    return make_vision_checkpoint(tmp_path_factory.mktemp("vision"), seed=21)


@pytest.fixture(scope="module")
def reference(vision_dir):
    return hf_tiny.load(vision_dir, dtype=torch.float32)


@torch.no_grad()
def reference_embeddings(model, batch):
    out = model.model.get_image_features(
        batch["pixel_values"], batch["image_position_ids"]
    )
    return out.pooler_output[0]


def relative_error(ours, ref):
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


TOWER_SIZES = [(300, 90), (80, 260), (20, 15), (384, 384)]


@pytest.mark.parametrize("size", TOWER_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tower_matches_transformers_at_f32(vision_dir, reference, processor, size):
    image = random_image(*size, seed=sum(size))
    batch = processor(images=[image], max_soft_tokens=70, return_tensors="pt")
    ref = reference_embeddings(reference, batch)
    tower = torchtpu_cpp.VisionTower(str(vision_dir), dtype="float32")
    # The processor's padded batch row (padding dropped inside), and our own
    # preprocessing.
    ours = tower.embed(batch["pixel_values"][0], batch["image_position_ids"][0])
    assert ours.shape == ref.shape == (batch["num_soft_tokens_per_image"][0], 96)
    assert ours.dtype == torch.float32
    assert ref.abs().max() > 1 and ref.std() > 0.1  # not degenerate
    assert relative_error(ours, ref) <= 1e-4
    patches = torchtpu_cpp.preprocess_image(encode(image, "PNG"), 70)
    assert relative_error(tower.embed(patches.pixels, patches.positions), ref) <= 1e-4


def test_clipping_and_standardization_are_exercised(vision_dir, reference, processor):
    """The same image through the model with infinite clip bounds gives other
    embeddings: the checkpoint's bounds take part in the result."""
    batch = processor(
        images=[random_image(300, 90, seed=1)], max_soft_tokens=70, return_tensors="pt"
    )
    unclipped = hf_tiny.load(vision_dir)
    with torch.no_grad():
        for name, b in unclipped.model.vision_tower.named_buffers():
            if name.endswith(("_min", "_max")):
                b.fill_(math.inf if name.endswith("_max") else -math.inf)
    difference = relative_error(
        reference_embeddings(unclipped, batch), reference_embeddings(reference, batch)
    )
    assert difference > 1e-2


def test_tower_at_bf16_is_close_to_transformers_at_bf16(vision_dir, processor):
    model = hf_tiny.load(vision_dir, dtype=torch.bfloat16)
    tower = torchtpu_cpp.VisionTower(str(vision_dir), dtype="bfloat16")
    for size in TOWER_SIZES:
        batch = processor(
            images=[random_image(*size, seed=sum(size))],
            max_soft_tokens=70,
            return_tensors="pt",
        )
        ref = reference_embeddings(model, batch)
        ours = tower.embed(batch["pixel_values"][0], batch["image_position_ids"][0])
        assert ours.dtype == torch.bfloat16
        # bf16 keeps 8 significant bits and the two sides round in different places
        # (attention kernels, pooling order): measured up to 7.4e-3 of the scale, about
        # what transformers' own bf16 result differs from its f32 one (up to 9e-3).
        assert relative_error(ours, ref) <= 2e-2, size


def test_tower_without_clipping_or_standardization(tmp_path, processor):
    model_dir = make_vision_checkpoint(
        tmp_path,
        seed=22,
        use_clipped_linears=False,
        standardize=False,
        num_key_value_heads=4,
    )
    batch = processor(
        images=[random_image(200, 150, seed=2)],
        max_soft_tokens=140,
        return_tensors="pt",
    )
    ref = reference_embeddings(hf_tiny.load(model_dir), batch)
    ours = torchtpu_cpp.VisionTower(str(model_dir), dtype="float32").embed(
        batch["pixel_values"][0], batch["image_position_ids"][0]
    )
    assert relative_error(ours, ref) <= 1e-4


def test_int4_tower_matches_transformers_on_the_decompressed_weights(
    vision_dir, tmp_path, processor
):
    """A checkpoint whose vision linears compressed-tensors packed to int4 (group 32): our
    tower expands them at load, transformers runs compressed-tensors' decompressed weights."""
    quant_dir, dense_dir = tmp_path / "int4", tmp_path / "dense"
    hf_tiny.ct_quantize_checkpoint(vision_dir, quant_dir)
    decompressed = hf_tiny.dense_from_quantized(quant_dir, dense_dir)
    assert "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear" in decompressed
    assert "model.embed_vision.embedding_projection" in decompressed
    batch = processor(
        images=[random_image(300, 90, seed=3)], max_soft_tokens=70, return_tensors="pt"
    )
    ref = reference_embeddings(hf_tiny.load(dense_dir), batch)
    ours = torchtpu_cpp.VisionTower(str(quant_dir), dtype="float32").embed(
        batch["pixel_values"][0], batch["image_position_ids"][0]
    )
    assert relative_error(ours, ref) <= 1e-4


def test_text_only_checkpoint_has_no_vision_tower(tmp_path):
    text = hf_tiny.text_config(layer_types=["sliding_attention", "full_attention"])
    hf_tiny.make(tmp_path, text, seed=3, multimodal_prefix=True)
    with pytest.raises(
        ValueError,
        match=rf"checkpoint {tmp_path} has no vision encoder: its config.json has no "
        r"vision_config, so it cannot read images",
    ):
        torchtpu_cpp.VisionTower(str(tmp_path), dtype="float32")


def test_tower_refuses_bad_patches(vision_dir):
    tower = torchtpu_cpp.VisionTower(str(vision_dir), dtype="float32")
    pixels = torch.rand(12, 768)
    with pytest.raises(
        ValueError,
        match=r"image pixels must be a floating-point tensor "
        r"\[patches, 3 \* patch_size\^2 = 768\]",
    ):
        tower.embed(torch.rand(12, 700), torch.zeros(12, 2, dtype=torch.long))
    positions = torch.stack(
        torch.meshgrid(torch.arange(4), torch.arange(3), indexing="xy"), -1
    )
    with pytest.raises(
        ValueError,
        match=r"image patches must tile a grid whose sides are multiples of "
        r"pooling_kernel_size = 3: got 12 patches",
    ):
        tower.embed(pixels, positions.reshape(12, 2))
    with pytest.raises(ValueError, match=r"image positions must be an integer tensor"):
        tower.embed(pixels, torch.zeros(12, 2))
