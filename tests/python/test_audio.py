"""Gemma 4 audio in C++ against transformers: the audio tower and embed_audio against
Gemma4Model.get_audio_features on tiny checkpoints saved by transformers, the log-mel
features against Gemma4AudioFeatureExtractor, soft-token counts against Gemma4Processor's
replace_audio_token, WAV decoding against Python's `wave` module and numpy, resampling
against the analytic signal, and the errors bad inputs get."""

import io
import json
import math
import re
import struct
import types
import wave

import hf_tiny
import numpy as np
import pytest
import soundfile
import torch
import torchtpu_cpp
from transformers import (
    Gemma4AudioConfig,
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4Processor,
)

RATE = 16000

# Two encoders: E2B's attention geometry (chunks of 12, 12 frames of left context, none
# right) with finite clip bounds, and a small chunk with right context, GELU and no clipped
# linears.
AUDIO_CONFIGS = {
    "e2b-geometry-clipped": dict(
        audio=dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            subsampling_conv_channels=[128, 16],
            output_proj_dims=48,
        ),
        seed=31,
    ),
    "right-context-gelu-unclipped": dict(
        audio=dict(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            subsampling_conv_channels=[128, 8],
            output_proj_dims=40,
            attention_chunk_size=4,
            attention_context_left=5,
            attention_context_right=2,
            conv_kernel_size=3,
            hidden_act="gelu_pytorch_tanh",
            use_clipped_linears=False,
        ),
        seed=32,
    ),
}

# Clip lengths in seconds: shorter than one attention chunk (12 soft tokens = 0.48 s), a
# length that is no multiple of the chunk or of the 128-sample padding, a few seconds, and
# the 30 s maximum (750 soft tokens).
CLIP_SECONDS = [0.3, 1.377, 3.5, 30.0]

F32_TOL = 1e-4  # max |Δ| relative to the reference's max |value|
# bf16: both sides round weights and activations to 8 bits of mantissa, in different
# places (transformers computes the position table in bf16, we round it from f32), so they
# agree to a few bf16 ulps of the output's scale (measured: at most 1.4e-2 here, 2.4e-2 on
# E2B's encoder shapes with 12 layers).
BF16_TOL = 3e-2


@torch.no_grad()
def _randomize(model, seed):
    """Weights that keep the encoder's activations O(1) and its output far from constant;
    clip bounds that clamp a part of the values."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "audio" not in name:
            continue
        if name.endswith("per_dim_scale"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif name.endswith(".bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        elif p.ndim >= 2:
            fan_in = p[0].numel()
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        else:
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    for name, b in model.named_buffers():
        if "audio" not in name:
            continue
        bound = float(torch.rand((), generator=g)) * 2 + 1.5
        if name.endswith(("input_min", "output_min")):
            b.fill_(-bound)
        elif name.endswith(("input_max", "output_max")):
            b.fill_(bound)


def _make(out_dir, audio, seed):
    text = hf_tiny.text_config(layer_types=[hf_tiny.S, hf_tiny.F])
    config = Gemma4Config(
        text_config=text.to_dict(),
        audio_config=Gemma4AudioConfig(**audio).to_dict(),
        vision_config=None,
    )
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config)
    _randomize(model, seed)
    model.save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="module", params=sorted(AUDIO_CONFIGS))
def checkpoint(request, tmp_path_factory):
    spec = AUDIO_CONFIGS[request.param]
    return _make(tmp_path_factory.mktemp(request.param), spec["audio"], spec["seed"])


def _speechlike(seconds, seed, rate=RATE):
    """Tones with a moving envelope plus noise: a spectrum that varies across frames."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    wave_ = sum(
        a * np.sin(2 * np.pi * f * t + ph)
        for a, f, ph in zip(
            rng.uniform(0.05, 0.3, 4), rng.uniform(100, 3500, 4), rng.uniform(0, 6, 4)
        )
    )
    wave_ = wave_ * (0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t)) + rng.normal(
        0, 0.02, t.size
    )
    return wave_.astype(np.float32)


def _reference_features(samples):
    out = Gemma4AudioFeatureExtractor()([samples], return_tensors="pt")
    return out["input_features"][0], out["input_features_mask"][0]


def _processor_soft_tokens(mask):
    fake = types.SimpleNamespace(boa_token="<boa>", audio_token="A", eoa_token="<eoa>")
    text = Gemma4Processor.replace_audio_token(
        fake, {"input_features_mask": [mask.numpy()]}, 0
    )
    return text.count("A")


@pytest.mark.parametrize("seconds", CLIP_SECONDS)
def test_tower_matches_transformers_at_f32(checkpoint, seconds):
    features, mask = _reference_features(_speechlike(seconds, seed=int(seconds * 1000)))
    model = hf_tiny.load(checkpoint)
    with torch.no_grad():
        out = model.model.get_audio_features(
            features[None], mask[None], return_dict=True
        )
    want = out.pooler_output[0][out.attention_mask[0]]

    tower = torchtpu_cpp.AudioTower(checkpoint, dtype="float32")
    got = tower.embed(features, mask)
    assert got.dtype == torch.float32 and got.shape == want.shape
    scale = want.abs().max().item()
    # Not degenerate: the soft tokens differ from position to position far beyond the
    # tolerance.
    assert scale > 0.1 and want.std(0).mean() > 0.05 * scale
    err = (got - want).abs().max().item() / scale
    assert err <= F32_TOL, f"max |Δ| / scale = {err:.2e}"
    _, valid = tower.encode(features, mask)
    assert torch.equal(valid, out.attention_mask[0])
    assert got.shape[0] == _processor_soft_tokens(mask)


def test_tower_matches_transformers_at_bf16(checkpoint):
    features, mask = _reference_features(_speechlike(1.377, seed=5))
    model = hf_tiny.load(checkpoint, dtype=torch.bfloat16)
    with torch.no_grad():
        out = model.model.get_audio_features(
            features[None], mask[None], return_dict=True
        )
    want = out.pooler_output[0][out.attention_mask[0]].float()
    got = torchtpu_cpp.AudioTower(checkpoint, dtype="bfloat16").embed(features, mask)
    assert got.dtype == torch.bfloat16
    err = (got.float() - want).abs().max().item() / want.abs().max().item()
    assert err <= BF16_TOL, f"max |Δ| / scale = {err:.2e}"


def test_tower_refuses_features_it_cannot_take(checkpoint, tmp_path):
    tower = torchtpu_cpp.AudioTower(checkpoint, dtype="float32")
    features, mask = _reference_features(_speechlike(0.5, seed=1))
    with pytest.raises(
        ValueError, match="audio features have 64 mel bins, but this checkpoint"
    ):
        tower.embed(features[:, :64], mask)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        tower.embed(features, mask.float())
    with pytest.raises(ValueError, match="audio features must be a float tensor"):
        tower.embed(features[None], mask)


def test_text_only_checkpoint_has_no_audio_tower(tmp_path):
    config = hf_tiny.text_config(layer_types=[hf_tiny.S, hf_tiny.F])
    directory = hf_tiny.make(
        str(tmp_path / "text"), config, seed=1, multimodal_prefix=True
    )
    with pytest.raises(
        ValueError, match="has no audio encoder: config.json has no audio_config"
    ):
        torchtpu_cpp.AudioTower(directory, dtype="float32")


# Lengths around the edges: the shortest clip with a frame, one sample either side of a
# 128-sample and a 160-sample boundary, 0.3 s, 2 s and the 30 s maximum.
@pytest.mark.parametrize(
    "samples", [161, 1023, 1024, 1025, 1599, 1600, 1601, 4800, 32000, 480000]
)
def test_features_match_the_feature_extractor(samples):
    wave_ = _speechlike(samples / RATE, seed=samples)
    want_features, want_mask = _reference_features(wave_)
    got = torchtpu_cpp.audio_features(torch.from_numpy(wave_))
    assert torch.equal(got["mask"], want_mask)
    assert got["features"].dtype == torch.float32
    assert got["features"].shape == want_features.shape
    err = (got["features"] - want_features).abs().max().item()
    assert err <= 1e-5 * want_features.abs().max().item(), err
    assert got["soft_tokens"] == _processor_soft_tokens(want_mask)


# The extractor's other parameters, as a checkpoint's preprocessor_config.json may set them.
EXTRACTOR_VARIANTS = {
    "preemphasis-htk": dict(preemphasis=0.97),
    "preemphasis-plain": dict(preemphasis=0.5, preemphasis_htk_flavor=False),
    "overdrive-band-floor": dict(
        fft_overdrive=True, min_frequency=125.0, max_frequency=7600.0, mel_floor=1e-5
    ),
    "scaled-80-bins-25ms": dict(
        input_scale_factor=0.5,
        feature_size=80,
        frame_length_ms=25.0,
        hop_length_ms=12.5,
    ),
    "8khz": dict(sampling_rate=8000, max_frequency=4000.0),
}


@pytest.mark.parametrize("variant", sorted(EXTRACTOR_VARIANTS))
def test_extractor_parameters_match(variant):
    kwargs = EXTRACTOR_VARIANTS[variant]
    rate = kwargs.get("sampling_rate", RATE)
    wave_ = _speechlike(1.23, seed=7, rate=rate)
    out = Gemma4AudioFeatureExtractor(**kwargs)([wave_], return_tensors="pt")
    want_features, want_mask = out["input_features"][0], out["input_features_mask"][0]
    got = torchtpu_cpp.audio_features(torch.from_numpy(wave_), **kwargs)
    assert torch.equal(got["mask"], want_mask)
    assert got["features"].shape == want_features.shape
    err = (got["features"] - want_features).abs().max().item()
    assert err <= 1e-5 * want_features.abs().max().item(), err


@pytest.mark.parametrize("layout", ["preprocessor_config", "processor_config"])
def test_saved_extractor_parameters_are_loaded(tmp_path, layout):
    extractor = Gemma4AudioFeatureExtractor(
        preemphasis=0.9, fft_overdrive=True, min_frequency=60.0, mel_floor=1e-4
    )
    if layout == "preprocessor_config":
        extractor.save_pretrained(tmp_path)
    else:
        (tmp_path / "processor_config.json").write_text(
            json.dumps({"feature_extractor": json.loads(extractor.to_json_string())})
        )
    options = torchtpu_cpp.load_audio_feature_options(str(tmp_path))
    wave_ = _speechlike(0.9, seed=4)
    want = Gemma4AudioFeatureExtractor.from_pretrained(tmp_path)(
        [wave_], return_tensors="pt"
    )
    got = torchtpu_cpp.audio_features(torch.from_numpy(wave_), **options)
    err = (got["features"] - want["input_features"][0]).abs().max().item()
    assert err <= 1e-5 * want["input_features"][0].abs().max().item(), err


def test_saved_extractor_parameters_we_cannot_honour(tmp_path):
    assert torchtpu_cpp.load_audio_feature_options(str(tmp_path))["mel_floor"] == 1e-3
    Gemma4AudioFeatureExtractor(dither=1e-4).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"preprocessor_config.json: dither = 0.0001 is not"
    ):
        torchtpu_cpp.load_audio_feature_options(str(tmp_path))
    Gemma4AudioFeatureExtractor(per_bin_mean=[0.0] * 128).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="per_bin_mean is not supported"):
        torchtpu_cpp.load_audio_feature_options(str(tmp_path))


def test_silence_hits_the_mel_floor():
    got = torchtpu_cpp.audio_features(torch.zeros(8000))
    want_features, _ = _reference_features(np.zeros(8000, np.float32))
    assert torch.allclose(got["features"], want_features, rtol=0, atol=1e-6)
    assert math.isclose(got["features"][0, 0].item(), math.log(1e-3), rel_tol=1e-6)


# --- WAV decoding ---


def _wav(
    frames: bytes, *, channels, width, rate, fmt_tag=1, bits=None, extensible=False
):
    bits = bits or 8 * width
    block = channels * width
    if extensible:
        guid = (
            struct.pack("<H", fmt_tag)
            + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        )
        fmt = struct.pack(
            "<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0
        )
        fmt += guid
    else:
        fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * block, block, bits)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += (
        b"LIST" + struct.pack("<I", 5) + b"INFOx\x00"
    )  # an odd chunk with its pad byte
    chunks += b"data" + struct.pack("<I", len(frames)) + frames
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _pcm_with_wave_module(samples, *, width, rate):
    """Integer samples [N, channels] written by Python's wave module."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 3:
            raw = samples.astype("<i4").tobytes()
            w.writeframes(b"".join(raw[i : i + 3] for i in range(0, len(raw), 4)))
        elif width == 1:
            w.writeframes((samples + 128).astype(np.uint8).tobytes())
        else:
            w.writeframes(samples.astype(f"<i{width}").tobytes())
    return buf.getvalue()


@pytest.mark.parametrize(
    "width,channels,rate",
    [(1, 1, 16000), (2, 1, 16000), (2, 2, 44100), (3, 2, 22050), (4, 3, 8000)],
)
def test_pcm_wav_matches_wave_module(width, channels, rate):
    rng = np.random.default_rng(width * 10 + channels)
    top = 2 ** (8 * width - 1)
    ints = rng.integers(-top, top, size=(rate // 10, channels))
    ints[:2] = [[-top] * channels, [top - 1] * channels]  # the extremes
    data = _pcm_with_wave_module(ints, width=width, rate=rate)
    with wave.open(io.BytesIO(data)) as w:  # the reader's view of what was written
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (
            channels,
            width,
            rate,
        )
    samples, got_rate = torchtpu_cpp.decode_audio(data)
    want = (ints.astype(np.float64) / top).mean(axis=1).astype(np.float32)
    assert got_rate == rate
    np.testing.assert_allclose(samples.numpy(), want, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    "dtype,extensible", [("<f4", False), ("<f8", False), ("<f4", True)]
)
def test_float_wav_matches_numpy(dtype, extensible):
    values = np.random.default_rng(3).uniform(-1, 1, size=(1000, 2)).astype(dtype)
    width = np.dtype(dtype).itemsize
    data = _wav(
        values.tobytes(),
        channels=2,
        width=width,
        rate=16000,
        fmt_tag=3,
        extensible=extensible,
    )
    samples, rate = torchtpu_cpp.decode_audio(data)
    assert rate == 16000
    np.testing.assert_allclose(
        samples.numpy(), values.astype(np.float64).mean(1), rtol=0, atol=1e-7
    )


def _float_wav(values):
    """IEEE float WAV at 16 kHz of `values` [frames] or [frames, channels]."""
    channels = 1 if values.ndim == 1 else values.shape[1]
    return _wav(
        values.tobytes(),
        channels=channels,
        width=values.itemsize,
        rate=16000,
        fmt_tag=3,
    )


@pytest.mark.parametrize(
    "bad,shown", [(math.nan, "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf")]
)
def test_a_sample_that_is_not_finite_is_refused_by_its_index(bad, shown):
    """One NaN or infinite sample would make every feature frame it falls in NaN (and
    the tower's attention fail): the first is named, in a WAV file and a tensor."""
    shown = re.escape(shown)
    values = np.zeros((1600, 2), "<f4")
    values[700, 1] = bad
    values[900, 0] = bad
    with pytest.raises(
        ValueError,
        match=rf"^WAV sample 700 \(channel 1\) is not finite \({shown}\)$",
    ):
        torchtpu_cpp.decode_audio(_float_wav(values))
    with pytest.raises(
        ValueError, match=rf"^WAV sample 700 is not finite \({shown}\)$"
    ):
        torchtpu_cpp.audio_features(_float_wav(values[:, 1].astype("<f8")))
    samples = torch.zeros(16000)
    samples[1234] = bad
    with pytest.raises(
        ValueError, match=rf"^audio sample 1234 is not finite \({shown}\)$"
    ):
        torchtpu_cpp.audio_features(samples)


def test_loud_but_finite_samples_are_read():
    values = np.zeros(1600, "<f4")
    values[700] = 1e30
    samples, _ = torchtpu_cpp.decode_audio(_float_wav(values))
    assert samples[700] == np.float32(1e30)
    assert torch.isfinite(torchtpu_cpp.audio_features(samples)["features"]).all()
    # Pre-emphasis of samples near float32's limit overflows: refused, not handed on.
    peaks = torch.full((16000,), 3e38)
    peaks[1::2] = -3e38
    with pytest.raises(
        ValueError, match=r"^audio clip is too loud: its log-mel features overflow"
    ):
        torchtpu_cpp.audio_features(peaks, preemphasis=0.97)
    # A 64-bit sample past float32's range would be infinite once narrowed: refused.
    wide = np.zeros(1600, "<f8")
    wide[800] = -1e39
    with pytest.raises(
        ValueError, match=r"^WAV sample 800 is -1e\+39, beyond the range of float32"
    ):
        torchtpu_cpp.decode_audio(_float_wav(wide))


def test_resampling_matches_the_analytic_signal():
    """Tones at 44.1, 8, 22.05 and 48 kHz resampled to 16 kHz against the same tones
    sampled at 16 kHz, away from the clip's edges (where the filter sees the zeros outside
    the clip)."""

    def tones(rate, n):
        t = np.arange(n) / rate
        return 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(
            2 * np.pi * 3100 * t + 1
        )

    for rate in (44100, 8000, 22050, 48000):
        x = torch.from_numpy(tones(rate, rate).astype(np.float32))
        y = torchtpu_cpp.resample_audio(x, rate, RATE).numpy()
        assert y.shape == (math.ceil(rate * RATE / rate),)
        want = tones(RATE, y.size)
        edge = 400
        err = np.abs(y[edge:-edge] - want[edge:-edge]).max()
        assert err < 1e-3, (rate, err)


def test_wav_features_resample_other_rates():
    x = _speechlike(1.0, seed=9, rate=44100)
    ints = np.round(x * 32767).astype(np.int64)[:, None]
    data = _pcm_with_wave_module(ints, width=2, rate=44100)
    got = torchtpu_cpp.audio_features(data)
    samples, _ = torchtpu_cpp.decode_audio(data)
    want = torchtpu_cpp.audio_features(
        torchtpu_cpp.resample_audio(samples, 44100, RATE)
    )
    assert torch.equal(got["features"], want["features"])
    assert got["soft_tokens"] == 25  # 1 s at 40 ms per soft token


def _mp3(samples, rate):
    """MP3 bytes from libsndfile's encoder (LAME, in soundfile's wheel)."""
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="MP3")
    return out.getvalue()


@pytest.mark.parametrize("channels,rate", [(1, 16000), (2, 44100), (2, 48000)])
def test_mp3_matches_libsndfile(channels, rate):
    """MP3 decoded by libmpg123 here and by libsndfile (soundfile, what librosa reads MP3 with):
    the same samples, encoder delay and padding dropped alike, channels averaged."""
    x = np.stack([_speechlike(1.5, seed=11 + c, rate=rate) for c in range(channels)], 1)
    data = _mp3(x, rate)
    want, want_rate = soundfile.read(io.BytesIO(data), dtype="float64")
    samples, got_rate = torchtpu_cpp.decode_audio(data)
    assert got_rate == want_rate == rate
    want = want.mean(axis=1) if want.ndim == 2 else want
    assert samples.shape == want.shape
    np.testing.assert_allclose(samples.numpy(), want, rtol=0, atol=1e-6)
    # The features of the file: its samples resampled, as for WAV.
    got = torchtpu_cpp.audio_features(data)
    resampled = torchtpu_cpp.resample_audio(samples, rate, RATE)
    assert torch.equal(got["features"], torchtpu_cpp.audio_features(resampled)["features"])


def test_mp3_longer_than_the_limit_is_refused():
    data = _mp3(_speechlike(3.0, seed=2, rate=16000), 16000)
    with pytest.raises(ValueError, match="audio clip is longer than the limit of 2.00 s"):
        torchtpu_cpp.decode_audio(data, max_seconds=2.0)


def test_bad_audio_inputs_are_value_errors():
    good = _pcm_with_wave_module(np.zeros((1600, 1), np.int64), width=2, rate=16000)
    with pytest.raises(
        ValueError,
        match=r"truncated WAV file: chunk \"data\" at byte 36 declares 3200 bytes but "
        "only 3000 remain",
    ):
        torchtpu_cpp.decode_audio(good[:-200])
    with pytest.raises(
        ValueError,
        match=r"audio is neither WAV \(a RIFF/WAVE header\) nor MP3 \(an ID3 tag or an MPEG "
        r"frame sync\): its 104 bytes start with 4f 67 67 53",
    ):
        torchtpu_cpp.decode_audio(b"OggS" + bytes(100))
    with pytest.raises(
        ValueError, match="not a readable MP3 file: no MPEG audio frames in its 104 bytes"
    ):
        torchtpu_cpp.decode_audio(b"ID3\x04" + bytes(100))
    adpcm = _wav(bytes(256), channels=1, width=1, rate=16000, fmt_tag=2, bits=4)
    with pytest.raises(
        ValueError,
        match=r"unsupported WAV encoding: format 0x0002 \(Microsoft ADPCM\) with 4 bits",
    ):
        torchtpu_cpp.decode_audio(adpcm)
    long = _pcm_with_wave_module(
        np.zeros((16000 * 31, 1), np.int64), width=2, rate=16000
    )
    two_seconds = _pcm_with_wave_module(
        np.zeros((32000, 1), np.int64), width=2, rate=16000
    )
    with pytest.raises(
        ValueError, match="audio clip is 31.00 s long, more than the limit of 30.00 s"
    ):
        torchtpu_cpp.audio_features(long)
    with pytest.raises(
        ValueError, match="audio clip is 2.00 s long, more than the limit of 1.50 s"
    ):
        torchtpu_cpp.decode_audio(two_seconds, max_seconds=1.5)
    with pytest.raises(
        ValueError,
        match=r"audio clip is 30.00 s \(480001 samples at 16000 Hz\), more than the limit "
        r"of 30.00 s \(480000 samples\)",
    ):
        torchtpu_cpp.audio_features(torch.zeros(480001))
    with pytest.raises(
        ValueError, match="audio clip is too short: 160 samples at 16000 Hz"
    ):
        torchtpu_cpp.audio_features(torch.zeros(160))
    with pytest.raises(ValueError, match="need 0 <= min_frequency < max_frequency <= "):
        torchtpu_cpp.audio_features(torch.zeros(8000), max_frequency=9000.0)
    with pytest.raises(
        ValueError, match="hop_length_ms give frames of 320 and hops of 0"
    ):
        torchtpu_cpp.audio_features(torch.zeros(8000), hop_length_ms=0.0)
    fast = _wav(bytes(64), channels=1, width=2, rate=1_000_000)
    with pytest.raises(
        ValueError, match="WAV sample rate 1000000 Hz is outside the supported"
    ):
        torchtpu_cpp.decode_audio(fast)
    with pytest.raises(
        ValueError, match="resampling 16000 Hz to 10 Hz: rates must be within"
    ):
        torchtpu_cpp.resample_audio(torch.zeros(100), 16000, 10)
