// torchtpu_cpp.Engine: one Engine owned by the Python thread that created it. Load, logits and
// decode run with the GIL released; the on_tokens callback takes it back once per read batch.
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/errors.h"
#include "engine/batch.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "engine/report.h"
#include "grammar/constraint.h"
#include "hub/hub.h"
#include "python/bindings.h"
#include "server/server.h"

namespace torchtpu::python {
namespace {

std::string current_thread_name() {
  return py::module_::import("threading").attr("current_thread")().attr("name").cast<std::string>();
}

// Wraps the Engine with the owner-thread rule (DESIGN principle 4): every method checks the calling
// OS thread against the creator's and raises RuntimeError otherwise. A model call made from inside
// an on_tokens callback (same thread, engine mid-decode) is refused the same way.
class PyEngine {
 public:
  explicit PyEngine(const EngineOptions& options)
      : owner_(std::this_thread::get_id()), owner_name_(current_thread_name()) {
    py::gil_scoped_release released;
    engine_ = std::make_unique<Engine>(options);
  }

  // The engine, after the owner check and, for calls that run the model (`exclusive`), the check
  // that no decode is in progress; RuntimeError if either fails.
  // `method` is qualified ("Engine.decode", "Batch.step"): a Batch is the engine's too.
  Engine& begin(const std::string& method, bool exclusive = false) {
    if (std::this_thread::get_id() != owner_) {
      throw std::runtime_error(method + "() called from thread '" + current_thread_name() +
                               "', but this Engine belongs to thread '" + owner_name_ +
                               "' that created it; send work to that thread (a "
                               "queue) instead of sharing the engine");
    }
    if (exclusive && busy_) {
      throw std::runtime_error(method +
                               "() called while this engine is decoding (from inside an "
                               "on_tokens callback); one call at a time");
    }
    return *engine_;
  }

  // Marks the engine busy for the duration of a call that may run Python callbacks. Only the owner
  // thread gets this far, so a plain bool suffices.
  struct Busy {
    explicit Busy(PyEngine& engine) : engine_(engine) { engine_.busy_ = true; }
    ~Busy() { engine_.busy_ = false; }
    PyEngine& engine_;
  };
  const std::string& owner_name() const { return owner_name_; }

  // The checkpoint's tokenizer.json, read by the first decode that needs it.
  const Tokenizer& tokenizer() {
    if (!tokenizer_) {
      const std::string path =
          (std::filesystem::path(engine_->options().model_dir) / "tokenizer.json").string();
      tokenizer_ = model_tokenizer(path, engine_->config().vocab_size);
    }
    return *tokenizer_;
  }

  // The grammar vocabulary of the checkpoint's tokenizer (ends: its eos ids, end of turn first),
  // built by the first constrained decode: about 2 s for 262,144 tokens.
  std::shared_ptr<const GrammarVocabulary> grammar_vocabulary() {
    if (!vocabulary_) {
      vocabulary_ = std::make_shared<const GrammarVocabulary>(
          tokenizer(), grammar_end_ids(tokenizer(), engine_->config().eos_token_ids));
    }
    return vocabulary_;
  }

  // The thinking block's markers in the checkpoint's tokenizer; ValueError if it has none.
  ThinkingMarkers thinking_markers() {
    const auto markers = torchtpu::thinking_markers(tokenizer());
    if (!markers) {
      throw ValueError(
          "thinking_budget: the checkpoint's tokenizer has no <|channel> and <channel|> tokens");
    }
    return *markers;
  }

  // Batches of this engine alive in Python: their rings were sized by the weights' config and
  // their steps run the model, so the engine does not sleep under them.
  int64_t batches = 0;

  // Engine::sleep, refused while a Batch of the engine is alive.
  void sleep() {
    Engine& engine = begin("Engine.sleep", /*exclusive=*/true);
    if (batches > 0) {
      throw std::runtime_error("Engine.sleep() called while " + std::to_string(batches) +
                               " Batch(es) of this engine are alive: delete them first");
    }
    py::gil_scoped_release released;
    engine.sleep();
  }

 private:
  std::thread::id owner_;
  std::string owner_name_;
  bool busy_ = false;
  std::unique_ptr<Engine> engine_;
  std::optional<Tokenizer> tokenizer_;
  std::shared_ptr<const GrammarVocabulary> vocabulary_;
};

// "json_schema", "json_object", "regex", "lark" -> the grammar; ValueError otherwise.
Grammar to_grammar(const std::string& kind, const std::string& source) {
  if (kind == "json_schema") return {GrammarKind::kJsonSchema, source};
  if (kind == "json_object") return {GrammarKind::kJsonObject, source};
  if (kind == "regex") return {GrammarKind::kRegex, source};
  if (kind == "lark") return {GrammarKind::kLark, source};
  throw ValueError("grammar_kind '" + kind +
                   "' is not one of json_schema, json_object, regex, lark");
}

EngineOptions engine_options(const std::string& model_dir, const std::optional<std::string>& emb4,
                             py::handle like, int64_t context, py::handle device, py::handle dtype,
                             int64_t prefill_chunk, int64_t threads, const std::string& int4,
                             const std::optional<std::string>& quantize,
                             int64_t int4_activation_bits, bool no_vision, bool no_audio,
                             const std::optional<std::string>& draft_model,
                             const std::vector<std::string>& lora, int64_t max_lora) {
  EngineSettings settings;
  settings.emb4_dir = emb4.value_or("");
  settings.context = context;
  settings.threads = threads;
  settings.int4 = int4;
  settings.quantize = quantize.value_or("none");
  settings.int4_activation_bits = int4_activation_bits;
  settings.no_vision = no_vision;
  settings.no_audio = no_audio;
  settings.draft_model = draft_model.value_or("");
  settings.lora = lora;
  settings.max_lora = max_lora;
  // device and dtype may come as torch objects (a dtype, like's device): set after the names.
  EngineOptions options = settings.options(model_dir);
  options.prefill_chunk = prefill_chunk;
  options.dtype = to_dtype(dtype);
  std::optional<at::Device> named;
  if (!device.is_none()) named = parse_device(py::str(device).cast<std::string>());
  if (!like.is_none()) {
    const at::Device from_like = to_tensor(like, "like").device();
    if (named && *named != from_like) {
      throw ValueError("device '" + named->str() + "' and like.device '" + from_like.str() +
                       "' disagree; give one of them");
    }
    check_device(from_like, from_like.str());
    named = from_like;
  }
  options.device = named.value_or(at::Device(at::kCPU));
  return options;
}

void check_callable(py::handle on_tokens) {
  if (!on_tokens.is_none() && !PyCallable_Check(on_tokens.ptr())) {
    throw py::type_error("on_tokens must be callable or None, got " +
                         std::string(py::str(py::type::handle_of(on_tokens).attr("__name__"))));
  }
}

// The OnTokens of one sequence, called without the GIL: it takes the GIL back to run `on_tokens`
// (None: no call) and to let Python handle signals (Ctrl-C ends the sequence with
// KeyboardInterrupt). A Python error raised there ends the sequence and waits in `failure` for the
// caller to raise once the GIL is held. Holds no Python reference: the caller keeps `on_tokens`
// alive while the sequence runs, so the relay may be destroyed without the GIL.
OnTokens relay(py::handle on_tokens, std::optional<py::error_already_set>& failure) {
  return [on_tokens, &failure](const std::vector<int64_t>& batch) -> bool {
    py::gil_scoped_acquire acquired;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (on_tokens.is_none()) return true;
      const py::object go_on = on_tokens(to_list(batch));
      const int truth = PyObject_IsTrue(go_on.ptr());
      if (truth < 0) throw py::error_already_set();
      return truth == 1;
    } catch (py::error_already_set& e) {
      if (!failure) failure.emplace(std::move(e));
      return false;
    }
  };
}

// Runs the engine's decode with the GIL released; on_tokens runs once per read batch (relay).
DecodeResult run_decode(PyEngine& self, const char* method, const std::vector<int64_t>& ids,
                        const DecodeOptions& options, py::handle on_tokens,
                        const std::vector<Media>& media = {}) {
  Engine& engine = self.begin(method, /*exclusive=*/true);
  check_callable(on_tokens);
  std::optional<py::error_already_set> failure;
  PyEngine::Busy busy(self);
  DecodeResult result;
  {
    py::gil_scoped_release released;
    result = engine.decode(ids, media, options, relay(on_tokens, failure));
  }
  if (failure) throw std::move(*failure);
  return result;
}

// The sampling and stopping arguments Engine.decode, Batch.submit and Engine.decode_many share.
struct DecodeArgs {
  int64_t max_new;
  py::object stop;
  int64_t read_every;
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
  double repetition_penalty;
  double presence_penalty;
  double frequency_penalty;
  std::map<int64_t, double> logit_bias;
  std::optional<uint64_t> seed;
  std::optional<std::string> grammar_kind;
  std::string grammar;
  std::optional<int64_t> thinking_budget;
  std::string thinking_budget_message;
  std::vector<Media> media;
  Drafting draft;
  std::optional<std::map<std::string, double>> lora;
};

// One media list cannot belong to several prompts: decode_many takes text prompts.
void check_no_media(const DecodeArgs& args, const std::string& method) {
  if (!args.media.empty()) {
    throw ValueError(method +
                     " takes no media (one list cannot serve several prompts): submit "
                     "each prompt with its media through Batch.submit");
  }
}

// The DecodeOptions for `args`; a grammar becomes a fresh constraint (one per sequence: it
// advances through that sequence's tokens).
DecodeOptions decode_options(PyEngine& self, const std::string& method, const DecodeArgs& args) {
  DecodeOptions options;
  options.max_new = args.max_new;
  options.read_every = args.read_every;
  options.draft = args.draft;
  options.lora = args.lora;
  if (!args.stop.is_none()) {
    options.stop_ids = to_ids(args.stop, "stop");
    options.ignore_eos = options.stop_ids.empty();
  }
  SamplingParams& s = options.sampling;
  s.temperature = args.temperature;
  s.top_k = args.top_k;
  s.top_p = args.top_p;
  s.min_p = args.min_p;
  s.repetition_penalty = args.repetition_penalty;
  s.presence_penalty = args.presence_penalty;
  s.frequency_penalty = args.frequency_penalty;
  s.logit_bias = args.logit_bias;
  s.seed = args.seed;
  if (!args.grammar_kind && !args.grammar.empty()) {
    throw ValueError(
        "grammar is read as grammar_kind says (json_schema, regex, lark, "
        "json_object): give grammar_kind too");
  }
  if (args.grammar_kind) {
    self.begin(method, /*exclusive=*/true);
    auto vocabulary = [&] {
      py::gil_scoped_release released;
      return self.grammar_vocabulary();
    }();
    options.constraint =
        std::make_shared<Constraint>(vocabulary, to_grammar(*args.grammar_kind, args.grammar));
  }
  if (!args.thinking_budget && !args.thinking_budget_message.empty()) {
    throw ValueError("thinking_budget_message is written when a thinking_budget is spent: "
                     "give a thinking_budget too");
  }
  if (args.thinking_budget) {
    self.begin(method, /*exclusive=*/true);
    py::gil_scoped_release released;
    options.thinking_budget =
        ThinkingBudget{*args.thinking_budget, self.thinking_markers(),
                       self.tokenizer().encode(args.thinking_budget_message)};
  }
  return options;
}

// A decode's seed: None, or an int from 0 to 2^64 - 1 (ValueError naming the range otherwise,
// where pybind's own conversion would answer a TypeError listing the whole signature).
std::optional<uint64_t> to_seed(py::handle seed) {
  if (seed.is_none()) return std::nullopt;
  if (PyLong_Check(seed.ptr()) && !PyBool_Check(seed.ptr())) {
    const unsigned long long value = PyLong_AsUnsignedLongLong(seed.ptr());
    if (!PyErr_Occurred()) return value;
    PyErr_Clear();
  }
  throw ValueError("seed must be None or an int from 0 to 2**64 - 1, got " +
                   std::string(py::repr(seed)));
}

// A sequence's id as Batch.submit returned it: an int (not a bool), ValueError otherwise, where
// pybind would answer a TypeError listing the signature (an int past int64) or take True as 1.
int64_t to_sequence_id(py::handle id, const char* method) {
  if (PyLong_Check(id.ptr()) && !PyBool_Check(id.ptr())) {
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(id.ptr(), &overflow);
    if (overflow == 0 && !PyErr_Occurred()) return value;
    PyErr_Clear();
  }
  throw ValueError(std::string(method) + ": id must be an int that Batch.submit returned, got " +
                   std::string(py::repr(id)));
}

// Binds `f(self, first, on_tokens, DecodeArgs, extra...)` as method `name` taking `first` (named
// by `first_name`), DecodeArgs' fields, then keyword arguments of types `Extra` that `extra_args`
// name: every method that decodes takes the same names and defaults, and a Batch's take the prefix
// cache's after them (def_batch_decoding).
template <typename... Extra, typename Class, typename F, typename... ExtraArgs>
void def_decoding(Class& cls, const char* name, const char* first_name, const char* doc, F f,
                  ExtraArgs... extra_args) {
  cls.def(
      name,
      [f](typename Class::type& self, py::handle first, int64_t max_new, py::object stop,
          int64_t read_every, py::handle on_tokens, double temperature, int64_t top_k, double top_p,
          double min_p, double repetition_penalty, double presence_penalty,
          double frequency_penalty, const std::map<int64_t, double>& logit_bias, py::handle seed,
          std::optional<std::string> grammar_kind, const std::string& grammar,
          std::optional<int64_t> thinking_budget, const std::string& thinking_budget_message,
          const std::vector<Media>& media, int64_t draft_max, int64_t draft_ngram_min,
          int64_t draft_ngram_max, bool draft_always,
          std::optional<std::map<std::string, double>> lora, Extra... extra) {
        return f(self, first, on_tokens,
                 DecodeArgs{max_new, std::move(stop), read_every, temperature, top_k, top_p, min_p,
                            repetition_penalty, presence_penalty, frequency_penalty, logit_bias,
                            to_seed(seed), std::move(grammar_kind), grammar, thinking_budget,
                            thinking_budget_message, media,
                            Drafting{draft_max, draft_ngram_min, draft_ngram_max, draft_always},
                            std::move(lora)},
                 std::move(extra)...);
      },
      doc, py::arg(first_name), py::arg("max_new"), py::arg("stop") = py::make_tuple(1, 106, 50),
      py::arg("read_every") = 1, py::arg("on_tokens") = py::none(), py::kw_only(),
      py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
      py::arg("min_p") = 0.0, py::arg("repetition_penalty") = 1.0,
      py::arg("presence_penalty") = 0.0, py::arg("frequency_penalty") = 0.0,
      py::arg("logit_bias") = std::map<int64_t, double>{}, py::arg("seed") = py::none(),
      py::arg("grammar_kind") = py::none(), py::arg("grammar") = "",
      py::arg("thinking_budget") = py::none(), py::arg("thinking_budget_message") = "",
      py::arg("media") = std::vector<Media>{}, py::arg("draft_max") = 0,
      py::arg("draft_ngram_min") = Drafting{}.ngram_min,
      py::arg("draft_ngram_max") = Drafting{}.ngram_max, py::arg("draft_always") = false,
      py::arg("lora") = py::none(), std::move(extra_args)...);
}

// The prefix cache's arguments, which only a Batch's methods take: Engine.decode keeps no cache,
// and one that took them would ignore them.
struct CacheArgs {
  std::string salt;  // "": none
  std::vector<int64_t> reuse_points;
};

// cache_salt (None: no salt; ValueError for "", which would read as none) and reuse_points (a
// sequence of ints; ValueError naming the item that is not) as CacheArgs.
CacheArgs cache_args(const std::optional<std::string>& cache_salt, py::handle reuse_points) {
  if (cache_salt && cache_salt->empty()) {
    throw ValueError("cache_salt must not be empty: leave it out (None) for no salt");
  }
  return {cache_salt.value_or(""), to_ids(reuse_points, "reuse_points")};
}

// ValueError unless every reuse point lies in [1, n) of `prompt` (n its ids; `what` names it), as
// Engine::check_decode asks, naming the point by its place in reuse_points; `rule` ends the
// message.
void check_reuse_points(const CacheArgs& cache, const std::vector<int64_t>& prompt,
                        const std::string& what, const std::string& rule = "") {
  const auto n = static_cast<int64_t>(prompt.size());
  for (size_t i = 0; i < cache.reuse_points.size(); ++i) {
    const int64_t point = cache.reuse_points[i];
    if (point < 1 || point >= n) {
      throw ValueError("reuse_points[" + std::to_string(i) + "] is " + std::to_string(point) +
                       ", outside the positions [1, " + std::to_string(n) + ") of " + what + " (" +
                       std::to_string(n) + " ids)" + rule);
    }
  }
}

// `options` with `cache`'s salt and reuse points.
DecodeOptions with_cache(DecodeOptions options, const CacheArgs& cache) {
  options.cache_salt = cache.salt;
  options.reuse_points = cache.reuse_points;
  return options;
}

// torchtpu_cpp.Batch: a Batch over the engine's model, owned by the engine's owner thread (every
// method checks it). It keeps the Python Engine alive, and each queued or running sequence's
// on_tokens callable until the step that finishes the sequence.
class PyBatch {
 public:
  PyBatch(py::object engine, const BatchOptions& options)
      : engine_object_(std::move(engine)), engine_(engine_object_.cast<PyEngine&>()) {
    Engine& engine_ref = engine_.begin("Engine.batch", /*exclusive=*/true);
    if (engine_ref.asleep()) {
      throw std::runtime_error("Engine.batch() called while the engine sleeps: wake() it first");
    }
    {
      py::gil_scoped_release released;
      batch_ = std::make_unique<Batch>(engine_ref, options);
    }
    ++engine_.batches;
  }
  ~PyBatch() { --engine_.batches; }
  PyBatch(const PyBatch&) = delete;
  PyBatch& operator=(const PyBatch&) = delete;

  int64_t submit(const char* method, const std::vector<int64_t>& ids, DecodeOptions options,
                 py::handle on_tokens, const std::vector<Media>& media = {}) {
    engine_.begin(method, /*exclusive=*/true);
    check_callable(on_tokens);
    const int64_t id = batch_->submit(ids, options, relay(on_tokens, failure_), {}, media);
    callbacks_[id] = py::reinterpret_borrow<py::object>(on_tokens);
    return id;
  }

  // One step of the batch with the GIL released; the finished ids. A Python error from an
  // on_tokens callable (its sequence ended, cancelled) is raised here after the step.
  std::vector<int64_t> step(const char* method) {
    engine_.begin(method, /*exclusive=*/true);
    std::vector<int64_t> finished;
    {
      PyEngine::Busy busy(engine_);
      py::gil_scoped_release released;
      finished = batch_->step();
    }
    for (const int64_t id : finished) callbacks_.erase(id);
    // Abandoned sequences finish out of sight: their results are dropped here.
    std::erase_if(finished, [this](int64_t id) {
      if (!abandoned_.erase(id)) return false;
      batch_->take_result(id);
      return true;
    });
    if (failure_) {
      auto failure = std::move(*failure_);
      failure_.reset();
      throw failure;
    }
    return finished;
  }

  // Ends sequences nobody will take the results of (a decode_many left by an exception): a
  // queued or running one is cancelled and its result dropped when it finishes, a finished one's
  // result dropped now.
  void abandon(const std::vector<int64_t>& ids) {
    for (const int64_t id : ids) {
      try {
        batch_->cancel(id);
        abandoned_.insert(id);
      } catch (const ValueError&) {
        batch_->take_result(id);  // not queued or running: finished, its result waiting
      }
    }
  }

  // A slot action (Batch::save_slot, restore_slot, erase_slot) with the GIL released.
  SlotOutcome slot(const char* method, const std::function<SlotOutcome(Batch&)>& action) {
    engine_.begin(method, /*exclusive=*/true);
    PyEngine::Busy busy(engine_);
    py::gil_scoped_release released;
    return action(*batch_);
  }

  Batch& batch(const char* method) {
    engine_.begin(method);
    return *batch_;
  }
  PyEngine& engine() { return engine_; }

 private:
  py::object engine_object_;
  PyEngine& engine_;
  std::map<int64_t, py::object> callbacks_;
  std::set<int64_t> abandoned_;
  std::optional<py::error_already_set> failure_;
  std::unique_ptr<Batch> batch_;
};

// Binds a Batch method as def_decoding does, with the prefix cache's arguments, keyword-only,
// after the rest: `f(self, first, on_tokens, DecodeArgs, CacheArgs)`.
template <typename F>
void def_batch_decoding(py::class_<PyBatch>& cls, const char* name, const char* first_name,
                        const char* doc, F f) {
  def_decoding<std::optional<std::string>, py::handle>(
      cls, name, first_name, doc,
      [f](PyBatch& self, py::handle first, py::handle on_tokens, const DecodeArgs& args,
          const std::optional<std::string>& cache_salt, py::handle reuse_points) {
        return f(self, first, on_tokens, args, cache_args(cache_salt, reuse_points));
      },
      py::arg("cache_salt") = py::none(), py::arg("reuse_points") = py::tuple());
}

py::dict stats_dict(const BatchStats& stats) {
  py::dict d;
  d["rows"] = stats.rows;
  d["queued"] = stats.queued;
  d["reading"] = stats.reading;
  d["decoding"] = stats.decoding;
  d["steps"] = stats.steps;
  d["prompt_passes"] = stats.prompt_passes;
  d["prompt_tokens"] = stats.prompt_tokens;
  d["step_tokens"] = stats.step_tokens;
  d["pass_rows"] = stats.pass_rows ? py::object(py::int_(*stats.pass_rows)) : py::none();
  d["positions"] = stats.positions;
  d["capacity"] = stats.capacity;
  const auto& c = stats.cache;
  py::dict cache;
  cache["hits"] = c.hits;
  cache["misses"] = c.misses;
  cache["reused_tokens"] = c.reused_tokens;
  cache["saves"] = c.saves;
  cache["evictions"] = c.evictions;
  cache["states"] = c.states;
  cache["bytes"] = c.bytes;
  d["cache"] = cache;
  return d;
}

// A report (engine/report.h) as the dicts and lists Python's json module makes of it.
py::object from_json(const nlohmann::json& report) {
  return py::module_::import("json").attr("loads")(report.dump());
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<Media>(m, "Media", "One preprocessed image or audio clip (Engine.media).")
      .def_property_readonly("kind", [](const Media& x) { return media_kind_name(x.kind); })
      .def_readonly("soft_tokens", &Media::soft_tokens)
      .def_readonly("digest", &Media::digest)
      .def("__repr__", [](const Media& x) {
        return std::string("Media(kind='") + media_kind_name(x.kind) +
               "', soft_tokens=" + std::to_string(x.soft_tokens) + ")";
      });
  py::class_<DecodeResult>(m, "DecodeResult",
                           "What one decode produced: tokens (the stop id excluded), why it "
                           "ended, and the engine's own timings.")
      .def_property_readonly("tokens", [](const DecodeResult& r) { return to_list(r.tokens); })
      .def_readonly("finish", &DecodeResult::finish)
      .def_readonly("stop_id", &DecodeResult::stop_id)
      .def_readonly("prompt_tokens", &DecodeResult::prompt_tokens)
      .def_readonly("cached_tokens", &DecodeResult::cached_tokens)
      .def_readonly("read_s", &DecodeResult::read_s)
      .def_readonly("decode_s", &DecodeResult::decode_s)
      .def_readonly("drafted", &DecodeResult::drafted)
      .def_readonly("accepted", &DecodeResult::accepted)
      .def("__repr__", [](const DecodeResult& r) {
        return "DecodeResult(tokens=<" + std::to_string(r.tokens.size()) + " ids>, finish='" +
               r.finish + "', read_s=" + std::to_string(r.read_s) +
               ", decode_s=" + std::to_string(r.decode_s) + ")";
      });

  py::class_<TokenLogprob>(m, "TokenLogprob",
                           "One token's log-probability under the logits that scored it "
                           "(Engine.score): id, logprob, rank (1 + how many tokens those logits "
                           "put above it) and top, the likeliest (id, logprob) pairs there, best "
                           "first.")
      .def_readonly("id", &TokenLogprob::id)
      .def_readonly("logprob", &TokenLogprob::logprob)
      .def_readonly("rank", &TokenLogprob::rank)
      .def_readonly("top", &TokenLogprob::top)
      .def("__repr__", [](const TokenLogprob& t) {
        return "TokenLogprob(id=" + std::to_string(t.id) + ", logprob=" +
               std::to_string(t.logprob) + ", rank=" + std::to_string(t.rank) + ", top=<" +
               std::to_string(t.top.size()) + ">)";
      });

  py::class_<PyBatch> batch(
      m, "Batch",
      "Sequences decoded together over one Engine's weights (Engine.batch): submit queues, step "
      "advances every sequence by one scheduler step, result hands a finished one over. Used by "
      "the engine's owner thread.");
  py::class_<PyEngine> engine(
      m, "Engine",
      "Gemma 4 weights and ring KV cache on one device, used by the thread that "
      "created it.");
  engine
      .def(py::init([](const std::string& model_dir, const std::optional<std::string>& emb4_dir,
                       py::handle like, int64_t context, py::handle device, py::handle dtype,
                       int64_t prefill_chunk, int64_t threads, const std::string& int4,
                       const std::optional<std::string>& quantize, int64_t int4_activation_bits,
                       bool no_vision, bool no_audio, const std::optional<std::string>& draft_model,
                       const std::vector<std::string>& lora, int64_t max_lora) {
             EngineOptions options =
                 engine_options(model_dir, emb4_dir, like, context, device, dtype, prefill_chunk,
                                threads, int4, quantize, int4_activation_bits, no_vision,
                                no_audio, draft_model, lora, max_lora);
             {
               // Hub ids in place of directories are downloaded into the Hub cache (or found
               // there) first, as `serve --model org/name` does: minutes, without the GIL.
               py::gil_scoped_release released;
               options = server::resolve_hub_ids(std::move(options), hub::Options::from_env());
             }
             return std::make_unique<PyEngine>(options);
           }),
           py::arg("model_dir"), py::arg("emb4_dir") = py::none(), py::arg("like") = py::none(),
           py::arg("context") = kDefaultContext, py::kw_only(), py::arg("device") = py::none(),
           py::arg("dtype") = "bfloat16", py::arg("prefill_chunk") = 512, py::arg("threads") = 0,
           py::arg("int4") = "auto", py::arg("quantize") = py::none(),
           py::arg("int4_activation_bits") = 16, py::arg("no_vision") = false,
           py::arg("no_audio") = false, py::arg("draft_model") = py::none(),
           py::arg("lora") = std::vector<std::string>{},
           py::arg("max_lora") = EngineSettings{}.max_lora)
      .def("layout",
           [](PyEngine& self) {
             return from_json(layout_report(self.begin("Engine.layout").layout()));
           })
      .def("report",
           [](PyEngine& self) { return from_json(engine_report(self.begin("Engine.report"))); })
      .def_property_readonly(
          "vocab_size",
          [](PyEngine& self) { return self.begin("Engine.vocab_size").config().vocab_size; })
      .def_property_readonly(
          "eos_token_ids",
          [](PyEngine& self) {
            return to_list(self.begin("Engine.eos_token_ids").config().eos_token_ids);
          })
      .def_property_readonly(
          "device",
          [](PyEngine& self) { return self.begin("Engine.device").options().device.str(); })
      .def_property_readonly(
          "dtype",
          [](PyEngine& self) { return dtype_name(self.begin("Engine.dtype").options().dtype); })
      .def_property_readonly(
          "load_seconds",
          [](PyEngine& self) { return self.begin("Engine.load_seconds").load_seconds(); })
      .def_property_readonly("owner_thread", &PyEngine::owner_name)
      .def(
          "logits",
          [](PyEngine& self, py::handle ids, const std::vector<Media>& media,
             const std::optional<std::map<std::string, double>>& lora) {
            Engine& engine = self.begin("Engine.logits", /*exclusive=*/true);
            const auto tokens = to_ids(ids, "ids");
            at::Tensor logits;
            {
              py::gil_scoped_release released;
              logits = engine.logits(tokens, media, lora);
            }
            return to_python(logits);
          },
          py::arg("ids"), py::kw_only(), py::arg("media") = std::vector<Media>{},
          py::arg("lora") = py::none())
      .def(
          "score",
          [](PyEngine& self, py::handle ids, int64_t top, const std::vector<Media>& media,
             const std::optional<std::map<std::string, double>>& lora) {
            Engine& engine = self.begin("Engine.score", /*exclusive=*/true);
            const auto tokens = to_ids(ids, "ids");
            py::gil_scoped_release released;
            return engine.score(tokens, top, media, lora);
          },
          py::arg("ids"), py::kw_only(), py::arg("top") = 0,
          py::arg("media") = std::vector<Media>{}, py::arg("lora") = py::none(),
          "Each token of `ids` after the first scored under the positions before it: a list of "
          "len(ids) - 1 TokenLogprob in order, each with its `top` likeliest tokens (a prompt's "
          "logprobs; the sum of logprob is its log-likelihood, for perplexity). The prompt is read "
          "64 positions through the head at a time, so, unlike logits(), no [len(ids), vocab] "
          "array is ever held; nothing is generated. ValueError for fewer than two ids, top "
          "outside [0, vocab_size], or what logits() refuses. media and lora as in decode().")
      .def(
          "draft",
          [](PyEngine& self, py::handle ids, int64_t count) {
            Engine& engine = self.begin("Engine.draft", /*exclusive=*/true);
            const auto tokens = to_ids(ids, "ids");
            py::gil_scoped_release released;
            return engine.draft_after(tokens, count);
          },
          py::arg("ids"), py::arg("count"),
          "The model's greedy next token after the prompt `ids`, then `count` tokens the "
          "assistant (draft_model) guesses after it: what a decode's first drafting pass checks. "
          "ValueError without a draft model, for a bad prompt or a count below 1.")
      .def_property_readonly(
          "has_vision", [](PyEngine& self) { return self.begin("Engine.has_vision").has_vision(); })
      .def_property_readonly(
          "has_audio", [](PyEngine& self) { return self.begin("Engine.has_audio").has_audio(); })
      .def("sleep", &PyEngine::sleep,
           "Frees the weights, the towers and the rings (the server's --sleep-idle-seconds); the "
           "properties and checks still answer, a call that runs the model raises RuntimeError "
           "until wake(). RuntimeError while a Batch of this engine is alive.")
      .def(
          "wake",
          [](PyEngine& self) {
            Engine& engine = self.begin("Engine.wake", /*exclusive=*/true);
            py::gil_scoped_release released;
            engine.wake();
          },
          "Loads the weights again as the constructor did; nothing when awake.")
      .def_property_readonly("asleep",
                             [](PyEngine& self) { return self.begin("Engine.asleep").asleep(); })
      .def(
          "load_lora",
          [](PyEngine& self, const std::string& dir, const std::optional<std::string>& name,
             double scale) {
            Engine& engine = self.begin("Engine.load_lora", /*exclusive=*/true);
            LoraSpec spec = parse_lora_spec(dir);
            if (name) spec.name = *name;
            spec.scale = scale;
            py::gil_scoped_release released;
            spec.dir = hub::resolve_if_repo_id(spec.dir, hub::Options::from_env());
            engine.load_lora(spec);
          },
          py::arg("dir"), py::kw_only(), py::arg("name") = py::none(), py::arg("scale") = 1.0,
          "Loads a LoRA adapter (PEFT's format) beside the weights, called `name` (dir's last "
          "part when None), at `scale` for calls that name none. ValueError for a name loaded "
          "already, more than max_lora adapters, or what the adapter holds that cannot be "
          "applied.")
      .def(
          "unload_lora",
          [](PyEngine& self, const std::string& name) {
            Engine& engine = self.begin("Engine.unload_lora", /*exclusive=*/true);
            py::gil_scoped_release released;
            engine.unload_lora(name);
          },
          py::arg("name"),
          "Unloads the LoRA adapter `name`: later calls cannot name it; a Batch sequence that "
          "applies it keeps it until it ends. ValueError naming those loaded when none is so "
          "called.")
      .def(
          "set_lora_scales",
          [](PyEngine& self, const std::map<std::string, double>& scales) {
            self.begin("Engine.set_lora_scales").set_lora_scales(scales);
          },
          py::arg("scales"),
          "Each adapter's scale for later calls that name none: those in `scales` at theirs, "
          "the rest at 0. ValueError, and nothing changed, for a name not loaded.")
      .def(
          "media",
          [](PyEngine& self, const py::list& images, const py::list& audio, int64_t image_tokens) {
            Engine& engine = self.begin("Engine.media", /*exclusive=*/true);
            std::vector<Media> out;
            for (py::handle image : images) {
              const auto options = engine.image_options(image_tokens);
              if (py::isinstance<py::bytes>(image)) {
                const std::string bytes = image.cast<std::string>();
                py::gil_scoped_release released;
                out.push_back(image_media(preprocess_image(decode_image(bytes), options)));
              } else {
                const at::Tensor rgb = to_tensor(image, "image (bytes or an RGB uint8 tensor)");
                py::gil_scoped_release released;
                out.push_back(image_media(preprocess_image(rgb, options)));
              }
            }
            for (py::handle clip : audio) {
              engine.check_tower(MediaKind::kAudio);
              if (py::isinstance<py::bytes>(clip)) {
                const std::string bytes = clip.cast<std::string>();
                py::gil_scoped_release released;
                out.push_back(audio_media(audio_features_from_file(bytes, engine.audio_options())));
              } else {
                const at::Tensor samples = to_tensor(clip, "audio (WAV or MP3 bytes or float samples)");
                py::gil_scoped_release released;
                out.push_back(audio_media(audio_features(samples, engine.audio_options())));
              }
            }
            return out;
          },
          py::kw_only(), py::arg("images") = py::list(), py::arg("audio") = py::list(),
          py::arg("image_tokens") = 280,
          "Images (encoded bytes or RGB uint8 [3, H, W]) and audio clips (WAV or MP3 bytes or mono "
          "float samples at the checkpoint's sampling rate) preprocessed for this checkpoint, "
          "images first: the `media` of decode and logits. ValueError naming a missing or "
          "disabled tower and bad inputs.")
      .def(
          "expand_media",
          [](PyEngine& self, py::handle ids, const std::vector<Media>& media) {
            Engine& engine = self.begin("Engine.expand_media");
            return to_list(expand_media_placeholders(to_ids(ids, "ids"), media, engine.config()));
          },
          py::arg("ids"), py::arg("media"),
          "Each image_token_id of `ids` (the <|image|> a chat template writes) becomes boi, the "
          "n-th image's soft tokens, eoi; each audio_token_id likewise for the n-th clip. "
          "ValueError when placeholders and media of a kind differ in number.")
      .def(
          "generate",
          [](PyEngine& self, py::handle ids, int64_t max_new, int64_t read_every) {
            DecodeOptions options;
            options.max_new = max_new;
            options.read_every = read_every;
            options.ignore_eos = true;
            const auto r =
                run_decode(self, "Engine.generate", to_ids(ids, "ids"), options, py::none());
            return py::make_tuple(to_list(r.tokens), r.read_s, r.decode_s);
          },
          py::arg("ids"), py::arg("max_new"), py::arg("read_every") = 1)
      .def(
          "batch",
          [](py::object self, int64_t rows, int64_t step_tokens, double cache_mb,
             int64_t cache_block, int64_t pass_rows) {
            // Below 2^43 MiB, so that its bytes fit an int64 (NaN and inf fail too).
            if (!(cache_mb >= 0 && cache_mb < 8796093022208.0)) {
              throw ValueError("cache_mb must be a number of MiB from 0 to below 2^43, got " +
                               std::string(py::str(py::float_(cache_mb))));
            }
            const auto cache_bytes = static_cast<int64_t>(cache_mb * (1 << 20));
            return std::make_unique<PyBatch>(
                std::move(self),
                BatchOptions{rows, step_tokens, cache_bytes, cache_block, pass_rows});
          },
          "A Batch of `rows` sequences decoded together over this engine's weights (rings of its "
          "own, each row as large as the engine's context). step_tokens: tokens one step may "
          "put through the model while a row decodes (one per decoding row, the rest for prompt "
          "chunks; with none decoding, a step reads up to a whole prefill_chunk); 0: "
          "min(prefill_chunk, 128) + rows. cache_mb: the prefix cache's budget in MiB (0: none), "
          "cache_block its block of positions. pass_rows: rows (padding included) one forward "
          "pass may take when it reads several prompts together (1: each on its own; 0: 1 on "
          "the CPU, no limit on other devices). ValueError for rows < 1, step_tokens <= rows, a "
          "negative cache_mb or pass_rows, or a cache_block below 1.",
          py::arg("rows") = 4, py::arg("step_tokens") = 0, py::arg("cache_mb") = 0.0,
          py::arg("cache_block") = 256, py::arg("pass_rows") = 0);
  def_decoding(
      engine, "decode", "ids",
      "Decodes after `ids`: greedy unless temperature > 0, else sampled after logit_bias, "
      "penalties, temperature, top_k, top_p and min_p, in that order; a seed reproduces the "
      "tokens. Sampling values out of range raise ValueError. grammar_kind (json_schema, "
      "json_object, regex, lark) with `grammar` constrains the output to it (every token read "
      "back, as with read_every=1; ValueError naming what llguidance cannot enforce). "
      "draft_max > 0: speculative decoding by prompt lookup, the same tokens (DecodeResult's "
      "drafted and accepted count the draft tokens checked and kept). lora: each LoRA adapter's "
      "scale by name, those left out at 0 (None: the scales they were loaded with).",
      [](PyEngine& self, py::handle ids, py::handle on_tokens, const DecodeArgs& args) {
        return run_decode(self, "Engine.decode", to_ids(ids, "ids"),
                          decode_options(self, "Engine.decode", args), on_tokens, args.media);
      });

  def_batch_decoding(
      batch, "submit", "ids",
      "Queues a sequence with Engine.decode's arguments (read_every is taken as 1: every step "
      "reads each row's token back) and returns its id; on_tokens sees its tokens. ValueError "
      "for what Engine.decode refuses. With a prefix cache (Engine.batch's cache_mb): "
      "cache_salt shares cached states only with sequences of the same salt (vLLM's; None: "
      "those without one; ValueError for an empty one); reuse_points, positions in [1, len(ids)) "
      "where prompt chunks end and a state is saved, so that a later prompt that parts from "
      "this one there starts from it (where a chat's turns begin; ValueError for a point that "
      "is not an int or lies outside).",
      [](PyBatch& self, py::handle ids, py::handle on_tokens, const DecodeArgs& args,
         const CacheArgs& cache) {
        const auto prompt = to_ids(ids, "ids");
        check_reuse_points(cache, prompt, "ids");
        return self.submit("Batch.submit", prompt,
                           with_cache(decode_options(self.engine(), "Batch.submit", args), cache),
                           on_tokens, args.media);
      });
  def_batch_decoding(
      batch, "decode_many", "prompts",
      "Decodes every prompt in `prompts` (a sequence of id sequences) with the same arguments, "
      "together in this batch, and returns their DecodeResults in order: each the result "
      "Engine.decode gives for that prompt alone. on_tokens(index, tokens) sees the tokens of "
      "prompt `index`; a falsy return cancels that sequence alone. cache_salt as in submit; "
      "reuse_points serve every prompt, so each point must lie inside each prompt (ValueError "
      "naming the first prompt it does not fit). The GIL is released during each step.",
      [](PyBatch& self, py::handle prompts, py::handle on_tokens, const DecodeArgs& args,
         const CacheArgs& cache) {
        check_no_media(args, "Batch.decode_many");
        check_callable(on_tokens);
        if (PyUnicode_Check(prompts.ptr()) || !py::isinstance<py::iterable>(prompts)) {
          throw ValueError("prompts must be a sequence of token id sequences, got " +
                           std::string(py::str(py::type::handle_of(prompts).attr("__name__"))));
        }
        // Every prompt and argument is checked before any is queued, and the sequences this
        // call queued end with it when it leaves by an exception (a refused submit, an on_tokens
        // error, Ctrl-C): the batch is then as it was. Sequences queued by others (submit) go
        // on, and their results wait for result().
        std::vector<std::vector<int64_t>> prompt_ids;
        for (py::handle prompt : prompts) {
          const std::string what = "prompts[" + std::to_string(prompt_ids.size()) + "]";
          prompt_ids.push_back(to_ids(prompt, what.c_str()));
          check_reuse_points(cache, prompt_ids.back(), what,
                             ": one list serves every prompt, so each point must lie inside each");
        }
        const DecodeOptions options =
            with_cache(decode_options(self.engine(), "Batch.decode_many", args), cache);
        const auto partial = py::module_::import("functools").attr("partial");
        std::vector<int64_t> ids;
        std::map<int64_t, DecodeResult> results;
        try {
          for (const auto& prompt : prompt_ids) {
            const py::object callback =
                on_tokens.is_none() ? py::none() : partial(on_tokens, ids.size());
            ids.push_back(self.submit("Batch.decode_many", prompt, options, callback));
          }
          while (results.size() < ids.size()) {
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            for (const int64_t id : self.step("Batch.decode_many")) {
              if (std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
              results[id] = self.batch("Batch.decode_many").take_result(id);
            }
          }
        } catch (...) {
          std::vector<int64_t> unfinished;
          for (const int64_t id : ids) {
            if (!results.contains(id)) unfinished.push_back(id);
          }
          self.abandon(unfinished);
          throw;
        }
        std::vector<DecodeResult> ordered;
        for (const int64_t id : ids) ordered.push_back(std::move(results.at(id)));
        return ordered;
      });
  batch
      .def(
          "step", [](PyBatch& self) { return to_list(self.step("Batch.step")); },
          "One step: admits queued sequences into free rows, reads prompt chunks within the "
          "token budget, decodes one token for every row past its prompt. Returns the ids that "
          "finished (their results wait in result()). GIL released; on_tokens callables run "
          "with it, and an exception from one ends its sequence and is raised here.")
      .def(
          "cancel",
          [](PyBatch& self, py::handle id) {
            self.batch("Batch.cancel").cancel(to_sequence_id(id, "Batch.cancel"));
          },
          "Ends a queued or running sequence at the next step (finish 'cancelled'). ValueError "
          "for an id that is neither.",
          py::arg("id"))
      .def(
          "result",
          [](PyBatch& self, py::handle id) {
            return self.batch("Batch.result").take_result(to_sequence_id(id, "Batch.result"));
          },
          "The DecodeResult of a finished sequence, handed over once. ValueError otherwise.",
          py::arg("id"))
      .def(
          "save_slot",
          [](PyBatch& self, int64_t row, const std::string& path) {
            const SlotOutcome saved = self.slot(
                "Batch.save_slot", [&](Batch& b) { return b.save_slot(row, path); });
            return py::dict(py::arg("tokens") = saved.tokens, py::arg("bytes") = saved.bytes);
          },
          "Writes the prefix cache state that the last sequence to finish in row `row` left (or "
          "the last one restored into it) to a file at `path` (llama-server's slot save): "
          "{'tokens', 'bytes'}. ValueError when the row holds none or the batch has no cache.",
          py::arg("row"), py::arg("path"))
      .def(
          "restore_slot",
          [](PyBatch& self, int64_t row, const std::string& path) {
            const SlotOutcome restored = self.slot(
                "Batch.restore_slot", [&](Batch& b) { return b.restore_slot(row, path); });
            return py::dict(py::arg("tokens") = restored.tokens,
                            py::arg("bytes") = restored.bytes);
          },
          "Reads a state save_slot wrote (by any engine on the same weights) into the prefix "
          "cache as row `row`'s: a prompt starting with its tokens then starts from it. "
          "FileNotFoundError without the file; ValueError for a file of other weights or rings "
          "(naming what differs) or a state larger than the cache's budget.",
          py::arg("row"), py::arg("path"))
      .def(
          "erase_slot",
          [](PyBatch& self, int64_t row) {
            return self
                .slot("Batch.erase_slot",
                      [&](Batch& b) { return SlotOutcome{b.erase_slot(row)}; })
                .tokens;
          },
          "Forgets row `row`'s state in the prefix cache; the tokens it held (0: none).",
          py::arg("row"))
      .def_property_readonly("idle", [](PyBatch& self) { return self.batch("Batch.idle").idle(); })
      .def("stats", [](PyBatch& self) { return stats_dict(self.batch("Batch.stats").stats()); });
}

}  // namespace torchtpu::python
