"""Dequantizes compressed-tensors "pack-quantized" int4 tensors to float64.

Layout (research/formats.md §1, checked against compressed_tensors.compressors.pack_quantized):
weight_packed I32 [out, ceil(in/8)], column 8j+i of a row in bits 4i..4i+3 of word j, stored as the
unsigned nibble q+8; weight_scale [out, n_groups] (n_groups = 1: per channel); optional
weight_zero_point I32 [ceil(out/8), n_groups] packed the same way along the output dim; optional
weight_g_idx [in] giving the group of each column. w = (nibble - zero_nibble) * scale, with
zero_nibble = 8 when no zero point is stored.
"""

import numpy as np


def unpack_nibbles(packed, count, axis):
    """The unsigned nibbles of an I32 array packed along `axis` (0 or 1), trimmed to `count`."""
    words = np.ascontiguousarray(packed if axis == 1 else packed.T).astype("<i4")
    as_bytes = words.view(np.uint8).reshape(words.shape[0], -1)
    nibbles = np.stack((as_bytes & 0xF, as_bytes >> 4), axis=-1).reshape(words.shape[0], -1)
    if nibbles.shape[1] < count:
        raise ValueError(
            f"packed width {words.shape[1]} words holds {nibbles.shape[1]} values, need {count}"
        )
    nibbles = nibbles[:, :count].astype(np.int64)
    return nibbles if axis == 1 else nibbles.T


def round_to_storage(x, dtype_name):
    """Rounds float64 values to a safetensors float dtype (round to nearest even), back in
    float64. compressed-tensors' decompressor returns (q - zp) * scale in the scale's dtype, so the
    dequantized weight is that product rounded once to it."""
    if dtype_name == "F64":
        return x
    if dtype_name == "F16":
        return x.astype(np.float16).astype(np.float64)
    f32 = x.astype(np.float32)
    if dtype_name == "F32":
        return f32.astype(np.float64)
    if dtype_name == "BF16":
        bits = f32.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"not a float dtype: {dtype_name}")


def dequantize(packed, scale, shape, zero_point=None, g_idx=None, scale_dtype="F64"):
    """Float64 weight [out, in] from the pack-quantized tensors (scale already float64, stored as
    `scale_dtype`, the dtype the product is rounded to)."""
    out_features, in_features = (int(v) for v in np.asarray(shape).reshape(-1))
    if packed.shape[0] != out_features or packed.shape[1] != -(-in_features // 8):
        raise ValueError(
            f"weight_packed {list(packed.shape)} does not fit "
            f"weight_shape {[out_features, in_features]}"
        )
    n_groups = scale.shape[1]
    if scale.shape[0] != out_features:
        raise ValueError(f"weight_scale {list(scale.shape)} does not fit {out_features} rows")
    if g_idx is not None:
        group_of_column = np.asarray(g_idx, dtype=np.int64).reshape(-1)
    else:
        if in_features % n_groups != 0:
            raise ValueError(f"{in_features} columns do not split into {n_groups} groups")
        group_of_column = np.arange(in_features) // (in_features // n_groups)
    u = unpack_nibbles(packed, in_features, axis=1)
    if zero_point is not None:
        z = unpack_nibbles(zero_point, out_features, axis=0)  # [out, n_groups]
        z = z[:, group_of_column]
    else:
        z = 8
    return round_to_storage((u - z).astype(np.float64) * scale[:, group_of_column], scale_dtype)
