// The C++ server hosted by a Python process (python -m torchtpu_cpp.serve): the same server as
// `torchtpu-cpp serve`, run with the GIL released, so Python only hosts (imports torch_tpu, owns
// the process) while HTTP threads and the engine worker are C++.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "server/server.h"

namespace torchtpu::python {

void bind_serve(py::module_& m) {
  m.def(
      "serve",
      [](const std::string& model_dir, const std::string& emb4_dir, const std::string& model_id,
         const std::string& host, int port, int64_t context, const std::string& device,
         const std::string& dtype, const std::string& api_key, int max_queue, int64_t read_every,
         int64_t max_body_bytes, py::handle like, int64_t threads, const std::string& int4,
         const std::string& quantize, int64_t int4_activation_bits, bool constrain_tools,
         int64_t reasoning_budget, const std::string& reasoning_budget_message,
         const std::vector<std::string>& served_model_names,
         bool metrics_auth, bool no_slots, const std::string& slot_save_path,
         const std::string& metrics_compat,
         double drain_grace_s,
         double sleep_idle_s, bool sleep_preserve_cache,
         int64_t parallel, int64_t cache_mb, int64_t step_tokens, int64_t pass_rows,
         int64_t max_media, int64_t max_image_bytes,
         int64_t max_audio_bytes, int64_t image_tokens, bool allow_media_urls,
         double media_url_timeout_s, bool no_vision, bool no_audio,
         const std::string& mcp_media_dir, std::optional<int64_t> draft_max,
         int64_t draft_ngram_min,
         int64_t draft_ngram_max, bool draft_always, const std::string& draft_model,
         const std::vector<std::string>& lora, bool lora_init_without_apply, int64_t max_loras,
         bool runtime_lora) {
        server::ServeOptions options;
        options.model_dir = model_dir;
        options.engine.emb4_dir = emb4_dir;
        options.model_id = model_id;
        options.host = host;
        options.port = port;
        options.engine.context = context;
        options.engine.device = device;
        options.engine.dtype = dtype;
        options.api_key = api_key;
        options.max_queue = max_queue;
        options.read_every = read_every;
        options.max_body_bytes = max_body_bytes;
        options.engine.threads = threads;
        options.engine.int4 = int4;
        options.engine.quantize = quantize;
        options.engine.int4_activation_bits = int4_activation_bits;
        options.constrain_tools = constrain_tools;
        options.reasoning_budget = reasoning_budget;
        options.reasoning_budget_message = reasoning_budget_message;
        options.served_model_names = served_model_names;
        options.metrics_auth = metrics_auth;
        options.no_slots = no_slots;
        options.slot_save_path = slot_save_path;
        options.metrics_compat = metrics_compat;
        options.drain_grace_s = drain_grace_s;
        options.sleep_idle_s = sleep_idle_s;
        options.sleep_preserve_cache = sleep_preserve_cache;
        options.parallel = parallel;
        options.cache_mb = cache_mb;
        options.step_tokens = step_tokens;
        options.pass_rows = pass_rows;
        options.media.max_items = max_media;
        options.media.max_image_bytes = max_image_bytes;
        options.media.max_audio_bytes = max_audio_bytes;
        options.media.image_tokens = image_tokens;
        options.media.allow_urls = allow_media_urls;
        options.media.url_timeout_s = media_url_timeout_s;
        options.engine.no_vision = no_vision;
        options.engine.no_audio = no_audio;
        options.mcp_media_dir = mcp_media_dir;
        options.draft = Drafting{draft_max.value_or(default_draft_tokens(draft_model)),
                                 draft_ngram_min, draft_ngram_max, draft_always};
        options.engine.draft_model = draft_model;
        options.engine.lora = lora;
        options.engine.lora_init_without_apply = lora_init_without_apply;
        options.engine.max_lora = max_loras;
        options.runtime_lora = runtime_lora;
        options.hosted_by = "python";
        // Python keeps its own SIGINT/SIGTERM handlers and calls request_stop() from them.
        options.install_signal_handlers = false;
        std::optional<at::Device> like_device;
        if (!like.is_none()) {
          like_device = to_tensor(like, "like").device();
          options.engine.device = like_device->str();
        }
        // Called by the server's engine worker thread, which then owns the engine; it needs no
        // Python, so the GIL stays released for the whole life of the server.
        server::EngineFactory factory = [like_device](const EngineOptions& engine_options) {
          EngineOptions chosen = engine_options;
          if (like_device) chosen.device = *like_device;
          return std::make_unique<Engine>(chosen);
        };
        py::gil_scoped_release released;
        return server::run(options, factory);
      },
      py::kw_only(), py::arg("model_dir") = "", py::arg("emb4_dir") = "", py::arg("model_id") = "",
      py::arg("host") = "127.0.0.1", py::arg("port") = 8000, py::arg("context") = kDefaultContext,
      py::arg("device") = "cpu", py::arg("dtype") = "bfloat16", py::arg("api_key") = "",
      py::arg("max_queue") = 16, py::arg("read_every") = 1,
      py::arg("max_body_bytes") = server::ServeOptions{}.max_body_bytes,
      py::arg("like") = py::none(), py::arg("threads") = 0, py::arg("int4") = "auto",
      py::arg("quantize") = "none", py::arg("int4_activation_bits") = 16,
      py::arg("constrain_tools") = false,
      py::arg("reasoning_budget") = server::ServeOptions{}.reasoning_budget,
      py::arg("reasoning_budget_message") = "",
      py::arg("served_model_names") = std::vector<std::string>{},
      py::arg("metrics_auth") = false, py::arg("no_slots") = false,
      py::arg("slot_save_path") = "",
      py::arg("metrics_compat") = "none",
      py::arg("drain_grace_s") = 0.0,
      py::arg("sleep_idle_s") = server::ServeOptions{}.sleep_idle_s,
      py::arg("sleep_preserve_cache") = false, py::arg("parallel") = server::ServeOptions{}.parallel,
      py::arg("cache_mb") = server::ServeOptions{}.cache_mb, py::arg("step_tokens") = 0,
      py::arg("pass_rows") = 0,
      py::arg("max_media") = server::MediaLimits{}.max_items,
      py::arg("max_image_bytes") = server::MediaLimits{}.max_image_bytes,
      py::arg("max_audio_bytes") = server::MediaLimits{}.max_audio_bytes,
      py::arg("image_tokens") = server::MediaLimits{}.image_tokens,
      py::arg("allow_media_urls") = false,
      py::arg("media_url_timeout_s") = server::MediaLimits{}.url_timeout_s,
      py::arg("no_vision") = false, py::arg("no_audio") = false, py::arg("mcp_media_dir") = "",
      py::arg("draft_max") = py::none(),
      py::arg("draft_ngram_min") = Drafting{}.ngram_min,
      py::arg("draft_ngram_max") = Drafting{}.ngram_max, py::arg("draft_always") = false,
      py::arg("draft_model") = "", py::arg("lora") = std::vector<std::string>{},
      py::arg("lora_init_without_apply") = false,
      py::arg("max_loras") = EngineSettings{}.max_lora, py::arg("runtime_lora") = false,
      "Runs the OpenAI-compatible server until request_stop(); returns the "
      "exit code. Blocks the "
      "calling thread with the GIL released; installs no signal handlers.");
  m.def(
      "request_stop", [] { server::request_stop(); },
      "Asks a running serve() to finish in-flight requests and return.");
}

}  // namespace torchtpu::python
