// How deeply JSON from outside (request bodies, checkpoint files, model output) may nest arrays
// and objects, and a parse that enforces it. Whatever reads parsed JSON afterwards (copies, dump()
// in error messages, the chat template, the MCP tools) recurses once per level, so a few MiB of
// '[' would overflow the stack and end the process; real requests, tool schemas and checkpoint
// files stay far below.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchtpu {

constexpr int kMaxJsonDepth = 64;

// Builds an ordered_json from nlohmann's SAX events as ordered_json::parse would (a repeated key
// keeps its first place and takes its last value), calling too_deep() at the first array or object
// nested deeper than kMaxJsonDepth. parse's own builder finds each key by a linear search of its
// object's members, so an object of n keys cost O(n^2): a logit_bias over the vocabulary (262,144
// keys, 3.5 MB) took 2 minutes of a core. Here each open object's keys are indexed by hash.
template <class TooDeep>
class OrderedJsonBuilder {
 public:
  using Json = nlohmann::ordered_json;
  explicit OrderedJsonBuilder(const TooDeep& too_deep) : too_deep_(too_deep) {}
  Json take() { return std::move(root_); }

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(Json::number_integer_t v) { return put(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return put(v); }
  bool string(Json::string_t& v) { return put(std::move(v)); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    open(Json::value_t::object);
    keys_.emplace_back();
    return true;
  }
  bool key(Json::string_t& k) {
    auto& members = open_.back()->get_ref<Json::object_t&>();
    const auto [at, fresh] = keys_.back().try_emplace(k, members.size());
    if (fresh) members.emplace_back(std::move(k), nullptr);
    slot_ = &(members.begin() + static_cast<std::ptrdiff_t>(at->second))->second;
    return true;
  }
  bool end_object() {
    open_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    open(Json::value_t::array);
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& error) {
    throw error;
  }

 private:
  // Where the next value goes: the root, a new last item of the open array, or the member the
  // open object's last key named. A pointer into an open container stays valid while it is open:
  // only the innermost open container grows.
  Json* place() {
    if (open_.empty()) return &root_;
    if (open_.back()->is_array()) {
      auto& items = open_.back()->get_ref<Json::array_t&>();
      items.emplace_back();
      return &items.back();
    }
    return slot_;
  }
  template <class Value>
  bool put(Value&& value) {
    *place() = Json(std::forward<Value>(value));
    return true;
  }
  void open(Json::value_t kind) {
    if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) too_deep_();
    Json* at = place();
    *at = Json(kind);
    open_.push_back(at);
  }

  const TooDeep& too_deep_;
  Json root_;
  std::vector<Json*> open_;  // the arrays and objects opened and not yet closed, outermost first
  std::vector<std::unordered_map<std::string, size_t>> keys_;  // per open object: key -> member
  Json* slot_ = nullptr;
};

// Json::parse(text), calling too_deep() (which throws) at the first array or object nested deeper
// than kMaxJsonDepth, while parsing, before anything recursive sees it. Other failures throw as
// Json::parse does.
template <class Json, class TooDeep>
Json parse_json_within_depth(std::string_view text, const TooDeep& too_deep) {
  if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
    OrderedJsonBuilder<TooDeep> builder(too_deep);
    Json::sax_parse(text, &builder);
    return builder.take();
  } else {
    // The callback sees each array and object as it opens, at its depth (0 for the outermost).
    return Json::parse(text, [&](int depth, typename Json::parse_event_t event, Json&) {
      const bool opens =
          event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
      if (opens && depth >= kMaxJsonDepth) too_deep();
      return true;
    });
  }
}

}  // namespace torchtpu
