# Type stub of torchtpu_cpp (the pybind11 extension _torchtpu_cpp re-exported by __init__).
from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from typing import Any, Final, Literal, SupportsIndex, TypeAlias, TypedDict

import torch

__version__: Final[str]

class _Build(TypedDict):
    version: str
    git_revision: str
    torch: str
    compiler: str
    cxx_standard: str
    cxx11_abi: bool
    python: str
    pybind11: str

BUILD: Final[_Build]

class _Layout(TypedDict):
    full_rings: int
    sliding_rings: int
    shared_layers: int
    context: int
    row_bytes: int

_Ids: TypeAlias = Iterable[SupportsIndex]
_DType: TypeAlias = str | torch.dtype

class DecodeResult:
    @property
    def tokens(self) -> list[int]: ...
    @property
    def finish(self) -> Literal["stop", "length", "cancelled"]: ...
    @property
    def stop_id(self) -> int | None: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def read_s(self) -> float: ...
    @property
    def decode_s(self) -> float: ...
    @property
    def drafted(self) -> int: ...
    @property
    def accepted(self) -> int: ...

class TokenLogprob:
    """One token's log-probability under the logits that scored it (Engine.score)."""

    @property
    def id(self) -> int: ...
    @property
    def logprob(self) -> float: ...
    @property
    def rank(self) -> int:
        """1 + how many tokens the logits put above this one."""
    @property
    def top(self) -> list[tuple[int, float]]:
        """The likeliest (id, logprob) pairs under those logits, best first."""

class _CacheStats(TypedDict):
    hits: int
    misses: int
    reused_tokens: int
    saves: int
    evictions: int
    states: int
    bytes: int

class _BatchStats(TypedDict):
    rows: int
    queued: int
    reading: int
    decoding: int
    steps: int
    cache: _CacheStats

class Media:
    """One preprocessed image or audio clip (Engine.media)."""

    @property
    def kind(self) -> Literal["image", "audio"]: ...
    @property
    def soft_tokens(self) -> int: ...
    @property
    def digest(self) -> int:
        """FNV-1a of the preprocessed tensors: equal inputs, equal digests (the prefix cache's
        key for the item's positions)."""

class Batch:
    """Sequences decoded together over one Engine's weights (Engine.batch). The engine's owner
    thread only; step and decode_many release the GIL."""

    def submit(
        self,
        ids: _Ids,
        max_new: int,
        stop: Iterable[SupportsIndex] | None = (1, 106, 50),
        read_every: int = 1,
        on_tokens: Callable[[list[int]], object] | None = None,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] = {},
        seed: int | None = None,
        grammar_kind: str | None = None,
        grammar: str = "",
        thinking_budget: int | None = None,
        thinking_budget_message: str = "",
        media: Sequence[Media] = (),
        draft_max: int = 0,
        draft_ngram_min: int = 2,
        draft_ngram_max: int = 4,
        draft_always: bool = False,
        lora: dict[str, float] | None = None,
        cache_salt: str | None = None,
        reuse_points: _Ids = (),
    ) -> int:
        """Queues a sequence with Engine.decode's arguments (read_every taken as 1); its id.
        cache_salt: the prefix cache shares states only under the same salt; reuse_points:
        positions where the cache saves a state, for later prompts that part from this one there."""
    def decode_many(
        self,
        prompts: Iterable[_Ids],
        max_new: int,
        stop: Iterable[SupportsIndex] | None = (1, 106, 50),
        read_every: int = 1,
        on_tokens: Callable[[int, list[int]], object] | None = None,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] = {},
        seed: int | None = None,
        grammar_kind: str | None = None,
        grammar: str = "",
        thinking_budget: int | None = None,
        thinking_budget_message: str = "",
        media: Sequence[Media] = (),
        draft_max: int = 0,
        draft_ngram_min: int = 2,
        draft_ngram_max: int = 4,
        draft_always: bool = False,
        lora: dict[str, float] | None = None,
        cache_salt: str | None = None,
        reuse_points: _Ids = (),
    ) -> list[DecodeResult]:
        """Every prompt decoded together with the same arguments; results in order, each what
        Engine.decode gives that prompt alone. on_tokens(index, tokens); falsy cancels one."""
    def step(self) -> list[int]:
        """One scheduler step; the ids that finished (their results wait in result())."""
    def cancel(self, id: int) -> None:
        """Ends a queued or running sequence at the next step (finish 'cancelled'): its result
        waits for that step() to report the id. ValueError for an id that is neither."""
    def result(self, id: int) -> DecodeResult:
        """A finished sequence's result, handed over once."""
    def save_slot(self, row: int, path: str) -> dict[str, int]:
        """Writes the prefix cache state that row `row`'s last sequence left (or the last one
        restored into it) to `path` (llama-server's slot save): {'tokens', 'bytes'}."""
    def restore_slot(self, row: int, path: str) -> dict[str, int]:
        """Reads a state save_slot wrote (any engine on the same weights) as row `row`'s:
        {'tokens', 'bytes'}."""
    def erase_slot(self, row: int) -> int:
        """Forgets row `row`'s state in the prefix cache; the tokens it held (0: none)."""
    @property
    def idle(self) -> bool: ...
    def stats(self) -> _BatchStats: ...

class Engine:
    """Weights and ring KV cache on one device. Only the creating thread may use it
    (RuntimeError from any other); load, logits and decode release the GIL."""

    def __init__(
        self,
        model_dir: str,
        emb4_dir: str | None = None,
        like: torch.Tensor | None = None,
        context: int = 32768,
        *,
        device: str | None = None,
        dtype: _DType = "bfloat16",
        prefill_chunk: int = 512,
        threads: int = 0,
        int4: Literal["auto", "packed", "composite", "dequantized"] = "auto",
        quantize: Literal["int4", "none"] | None = None,
        int4_activation_bits: Literal[16, 8] = 16,
        no_vision: bool = False,
        no_audio: bool = False,
        draft_model: str | None = None,
        lora: Sequence[str] = (),
        max_lora: int = 8,
    ) -> None:
        """threads: intra-op threads (0: OMP_NUM_THREADS when set, else the physical cores; the
        process-wide ATen setting).
        int4: how int4 weights are held (docs/ARCHITECTURE.md). quantize="int4" quantizes a
        dense checkpoint's linears and head at load. int4_activation_bits=8: the int4 kernel's
        fast mode for several rows (8-bit activations). no_vision / no_audio leave the
        checkpoint's image / audio tower unloaded. draft_model: the model's Gemma 4 assistant
        (model_type gemma4_assistant); decodes that draft (draft_max) take its drafts instead
        of prompt lookup's. ValueError when it does not fit the model. lora: LoRA adapters in
        PEFT's format, "[NAME=]DIR" each, applied at scale 1 unless a call's `lora` gives
        {name: scale} (the adapters it leaves out at 0); ValueError naming what an adapter holds
        that cannot be applied. max_lora: the most adapters loaded at once (load_lora)."""
    def draft(self, ids: Sequence[int], count: int) -> list[int]:
        """The model's greedy next token after the prompt `ids`, then `count` tokens the
        assistant (draft_model) guesses after it: what a decode's first drafting pass checks.
        ValueError without a draft model, for a bad prompt or a count below 1."""
    def sleep(self) -> None:
        """Frees the weights, towers and rings (the server's --sleep-idle-seconds); properties
        and checks still answer, a call that runs the model raises RuntimeError until wake().
        RuntimeError while a Batch of this engine is alive."""
    def wake(self) -> None:
        """Loads the weights again as the constructor did; nothing when awake."""
    def load_lora(self, dir: str, *, name: str | None = None, scale: float = 1.0) -> None:
        """Loads a LoRA adapter (PEFT's format) beside the weights, called `name` (dir's last
        part when None), at `scale` for calls that name none. ValueError for a name loaded
        already, more than max_lora adapters, or what the adapter holds that cannot be
        applied."""
    def unload_lora(self, name: str) -> None:
        """Unloads the LoRA adapter `name`: later calls cannot name it; a Batch sequence that
        applies it keeps it until it ends. ValueError naming those loaded when none is so
        called."""
    def set_lora_scales(self, scales: dict[str, float]) -> None:
        """Each adapter's scale for later calls that name none: those in `scales` at theirs,
        the rest at 0. ValueError, and nothing changed, for a name not loaded."""
    @property
    def asleep(self) -> bool: ...
    def layout(self) -> _Layout: ...
    def report(self) -> dict[str, Any]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def load_seconds(self) -> float: ...
    @property
    def owner_thread(self) -> str: ...
    def logits(
        self, ids: _Ids, *, media: Sequence[Media] = (), lora: dict[str, float] | None = None
    ) -> torch.Tensor:
        """float32 [len(ids), vocab] of one causal pass; the KV cache is untouched. lora: each
        adapter's scale by name (those left out at 0); None: every adapter at scale 1."""
    def score(
        self,
        ids: _Ids,
        *,
        top: int = 0,
        media: Sequence[Media] = (),
        lora: dict[str, float] | None = None,
    ) -> list[TokenLogprob]:
        """Each token of ids after the first scored under the positions before it, in order
        (len(ids) - 1 entries, each with its `top` likeliest tokens), read 64 positions through
        the head at a time: no [len(ids), vocab] array is held, nothing is generated. ValueError
        for fewer than two ids, top outside [0, vocab_size], or what logits() refuses."""
    @property
    def has_vision(self) -> bool: ...
    @property
    def has_audio(self) -> bool: ...
    def media(
        self,
        *,
        images: list[bytes | torch.Tensor] = [],
        audio: list[bytes | torch.Tensor] = [],
        image_tokens: int = 280,
    ) -> list[Media]:
        """Images (encoded bytes or RGB uint8 [3, H, W]) and clips (WAV or MP3 bytes or mono float
        samples at the checkpoint's rate) preprocessed, images first. ValueError naming a
        missing or disabled tower or a bad input."""
    def expand_media(self, ids: _Ids, media: Sequence[Media]) -> list[int]:
        """Each image_token_id (audio_token_id) of ids becomes boi, the n-th image's (clip's)
        soft tokens, eoi (boa ... eoa). ValueError when placeholders and items differ."""
    def batch(
        self,
        rows: int = 4,
        step_tokens: int = 0,
        cache_mb: float = 0.0,
        cache_block: int = 256,
        pass_rows: int = 0,
    ) -> Batch:
        """A Batch of `rows` sequences over these weights (rings of its own); step_tokens bounds
        the tokens of one step (0: prefill_chunk + rows); cache_mb > 0 keeps a prefix cache of
        that many MiB in blocks of cache_block positions; pass_rows bounds the rows of a pass
        reading several prompts (0: 1 on the CPU, no limit elsewhere)."""
    def generate(
        self, ids: _Ids, max_new: int, read_every: int = 1
    ) -> tuple[list[int], float, float]:
        """Exactly max_new greedy tokens (no stop ids): (tokens, read_s, decode_s)."""
    def decode(
        self,
        ids: _Ids,
        max_new: int,
        stop: Iterable[SupportsIndex] | None = (1, 106, 50),
        read_every: int = 1,
        on_tokens: Callable[[list[int]], object] | None = None,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] = {},
        seed: int | None = None,
        grammar_kind: str | None = None,
        grammar: str = "",
        thinking_budget: int | None = None,
        thinking_budget_message: str = "",
        media: Sequence[Media] = (),
        draft_max: int = 0,
        draft_ngram_min: int = 2,
        draft_ngram_max: int = 4,
        draft_always: bool = False,
        lora: dict[str, float] | None = None,
    ) -> DecodeResult:
        """Decode (greedy unless temperature > 0) ending at a stop id (None: the checkpoint's eos
        ids; empty: none), max_new tokens, or a falsy on_tokens return ("cancelled").
        grammar_kind "json_schema", "json_object", "regex" or "lark" with `grammar` constrains
        every token to the grammar (llguidance; the checkpoint's tokenizer.json gives the
        vocabulary); ValueError for a grammar it cannot enforce. thinking_budget: once that many
        tokens follow <|channel> (in ids or the output), thinking_budget_message's tokens and then
        <channel|> are forced. media: the images and clips of `ids` (Engine.media), whose
        placeholders expand_media has expanded. draft_max > 0: speculative decoding by prompt
        lookup (up to draft_max tokens that followed the last draft_ngram_max..draft_ngram_min
        tokens earlier on, checked in one pass), the same tokens, in a Batch as well; a draft is
        checked only while drafts give tokens faster than plain steps, unless draft_always.
        lora: each LoRA adapter's scale by name, those left out at 0 (None: every adapter at the
        scale it was loaded with); ValueError naming an adapter that is not loaded."""

class Tokenizer:
    def __init__(self, path: str) -> None: ...
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...
    def decode(self, ids: _Ids, skip_special_tokens: bool = False) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    def token_to_id(self, token: str) -> int | None: ...
    def id_to_token(self, id: int) -> str: ...
    def __len__(self) -> int: ...

class ChatTemplate:
    def __init__(self, path: str) -> None: ...
    @staticmethod
    def from_string(
        source: str, bos_token: str = "<bos>", eos_token: str = "<eos>"
    ) -> ChatTemplate: ...
    @property
    def source(self) -> str: ...
    def caps(self) -> dict[str, bool]:
        """What the template renders of each kind of chat content (llama.cpp's
        chat_template_caps: supports_system_role, supports_tools, ...), found by rendering probe
        conversations; the server's GET /props reports them."""
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
        **kwargs: Any,
    ) -> str: ...

def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool = False,
    *,
    template: str | PathLike[str] | ChatTemplate,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str: ...
def matmul_sum(x: torch.Tensor) -> torch.Tensor:
    """(x @ x.T).sum() by ATen in C++: a 0-d tensor on x's device."""

def download(repo_id: str) -> str:
    """Downloads what the engine reads of a Hub repository (`org/name[@revision]`) into
    huggingface_hub's cache, or finds it there; the snapshot directory."""

def make_tiny(out: str, *, preset: str = "tiny", seed: int = 0, dtype: str = "f32") -> None:
    """A Gemma 4 checkpoint with random weights in `out`, a new or empty directory (preset "tiny"
    or "e2b"), as make-tiny."""

def ramp(n: int, like: torch.Tensor | None = None, dtype: _DType = "bfloat16") -> torch.Tensor:
    """[0, ..., n-1] built in C++ and moved to like's device."""

def add_(x: torch.Tensor, value: float) -> torch.Tensor:
    """x += value in C++, in place; returns x itself."""

def decode_image(
    data: bytes, *, max_bytes: int = 33554432, max_pixels: int = 67108864
) -> torch.Tensor:
    """JPEG, PNG or WebP bytes to RGB uint8 [3, H, W], as Pillow's convert("RGB")."""

class ImagePatches:
    """One image preprocessed as Gemma4ImageProcessor does it, without the padding."""

    @property
    def pixels(self) -> torch.Tensor:
        """float32 [P, 3 * patch_size**2] in [0, 1]."""
    @property
    def positions(self) -> torch.Tensor:
        """int64 [P, 2] (x, y) patch coordinates."""
    @property
    def soft_tokens(self) -> int:
        """Image tokens the prompt needs: P / pooling_kernel_size**2."""

def preprocess_image(
    image: bytes | torch.Tensor,
    max_soft_tokens: int = 280,
    *,
    patch_size: int = 16,
    pooling_kernel_size: int = 3,
    max_bytes: int = 33554432,
    max_pixels: int = 67108864,
) -> ImagePatches:
    """Encoded bytes or RGB uint8 [3, H, W] to patches for a soft-token budget (70 ... 1120)."""

class VisionTower:
    """Gemma 4's vision encoder and its projection into the text model."""

    def __init__(
        self, model_dir: str, *, dtype: _DType = "bfloat16", device: str | None = None
    ) -> None: ...
    def embed(self, pixels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Soft tokens [soft_tokens, text hidden_size] of one image's patches."""
    @property
    def soft_token_width(self) -> int:
        """The text model's hidden size."""
class _AudioFeatures(TypedDict):
    features: torch.Tensor  # [T, 128] float32 log-mel, zero at invalid frames
    mask: torch.Tensor  # [T] bool
    soft_tokens: int

def decode_audio(data: bytes, *, max_seconds: float = 30.0) -> tuple[torch.Tensor, int]:
    """WAV or MP3 bytes -> (mono float32 samples, sample rate); ValueError for bad or long
    files."""

def resample_audio(samples: torch.Tensor, from_rate: int, to_rate: int) -> torch.Tensor:
    """Windowed-sinc resampling of mono samples (Kaiser window, 32 zero crossings)."""

def audio_features(
    audio: bytes | torch.Tensor,
    *,
    max_samples: int = 480000,
    feature_size: int = 128,
    sampling_rate: int = 16000,
    frame_length_ms: float = 20.0,
    hop_length_ms: float = 10.0,
    min_frequency: float = 0.0,
    max_frequency: float = 8000.0,
    preemphasis: float = 0.0,
    preemphasis_htk_flavor: bool = True,
    fft_overdrive: bool = False,
    input_scale_factor: float = 1.0,
    mel_floor: float = 1e-3,
) -> _AudioFeatures:
    """Gemma 4 log-mel features of WAV or MP3 bytes or of mono samples at sampling_rate; the
    keywords are Gemma4AudioFeatureExtractor's."""

def load_audio_feature_options(model_dir: str) -> dict[str, Any]:
    """The feature extractor's parameters a checkpoint saves, as audio_features' keywords."""

class AudioTower:
    """The audio encoder and embed_audio of a checkpoint directory."""

    def __init__(
        self, model_dir: str, *, dtype: _DType = "bfloat16", device: str | None = None
    ) -> None: ...
    def embed(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[soft_tokens, text hidden] embeddings at the valid positions."""
    def encode(
        self, features: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output [T/4, output_proj_dims] and its mask, before embed_audio."""
