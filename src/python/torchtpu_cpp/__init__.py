"""Gemma 4 in C++ over ATen, from Python: Engine (weights + ring KV cache), Tokenizer,
ChatTemplate / render_chat, the smoke functions, and the OpenAI-compatible server
(`python -m torchtpu_cpp.serve`). docs/BINDINGS.md lists every Python <-> C++ crossing."""

import torch

from ._build import TORCH_VERSION as _BUILT_AGAINST

# The extension links libtorch's C++ ABI, which changes between torch releases and builds (a
# +cu130 wheel links libraries a +cpu wheel lacks), so only the exact version it was compiled
# against may load it.
if str(torch.__version__) != _BUILT_AGAINST:
    raise ImportError(
        f"torchtpu_cpp was built against torch {_BUILT_AGAINST}, but torch {torch.__version__} "
        "is installed; rebuild it against this torch: pip install --no-build-isolation ."
    )

from ._torchtpu_cpp import (
    BUILD,
    AudioTower,
    Batch,
    ChatTemplate,
    DecodeResult,
    Engine,
    ImagePatches,
    Media,
    Tokenizer,
    TokenLogprob,
    VisionTower,
    __version__,
    add_,
    audio_features,
    decode_audio,
    decode_image,
    download,
    load_audio_feature_options,
    make_tiny,
    matmul_sum,
    preprocess_image,
    ramp,
    render_chat,
    resample_audio,
)

__all__ = [
    "BUILD",
    "AudioTower",
    "Batch",
    "ChatTemplate",
    "DecodeResult",
    "Engine",
    "ImagePatches",
    "Media",
    "Tokenizer",
    "TokenLogprob",
    "VisionTower",
    "__version__",
    "add_",
    "audio_features",
    "decode_audio",
    "decode_image",
    "download",
    "load_audio_feature_options",
    "make_tiny",
    "matmul_sum",
    "preprocess_image",
    "ramp",
    "render_chat",
    "resample_audio",
]
