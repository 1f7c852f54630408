// Checkpoints from Python: make_tiny writes the same files as `torchtpu-cpp make-tiny`, so a host
// that has only the module (a TPU VM's smoke stage, torchtpu_cpp.device_check) can make a model
// to run without downloading one; download fetches one from the Hub as `torchtpu-cpp download`.
#include "common/errors.h"
#include "hub/hub.h"
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
      "Writes a Gemma 4 checkpoint with random weights into `out`, a new or empty directory: "
      "preset \"tiny\" (7 layers, vocabulary 512) or \"e2b\" (the full E2B shapes); dtype "
      "\"f32\", \"bf16\" or \"f16\".");
  m.def(
      "download",
      [](const std::string& repo_id) {
        if (!hub::looks_like_repo_id(repo_id)) {
          throw ValueError("'" + repo_id +
                           "' is not a Hub model id (org/name or org/name@revision)");
        }
        py::gil_scoped_release released;
        return hub::resolve_model(repo_id, hub::Options::from_env());
      },
      py::arg("repo_id"),
      "Downloads what the engine reads of a Hub repository (`org/name` or `org/name@revision`) "
      "into the cache huggingface_hub uses (HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE "
      "as it reads them), or finds it there, and returns the snapshot directory. "
      "FileNotFoundError for an unknown repository or revision; ConnectionError when the Hub "
      "cannot be reached, refuses the token or breaks off, and the cache does not hold it.");
}

}  // namespace torchtpu::python
