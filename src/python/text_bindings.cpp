// The native text layer from Python: Tokenizer (tokenizer.json BPE) and ChatTemplate (MiniJinja).
// Both are immutable after loading and safe from any thread; the C++ work runs without the GIL.
#include <pybind11/stl.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "common/json_type.h"
#include "python/bindings.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace torchtpu::python {
namespace {

// Python values (dicts, lists, str, numbers, bool, None) cross as JSON text: json.dumps keeps the
// caller's key order, which templates printing `tojson` show.
nlohmann::ordered_json to_json(py::handle obj, const char* what) {
  py::object text;
  try {
    text = py::module_::import("json").attr("dumps")(obj, py::arg("allow_nan") = false);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    throw ValueError(std::string(what) +
                     " must be JSON data (dicts, lists, str, numbers, bool, "
                     "None): " +
                     std::string(py::str(e.value())));
  }
  try {
    return nlohmann::ordered_json::parse(text.cast<std::string>());
  } catch (const nlohmann::json::exception& e) {
    // json.dumps writes a lone surrogate ("\ud800"), which no UTF-8 text can hold, as an escape.
    throw ValueError(std::string(what) +
                     " must be valid Unicode text (a lone surrogate?): " + json_error_text(e));
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError("cannot read chat template file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A checkpoint or tokenizer dir (chat_template.jinja or tokenizer_config.json inside), or the path
// of one .jinja file (bos/eos then the Gemma defaults).
ChatTemplate load_template(const std::string& path) {
  if (std::filesystem::is_directory(path)) return ChatTemplate::from_dir(path);
  return ChatTemplate::from_string(read_text_file(path));
}

std::string render(const ChatTemplate& tmpl, py::handle messages, py::handle tools,
                   bool add_generation_prompt, bool enable_thinking, const py::kwargs& extra) {
  const auto messages_json = to_json(messages, "messages");
  const auto tools_json = tools.is_none() ? nlohmann::ordered_json() : to_json(tools, "tools");
  auto kwargs = to_json(extra, "template variables");
  kwargs["enable_thinking"] = enable_thinking;
  py::gil_scoped_release released;
  return tmpl.render(messages_json, tools_json, add_generation_prompt, kwargs);
}

}  // namespace

void bind_text(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", "A Hugging Face tokenizer.json, encoded natively (BPE).")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release released;
             return Tokenizer::from_file(path);
           }),
           py::arg("path"))
      .def(
          "encode",
          [](const Tokenizer& self, const std::string& text, bool add_special_tokens) {
            std::vector<int64_t> ids;
            {
              py::gil_scoped_release released;
              ids = self.encode(text, add_special_tokens);
            }
            return to_list(ids);
          },
          py::arg("text"), py::arg("add_special_tokens") = false)
      .def(
          "decode",
          [](const Tokenizer& self, py::handle ids, bool skip_special_tokens) {
            const auto tokens = to_ids(ids, "ids");
            py::gil_scoped_release released;
            return self.decode(tokens, skip_special_tokens);
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, py::arg("token"))
      .def("id_to_token", &Tokenizer::id_to_token, py::arg("id"))
      .def("__len__", &Tokenizer::vocab_size);

  py::class_<ChatTemplate>(m, "ChatTemplate",
                           "A checkpoint's chat template, rendered as transformers' "
                           "apply_chat_template(tokenize=False) renders it.")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release released;
             return load_template(path);
           }),
           py::arg("path"))
      .def_static("from_string", &ChatTemplate::from_string, py::arg("source"),
                  py::arg("bos_token") = "<bos>", py::arg("eos_token") = "<eos>")
      .def_property_readonly("source", &ChatTemplate::source)
      .def(
          "caps",
          [](const ChatTemplate& t) {
            py::dict out;
            for (const auto& [name, value] : t.caps().named()) out[name] = value;
            return out;
          },
          "What the template renders of each kind of chat content, under llama.cpp's "
          "chat_template_caps names (the server's GET /props)")
      .def("render", &render, py::arg("messages"), py::arg("tools") = py::none(),
           py::arg("add_generation_prompt") = true, py::arg("enable_thinking") = false);

  m.def(
      "render_chat",
      [](py::handle messages, py::handle tools, bool enable_thinking, py::handle tmpl,
         bool add_generation_prompt, const py::kwargs& extra) {
        if (py::isinstance<ChatTemplate>(tmpl)) {
          return render(tmpl.cast<const ChatTemplate&>(), messages, tools, add_generation_prompt,
                        enable_thinking, extra);
        }
        if (!py::isinstance<py::str>(tmpl) &&
            !py::isinstance(tmpl, py::module_::import("os").attr("PathLike"))) {
          throw py::type_error(
              "template must be a path (checkpoint dir or .jinja file) or a "
              "ChatTemplate");
        }
        const auto path =
            py::str(py::module_::import("os").attr("fspath")(tmpl)).cast<std::string>();
        return render(load_template(path), messages, tools, add_generation_prompt, enable_thinking,
                      extra);
      },
      py::arg("messages"), py::arg("tools") = py::none(), py::arg("enable_thinking") = false,
      py::kw_only(), py::arg("template"), py::arg("add_generation_prompt") = true,
      "Renders an OpenAI-style conversation with a checkpoint's chat "
      "template.");
}

}  // namespace torchtpu::python
