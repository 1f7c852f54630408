// Safetensors views as ATen tensors. Header-only so that io stays torch-free for its own users.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

#include "common/errors.h"
#include "io/safetensors.h"

namespace torchtpu {

inline at::ScalarType scalar_type(Dtype d) {
  switch (d) {
    case Dtype::kBool: return at::kBool;
    case Dtype::kU8: return at::kByte;
    case Dtype::kI8: return at::kChar;
    case Dtype::kI16: return at::kShort;
    case Dtype::kU16: return at::kUInt16;
    case Dtype::kF16: return at::kHalf;
    case Dtype::kBF16: return at::kBFloat16;
    case Dtype::kI32: return at::kInt;
    case Dtype::kU32: return at::kUInt32;
    case Dtype::kF32: return at::kFloat;
    case Dtype::kF64: return at::kDouble;
    case Dtype::kI64: return at::kLong;
    case Dtype::kU64: return at::kUInt64;
  }
  throw FormatError("unknown dtype");
}

// A CPU tensor over the view's bytes. Aliases the mapping (read-only: never write to it) when the
// data is aligned for its element type; tensors at unaligned offsets are copied into fresh memory.
inline at::Tensor host_tensor(const TensorView& view) {
  const auto type = scalar_type(view.dtype);
  const auto alignment = static_cast<uintptr_t>(dtype_size(view.dtype));
  if (reinterpret_cast<uintptr_t>(view.data) % alignment == 0) {
    return at::from_blob(const_cast<uint8_t*>(view.data), view.shape,
                         at::TensorOptions().dtype(type));
  }
  auto copy = at::empty(view.shape, at::TensorOptions().dtype(type));
  std::memcpy(copy.data_ptr(), view.data, view.nbytes);
  return copy;
}

}  // namespace torchtpu
