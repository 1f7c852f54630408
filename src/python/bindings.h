// Shared pieces of the torchtpu_cpp module: how values cross between Python and C++ (token ids,
// tensors, dtypes) and the functions that add each group of bindings. docs/BINDINGS.md lists every
// crossing with its types, ownership, GIL state and thread.
#pragma once

#include <ATen/ATen.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "model/gemma4.h"

namespace torchtpu::python {

namespace py = pybind11;

// A Python sequence of ints (list, tuple, any iterable; numpy ints via __index__) as token ids.
// ValueError naming `what` and the position for anything else (str, float, bool, None, too big).
std::vector<int64_t> to_ids(py::handle obj, const char* what);
// A list of Python ints.
py::list to_list(const std::vector<int64_t>& ids);

// The at::Tensor a torch.Tensor holds (same TensorImpl, storage shared). TypeError otherwise.
at::Tensor to_tensor(py::handle obj, const char* what);
// A torch.Tensor for `tensor`, sharing its storage (the existing Python object if it has one).
py::object to_python(const at::Tensor& tensor);

// "bfloat16" / "bf16" / "float32" / ... or a torch.dtype of those -> ScalarType; ValueError for any
// other name, TypeError for another type.
at::ScalarType to_dtype(py::handle obj);
// A tower's ModelOptions (VisionTower, AudioTower): the compute dtype as to_dtype reads it, the
// device by name ("cpu", "cuda:0", ...; None for the CPU).
ModelOptions tower_options(py::handle dtype, py::handle device);

void bind_engine(py::module_& m);
void bind_text(py::module_& m);
void bind_tensor_functions(py::module_& m);
void bind_serve(py::module_& m);
void bind_checkpoints(py::module_& m);
void bind_media(py::module_& m);
void bind_audio(py::module_& m);

}  // namespace torchtpu::python
