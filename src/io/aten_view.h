// Safetensors views as ATen tensors. Header-only so that io stays torch-free for its own users.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/shape.h"
#include "io/implied_shapes.h"
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

// The safetensors dtype of a tensor's; ValueError for one the writers never produce.
inline Dtype file_dtype(at::ScalarType t) {
  switch (t) {
    case at::kInt: return Dtype::kI32;
    case at::kLong: return Dtype::kI64;
    case at::kBFloat16: return Dtype::kBF16;
    case at::kHalf: return Dtype::kF16;
    case at::kFloat: return Dtype::kF32;
    default: throw ValueError(std::string("no safetensors dtype for ") + at::toString(t));
  }
}

// A tensor (on any device) as write_safetensors takes it: a host copy of its bytes.
inline TensorToWrite to_write(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  TensorToWrite w{name, file_dtype(c.scalar_type()), c.sizes().vec(), {}};
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  w.bytes.assign(p, p + c.nbytes());
  return w;
}

// FormatError (naming the tensor, its file and what config.json implies) unless `view` has
// `shape`.
inline void expect_shape(const TensorView& view, const std::vector<int64_t>& shape) {
  if (view.shape != shape) {
    throw FormatError("tensor " + view.name + " in " + view.file + " has shape " +
                      shape_str(view.shape) + " but config.json implies " + shape_str(shape));
  }
}

// FormatError unless `view` holds floating-point values: a model weight, which an integer
// tensor's bits would only pass for.
inline void expect_floating(const TensorView& view) {
  if (!at::isFloatingType(scalar_type(view.dtype))) {
    throw FormatError("tensor " + view.name + " in " + view.file + " has dtype " +
                      dtype_name(view.dtype) + ", not a floating-point one (F32, BF16, F16)");
  }
}

// expect_shape and expect_floating.
inline void expect_weight(const TensorView& view, const std::vector<int64_t>& shape) {
  expect_shape(view, shape);
  expect_floating(view);
}

// expect_weight against the shape config.json implies (io/implied_shapes.h), naming the fields
// the tensor contradicts.
inline void expect_weight(const TensorView& view, const ImpliedTensor& implied) {
  expect_implied_shape(view, implied);
  expect_floating(view);
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
