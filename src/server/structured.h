// Structured output on the wire: OpenAI's `response_format` read into a grammar, and the grammar
// that makes a forced tool call name a declared tool with arguments valid for its parameters, in
// Gemma 4's own call syntax (the one the output parser reads). The engine enforces either one
// token by token (grammar/constraint.h).
#pragma once

#include <optional>
#include <set>
#include <string>

#include "grammar/grammar.h"
#include "server/openai.h"

namespace torchtpu::server {

// {"type": "text"} or absent: none. {"type": "json_object"}: any JSON object. {"type":
// "json_schema", "json_schema": {"name", "schema", "strict", "description"}}: the schema (enforced
// whether strict is true or false). ApiError 400 naming the field for anything else, unknown keys
// included. Whether llguidance supports every keyword of the schema is decided where it compiles.
std::optional<Grammar> parse_response_format(const ojson& body);

// The special tokens of Gemma 4's tool-call syntax: <|tool_call>, <tool_call|>, <|"|>.
struct ToolCallTokens {
  int64_t open = -1;
  int64_t close = -1;
  int64_t quote = -1;
};

// Where a tool-call grammar starts: after "<|tool_call>call:" in the prompt (tool_choice
// "required"), inside the arguments after "<|tool_call>call:NAME{" (a named function), or at the
// start of a reply that may be text, calls, or both (tool_choice "auto" under --constrain-tools).
enum class CallStart { kAfterCallPrefix, kInsideArguments, kReply };

// A Lark grammar (llguidance's dialect) of Gemma 4's calls "<|tool_call>call:NAME{key:value,...}
// <tool_call|>" to those of `tools` that `callable` names (at least one), from `start` on: one or
// more calls (kReply: text and any number of calls), arguments following each tool's `parameters`
// schema, properties in the schema's order. With kInsideArguments the first call is to the only
// callable tool. Values are written as the chat template writes them: strings between <|"|>
// delimiters, numbers, true/false/null bare, {key:value} and [a,b]. ApiError 400 naming the
// schema's path (tools[i].function.parameters..., i counting all of `tools`) for a keyword the
// grammar cannot enforce.
// `one_call`: a forced call (kAfterCallPrefix, kInsideArguments) is exactly one call.
std::string tool_call_grammar(const ojson& tools, const std::set<std::string>& callable,
                              const ToolCallTokens& tokens, CallStart start, bool one_call = false);

}  // namespace torchtpu::server
