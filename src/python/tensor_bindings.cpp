// The seeds' smoke functions: ATen calls in C++ on tensors that cross from and to Python without a
// copy. On a new host they show, before any model loads, that the module and torch agree on the ABI
// and the device (the rig's smoke test runs matmul_sum on a TPU tensor).
#include <c10/util/Exception.h>

#include "python/bindings.h"

namespace torchtpu::python {

void bind_tensor_functions(py::module_& m) {
  m.def(
      "matmul_sum",
      [](py::handle x_obj) {
        const at::Tensor x = to_tensor(x_obj, "x");
        TORCH_CHECK_VALUE(x.dim() == 2, "matmul_sum takes a 2-D tensor, got ", x.dim(),
                          " dimensions");
        at::Tensor sum;
        {
          py::gil_scoped_release released;
          sum = at::matmul(x, x.t()).sum();
        }
        return to_python(sum);
      },
      py::arg("x"), "(x @ x.T).sum() computed by ATen in C++; a 0-d tensor on x's device.");
  m.def(
      "ramp",
      [](int64_t n, py::handle like, py::handle dtype) {
        TORCH_CHECK_VALUE(n >= 0, "ramp needs n >= 0, got ", n);
        const at::Device device =
            like.is_none() ? at::Device(at::kCPU) : to_tensor(like, "like").device();
        const at::ScalarType scalar = to_dtype(dtype);
        at::Tensor made;
        {
          py::gil_scoped_release released;
          made = at::arange(n, at::TensorOptions().dtype(scalar)).to(device);
        }
        return to_python(made);
      },
      py::arg("n"), py::arg("like") = py::none(), py::arg("dtype") = "bfloat16",
      "[0, 1, ..., n-1] built in C++ on the host and moved to like's device.");
  m.def(
      "add_",
      [](py::handle x_obj, double value) {
        at::Tensor x = to_tensor(x_obj, "x");
        {
          py::gil_scoped_release released;
          x.add_(value);
        }
        return to_python(x);
      },
      py::arg("x"), py::arg("value"),
      "Adds value to x in place in C++ and returns x (the same Python "
      "object).");
}

}  // namespace torchtpu::python
