// How deeply JSON from outside (request bodies, checkpoint files, model output) may nest arrays
// and objects, and a parse that enforces it. Whatever reads parsed JSON afterwards (copies, dump()
// in error messages, the chat template, the MCP tools) recurses once per level, so a few MiB of
// '[' would overflow the stack and end the process; real requests, tool schemas and checkpoint
// files stay far below.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace torchtpu {

constexpr int kMaxJsonDepth = 64;

// Json::parse(text), calling too_deep() (which throws) at the first array or object nested deeper
// than kMaxJsonDepth, while parsing, before anything recursive sees it. Other failures throw as
// Json::parse does.
template <class Json, class TooDeep>
Json parse_json_within_depth(std::string_view text, const TooDeep& too_deep) {
  // The callback sees each array and object as it opens, at its depth (0 for the outermost).
  return Json::parse(text, [&](int depth, typename Json::parse_event_t event, Json&) {
    const bool opens =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) too_deep();
    return true;
  });
}

}  // namespace torchtpu
