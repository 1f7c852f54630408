// Images from Python: decoding and Gemma4ImageProcessor's preprocessing in C++ (src/media), and
// the vision encoder (src/model/vision.h) that turns the patches into soft tokens of the text
// model.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "media/image.h"
#include "model/vision.h"
#include "python/bindings.h"

namespace torchtpu::python {
namespace {

ImageLimits limits(int64_t max_bytes, int64_t max_pixels) {
  TORCH_CHECK_VALUE(max_bytes > 0 && max_pixels > 0,
                    "max_bytes and max_pixels must be positive, got ", max_bytes, " and ",
                    max_pixels);
  return {max_bytes, max_pixels};
}

std::string_view bytes_view(const py::bytes& data) {
  char* buffer = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(data.ptr(), &buffer, &size) != 0) throw py::error_already_set();
  return {buffer, static_cast<size_t>(size)};
}

}  // namespace

void bind_media(py::module_& m) {
  const ImageLimits defaults;
  m.def(
      "decode_image",
      [](const py::bytes& data, int64_t max_bytes, int64_t max_pixels) {
        const std::string_view view = bytes_view(data);
        const ImageLimits l = limits(max_bytes, max_pixels);
        at::Tensor rgb;
        {
          py::gil_scoped_release released;
          rgb = decode_image(view, l);
        }
        return to_python(rgb);
      },
      py::arg("data"), py::kw_only(), py::arg("max_bytes") = defaults.max_bytes,
      py::arg("max_pixels") = defaults.max_pixels,
      "JPEG, PNG or WebP bytes to an RGB uint8 tensor [3, H, W] (as Pillow's convert(\"RGB\")). "
      "ValueError for unsupported formats, corrupt or truncated data and images over the limits.");

  py::class_<ImagePatches>(m, "ImagePatches",
                           "One image preprocessed as Gemma4ImageProcessor does it, unpadded.")
      .def_property_readonly(
          "pixels", [](const ImagePatches& p) { return to_python(p.pixels); },
          "float32 [P, 3 * patch_size^2] in [0, 1]")
      .def_property_readonly(
          "positions", [](const ImagePatches& p) { return to_python(p.positions); },
          "int64 [P, 2] (x, y) patch coordinates")
      .def_readonly("soft_tokens", &ImagePatches::soft_tokens,
                    "image tokens the prompt needs: P / pooling_kernel_size^2");

  m.def(
      "preprocess_image",
      [](py::handle image, int64_t max_soft_tokens, int64_t patch_size, int64_t pooling_kernel_size,
         int64_t max_bytes, int64_t max_pixels) {
        ImageProcessorOptions options{patch_size, pooling_kernel_size, max_soft_tokens};
        if (py::isinstance<py::bytes>(image)) {
          const std::string_view view = bytes_view(py::reinterpret_borrow<py::bytes>(image));
          const ImageLimits l = limits(max_bytes, max_pixels);
          py::gil_scoped_release released;
          return preprocess_image(decode_image(view, l), options);
        }
        const at::Tensor rgb = to_tensor(image, "image (bytes or an RGB uint8 tensor)");
        py::gil_scoped_release released;
        return preprocess_image(rgb, options);
      },
      py::arg("image"), py::arg("max_soft_tokens") = 280, py::kw_only(), py::arg("patch_size") = 16,
      py::arg("pooling_kernel_size") = 3, py::arg("max_bytes") = defaults.max_bytes,
      py::arg("max_pixels") = defaults.max_pixels,
      "Encoded image bytes (decoded first) or an RGB uint8 tensor [3, H, W] to ImagePatches: "
      "resized for the soft-token budget (70, 140, 280, 560 or 1120), rescaled, patched.");

  py::class_<VisionTower>(m, "VisionTower",
                          "Gemma 4's vision encoder and its projection into the text model.")
      .def(py::init([](const std::string& model_dir, py::handle dtype, py::handle device) {
             const ModelOptions options = tower_options(dtype, device);
             py::gil_scoped_release released;
             return std::make_unique<VisionTower>(model_dir, options);
           }),
           py::arg("model_dir"), py::kw_only(), py::arg("dtype") = "bfloat16",
           py::arg("device") = py::none(),
           "Loads model_dir's vision tower (ValueError when its config.json has no vision_config).")
      .def(
          "embed",
          [](const VisionTower& self, py::handle pixels, py::handle positions) {
            const at::Tensor px = to_tensor(pixels, "pixels");
            const at::Tensor pos = to_tensor(positions, "positions");
            at::Tensor out;
            {
              py::gil_scoped_release released;
              out = self.embed(px, pos);
            }
            return to_python(out);
          },
          py::arg("pixels"), py::arg("positions"),
          "Soft tokens [soft_tokens, text hidden_size] of one image's patches [P, 3 * patch^2] "
          "at positions [P, 2] ((-1, -1) rows are padding and dropped).")
      .def_property_readonly("soft_token_width", &VisionTower::text_hidden_size);
}

}  // namespace torchtpu::python
