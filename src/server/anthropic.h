// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) over the chat path:
// system, content blocks and tools become chat messages (openai.h's GenerationRequest, parsed by
// the chat parser itself), and the parsed output comes back as content blocks, whole or as
// Anthropic's event stream. Errors have Anthropic's shape. No HTTP here.
#pragma once

#include <string>

#include "server/wire.h"

namespace torchtpu::server {

struct MessagesRequest {
  GenerationRequest generation;
  bool one_call = false;       // tool_choice.disable_parallel_tool_use
  bool omit_thinking = false;  // thinking.display "omitted"
};

// ApiError 400 naming the field ("messages.1.content.0.tool_use_id") for anything malformed or
// unsupported. output_config.format (a JSON schema) is enforced as chat's response_format is.
// count_tokens (for_count) takes the same body without max_tokens.
MessagesRequest parse_messages_request(const ojson& body, bool for_count = false);

// An error about a chat field that a Messages field became, renamed to that field
// ("response_format.json_schema.schema" is "output_config.format.schema", a tool's
// "tools[1].function.parameters.properties" "tools.1.input_schema.properties"); others as they are.
ApiError as_messages_error(const ApiError& error);

// {"type":"error","error":{"type","message"}}, the type being Anthropic's word for the status
// (invalid_request_error, authentication_error, permission_error, not_found_error,
// request_too_large, rate_limit_error, api_error, overloaded_error).
ojson anthropic_error_body(const ApiError& error);

// One message, streamed or whole.
class MessagesRenderer : public Renderer {
 public:
  MessagesRenderer(std::string model, int64_t prompt_tokens, const MessagesRequest& request);
  std::string start() override;
  std::string add(const OutputDelta& delta) override;
  std::string finish(const GenerationOutcome& outcome) override;
  std::string error(const ApiError& error) override;
  ojson body() const override { return message_; }

 private:
  enum class Open { kNone, kThinking, kText };
  std::string open(Open kind);
  std::string close();

  ojson message_;
  bool omit_thinking_;
  Open open_ = Open::kNone;
  std::string text_;  // of the open block
};

}  // namespace torchtpu::server
