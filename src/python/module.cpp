// The extension module `torchtpu_cpp._torchtpu_cpp`: error mapping, BUILD, and the crossings every
// binding uses. The package's __init__ checks the torch version before this library is loaded.
#include <Python.h>
#include <c10/util/Exception.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>

#include "build_info.h"
#include "common/errors.h"
#include "engine/engine.h"
#include "python/bindings.h"

namespace torchtpu::python {

std::vector<int64_t> to_ids(py::handle obj, const char* what) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) ||
      !py::isinstance<py::iterable>(obj)) {
    throw ValueError(std::string(what) + " must be a sequence of int token ids, got " +
                     std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  std::vector<int64_t> ids;
  size_t position = 0;
  for (py::handle item : obj) {
    PyObject* p = item.ptr();
    const bool integral = !PyBool_Check(p) && (PyLong_Check(p) || PyIndex_Check(p));
    int overflow = 0;
    long long value = 0;
    if (integral) {
      py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(p));
      if (!index) throw py::error_already_set();
      value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    }
    if (!integral) {
      throw ValueError(std::string(what) + "[" + std::to_string(position) + "] is " +
                       std::string(py::repr(item)) + " (" +
                       std::string(py::str(py::type::handle_of(item).attr("__name__"))) +
                       "), not an int token id");
    }
    if (overflow != 0) {
      throw ValueError(std::string(what) + "[" + std::to_string(position) +
                       "] = " + std::string(py::repr(item)) + " does not fit in 64 bits");
    }
    ids.push_back(value);
    ++position;
  }
  return ids;
}

py::list to_list(const std::vector<int64_t>& ids) {
  py::list out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i] = py::int_(ids[i]);
  return out;
}

at::Tensor to_tensor(py::handle obj, const char* what) {
  if (!THPVariable_Check(obj.ptr())) {
    throw py::type_error(std::string(what) + " must be a torch.Tensor, got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  return THPVariable_Unpack(obj.ptr());
}

py::object to_python(const at::Tensor& tensor) {
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(tensor));
}

at::ScalarType to_dtype(py::handle obj) {
  if (py::isinstance<py::str>(obj)) return parse_dtype_name(obj.cast<std::string>());
  if (py::type::handle_of(obj).attr("__module__").cast<std::string>() == "torch" &&
      py::type::handle_of(obj).attr("__name__").cast<std::string>() == "dtype") {
    std::string name = py::str(obj);  // "torch.bfloat16"
    return parse_dtype_name(name.substr(name.find('.') + 1));
  }
  throw py::type_error("dtype must be a str such as 'bfloat16' or a torch.dtype, got " +
                       std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

ModelOptions tower_options(py::handle dtype, py::handle device) {
  ModelOptions options;
  options.dtype = to_dtype(dtype);
  if (!device.is_none()) options.device = parse_device(py::str(device).cast<std::string>());
  return options;
}

namespace {

// The one place where C++ error kinds become Python exceptions (DESIGN principle 5). Registered
// module-locally: pybind11's global translators are shared with other extensions (torch's
// included), so only a local one is guaranteed to be ours.
void translate_errors(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ValueError& e) {
    py::set_error(PyExc_ValueError, e.what());
  } catch (const FormatError& e) {
    py::set_error(PyExc_ValueError, e.what());
  } catch (const NotFoundError& e) {
    py::set_error(PyExc_FileNotFoundError, e.what());
  } catch (const UpstreamError& e) {
    py::set_error(PyExc_ConnectionError, e.what());
  } catch (const c10::ValueError& e) {
    py::set_error(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    py::set_error(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    py::set_error(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    py::set_error(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError& e) {
    py::set_error(PyExc_MemoryError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    py::set_error(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

py::dict build_info() {
  py::dict build;
  build["version"] = TORCHTPU_VERSION;
  build["git_revision"] = TORCHTPU_GIT_REVISION;
  build["torch"] = TORCHTPU_TORCH_VERSION;
  build["compiler"] = TORCHTPU_CXX_COMPILER;
  build["cxx_standard"] = "C++" TORCHTPU_CXX_STANDARD;
  build["cxx11_abi"] = static_cast<bool>(_GLIBCXX_USE_CXX11_ABI);
  build["python"] = PY_VERSION;
  build["pybind11"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                      std::to_string(PYBIND11_VERSION_MINOR) + "." +
                      std::to_string(PYBIND11_VERSION_MICRO);
  return build;
}

}  // namespace

}  // namespace torchtpu::python

PYBIND11_MODULE(_torchtpu_cpp, m) {
  using namespace torchtpu::python;
  m.doc() =
      "Gemma 4 in C++ over ATen: engine, tokenizer, chat template, "
      "server (torchtpu-cpp)";
  py::register_local_exception_translator(translate_errors);
  m.attr("BUILD") = build_info();
  m.attr("__version__") = TORCHTPU_VERSION;
  bind_engine(m);
  bind_text(m);
  bind_tensor_functions(m);
  bind_serve(m);
  bind_checkpoints(m);
  bind_media(m);
  bind_audio(m);
}
