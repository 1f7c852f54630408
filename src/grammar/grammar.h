// What a constrained output must follow: a grammar and the language it is written in. A plain value
// (no llguidance, no ATen), so request parsers can build one; grammar/constraint.h compiles it.
#pragma once

#include <string>

namespace torchtpu {

enum class GrammarKind {
  kJsonSchema,  // a JSON Schema (llguidance's subset: docs/API.md, "Structured output")
  kJsonObject,  // any JSON object; `source` is unused
  kRegex,       // a Rust-syntax regular expression over the output text
  kLark,        // llguidance's Lark dialect; <[ID]> matches the special token ID
};

struct Grammar {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string source;
};

}  // namespace torchtpu
