// Synthetic checkpoints from Python: make_tiny writes the same files as `torchtpu-cpp make-tiny`,
// so a host that has only the module (a TPU VM's smoke stage, torchtpu_cpp.device_check) can make
// a model to run without downloading one.
#include "model/make_tiny.h"
#include "python/bindings.h"

namespace torchtpu::python {

void bind_checkpoints(py::module_& m) {
  m.def(
      "make_tiny",
      [](const std::string& out, const std::string& preset, uint64_t seed,
         const std::string& dtype) {
        TinySpec spec = tiny_preset(preset);
        spec.seed = seed;
        spec.dtype = dtype;
        py::gil_scoped_release released;
        make_tiny(out, spec);
      },
      py::arg("out"), py::kw_only(), py::arg("preset") = "tiny", py::arg("seed") = 0,
      py::arg("dtype") = "f32",
      "Writes a Gemma 4 checkpoint with random weights into `out`: preset \"tiny\" (7 layers, "
      "vocabulary 512) or \"e2b\" (the full E2B shapes); dtype \"f32\", \"bf16\" or \"f16\".");
}

}  // namespace torchtpu::python
