"""Independent float64 reference for Gemma 4 text checkpoints (see gemma4.py)."""

from .gemma4 import Reference

__all__ = ["Reference"]
