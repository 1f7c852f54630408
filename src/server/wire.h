// What the wire formats other than chat/completions' own (the Responses API, Anthropic Messages)
// share with the server: a request becomes a GenerationRequest (openai.h) and runs on the chat
// path; its output comes back through a Renderer, which turns the parsed output (answer text,
// reasoning, tool calls) into that format's stream events and final body.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "server/openai.h"
#include "text/output_parser.h"

namespace torchtpu::server {

// How one generation ended.
struct GenerationOutcome {
  std::string finish;         // stop | length | tool_calls (chat's finish_reason words)
  std::string stop_sequence;  // the client's stop sequence that ended it, "" for none
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // of completion_tokens, those of the thinking channel's text
  int64_t cached_tokens = 0;     // of prompt_tokens, those the prefix cache gave
  double read_s = 0;             // reading the prompt, until the first token was known
  double decode_s = 0;           // the steps after it
  bool context_full = false;     // "length" came from the context's end, not the token budget
};

// One answer in one wire format. The server calls start() once, add() for each piece of parsed
// output in order, then finish() or, when the engine failed, error(); each returns the
// server-sent events to write ("" for none). A whole (not streamed) answer is body() after
// finish(), so both ways to answer are the same code.
class Renderer {
 public:
  virtual ~Renderer() = default;
  virtual std::string start() = 0;
  virtual std::string add(const OutputDelta& delta) = 0;
  // Before add(), when the request asked for logprobs: those of the tokens that piece came from,
  // as chat's logprobs.content entries (token, logprob, bytes, top_logprobs). Formats without
  // logprobs ignore them.
  virtual void logprobs(const ojson& /*entries*/) {}
  virtual std::string finish(const GenerationOutcome& outcome) = 0;
  virtual std::string error(const ApiError& error) = 0;
  virtual ojson body() const = 0;
  // What a stream of it is sent as.
  virtual std::string content_type() const { return "text/event-stream"; }
};

// One server-sent event with a name, as both APIs frame theirs: "event: NAME\ndata: JSON\n\n".
std::string sse_event(const std::string& name, const ojson& data);

// Parses a tool call's arguments string (OpenAI's wire form) into the object the chat template
// reads; ApiError 400 naming `param` when it is not a JSON object.
ojson parse_arguments(const std::string& arguments, const std::string& param);

// The error with chat's field names replaced by those of the wire format whose fields became
// them: each pair is {chat's prefix, the format's}, longest chat prefix first (an error naming
// "response_format.json_schema.schema" renamed by {"response_format.json_schema", "text.format"}
// names "text.format.schema"), in `param` and in the message. Other errors are returned as they
// are.
ApiError renamed(const ApiError& error,
                 const std::vector<std::pair<std::string, std::string>>& prefixes);

}  // namespace torchtpu::server
