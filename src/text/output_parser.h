// Splits Gemma 4 model output, as the detokenizer emits it with special tokens shown, into answer
// text, reasoning and tool calls while it streams:
//   <|channel>thought\n REASONING \n<channel|>        the thinking channel
//   <|tool_call>call:NAME{key:value,...}<tool_call|>   a tool call
// Values are written as the chat template's format_argument writes them: strings between <|"|>
// delimiters (no escaping), numbers, true/false/null bare, nested {key:value} and [a,b].
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace torchtpu {

// The thinking channel's markers, as the detokenizer shows them.
inline constexpr std::string_view kChannelOpen = "<|channel>";
inline constexpr std::string_view kChannelClose = "<channel|>";

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // always an object, keys in the order the model wrote them
  std::string text;  // the call as the model wrote it, from <|tool_call> to <tool_call|>
};

// What one push() or finish() added to each part of the output.
struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

class OutputParser {
 public:
  // Text that could still be the start of a marker is held back until the next push decides it;
  // a tool call comes out whole once its closing <tool_call|> arrives.
  OutputDelta push(std::string_view text);
  // Ends the stream: releases held-back text; a call still open is flagged as cut off.
  OutputDelta finish();
  // True if the stream ended inside <|tool_call>...; its text is in raw_unparsed().
  bool cut_off_call() const { return cut_off_call_; }
  // The text of every call that could not be parsed or was cut off, for warnings. Such calls
  // appear neither in content nor in tool_calls.
  std::string raw_unparsed() const { return raw_unparsed_; }

 private:
  enum class Mode { kContent, kChannelHeader, kReasoning, kCall };
  void step(OutputDelta& out);
  Mode mode_ = Mode::kContent;
  std::string pending_;     // text not yet assigned to a part
  size_t call_search_ = 0;  // kCall: where to look for the next closing marker
  bool cut_off_call_ = false;
  std::string raw_unparsed_;
};

// Parses the text between <|tool_call> and <tool_call|> ("call:NAME{...}"). Throws ValueError
// naming the problem if it is not a complete call.
ToolCall parse_tool_call(std::string_view body);

}  // namespace torchtpu
