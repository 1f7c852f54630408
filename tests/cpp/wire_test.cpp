// The Responses and Messages wire formats' pure parts: input items and content blocks as the chat
// messages the template reads, the response store's eviction, and the renderers' event order. The
// SDKs' view of the same endpoints is in tests/js/responses.test.mjs and messages.test.mjs.
#include <gtest/gtest.h>

#include <functional>

#include "server/anthropic.h"
#include "server/responses.h"
#include "server/stop_strings.h"

namespace torchtpu::server {
namespace {

ApiError error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "");
}

// The "event: NAME" lines of a stream of server-sent events, in order.
std::vector<std::string> event_names(const std::string& sse) {
  std::vector<std::string> names;
  for (size_t at = sse.find("event: "); at != std::string::npos; at = sse.find("event: ", at)) {
    at += 7;
    names.push_back(sse.substr(at, sse.find('\n', at) - at));
  }
  return names;
}

TEST(ResponsesRequest, ItemsOfOneAssistantTurnMergeIntoOneChatMessage) {
  ResponseStore store;
  const auto r = parse_responses_request(ojson::parse(R"({"instructions": "Be brief.", "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]})"),
                                         store);
  EXPECT_EQ(r.generation.messages, ojson::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "Hm.",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])"));
  // The instructions apply to this response only: a continuation does not repeat them.
  EXPECT_EQ(r.conversation.size(), 3u);
  EXPECT_TRUE(r.store);
}

TEST(ResponsesRequest, MapsTheFlatToolsAndToolChoiceToChatsShape) {
  ResponseStore store;
  const auto r = parse_responses_request(ojson::parse(R"({"input": "hi",
      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
      "tool_choice": {"type": "function", "name": "f"}, "max_output_tokens": 7,
      "reasoning": {"effort": "low"}})"),
                                         store);
  EXPECT_EQ(r.generation.tools[0]["function"]["name"], "f");
  EXPECT_EQ(r.generation.tool_choice, "function");
  EXPECT_EQ(r.generation.tool_choice_function, "f");
  EXPECT_EQ(r.generation.max_tokens, 7);
  EXPECT_EQ(r.generation.template_kwargs["enable_thinking"], true);
}

TEST(ResponsesRequest, PreviousResponseIdContinuesTheStoredConversation) {
  ResponseStore store;
  store.put("resp_1", {ojson::object(), ojson::parse(R"([{"role": "user", "content": "a"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c9", "type": "function",
       "function": {"name": "f", "arguments": {}}}]}])")});
  const auto r = parse_responses_request(ojson::parse(R"({"previous_response_id": "resp_1",
      "input": [{"type": "function_call_output", "call_id": "c9", "output": "ok"}]})"),
                                         store);
  EXPECT_EQ(r.generation.messages.size(), 3u);
  EXPECT_EQ(r.generation.messages[2]["role"], "tool");
  const ApiError unknown = error_of([&] {
    parse_responses_request(ojson::parse(R"({"previous_response_id": "resp_2", "input": "x"})"),
                            store);
  });
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.param, "previous_response_id");
}

TEST(ResponseStore, KeepsTheMostRecentlyUsed) {
  ResponseStore store(2);
  store.put("a", {ojson(1), ojson::array()});
  store.put("b", {ojson(2), ojson::array()});
  EXPECT_TRUE(store.get("a"));  // a is now more recent than b
  store.put("c", {ojson(3), ojson::array()});
  EXPECT_TRUE(store.get("a"));
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(store.get("c")->response, 3);
}

TEST(ResponsesRenderer, EventsAreNumberedAndItemsOpenAndCloseInOrder) {
  ResponseStore store;
  const auto request = parse_responses_request(ojson::parse(R"({"input": "hi"})"), store);
  ResponsesRenderer renderer("m", request, &store);
  std::string sse = renderer.start();
  sse += renderer.add({"", "Thinking.", {}});
  sse += renderer.add({"Hello", "", {}});
  sse += renderer.add({"", "", {ToolCall{"f", {{"x", 1}}}}});
  sse += renderer.finish({"tool_calls", "", 5, 9, 2, 3});
  EXPECT_EQ(
      event_names(sse),
      (std::vector<std::string>{
          "response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added", "response.reasoning_text.delta",
          "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
          "response.output_item.added", "response.content_part.added", "response.output_text.delta",
          "response.output_text.done", "response.content_part.done", "response.output_item.done",
          "response.output_item.added", "response.function_call_arguments.delta",
          "response.function_call_arguments.done", "response.output_item.done",
          "response.completed"}));
  const ojson body = renderer.body();
  EXPECT_EQ(body["output"].size(), 3u);
  EXPECT_EQ(body["usage"]["total_tokens"], 14);
  EXPECT_EQ(body["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(body["usage"]["input_tokens_details"]["cached_tokens"], 3);
  // Stored with the output as an assistant turn, ready for previous_response_id.
  const auto stored = store.get(body["id"].get<std::string>());
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->conversation.back()["content"], "Hello");
  EXPECT_EQ(stored->conversation.back()["reasoning_content"], "Thinking.");
}

TEST(ResponsesRenderer, StoreFalseKeepsNothing) {
  ResponseStore store;
  const auto request =
      parse_responses_request(ojson::parse(R"({"input": "hi", "store": false})"), store);
  ResponsesRenderer renderer("m", request, &store);
  renderer.start();
  renderer.finish({"stop", "", 1, 1, 0});
  EXPECT_FALSE(store.get(renderer.body()["id"].get<std::string>()));
}

TEST(MessagesRequest, BlocksBecomeChatMessages) {
  const auto r = parse_messages_request(ojson::parse(R"({"max_tokens": 9, "system": [
      {"type": "text", "text": "Be brief."}], "stop_sequences": ["a", "b", "c", "d", "e"],
      "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm.", "signature": ""},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
        {"type": "text", "text": "And tomorrow?"}]}]})"));
  EXPECT_EQ(r.generation.messages, ojson::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "Hm.",
       "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
      {"role": "user", "content": "And tomorrow?"}])"));
  EXPECT_EQ(r.generation.max_tokens, 9);
  // Anthropic has no limit of four stop sequences.
  EXPECT_EQ(r.generation.stop.size(), 5u);
}

TEST(MessagesRequest, ToolChoiceAnyIsRequiredAndToolIsANamedFunction) {
  const std::string tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}],)";
  auto parse = [&](const std::string& choice) {
    return parse_messages_request(
               ojson::parse(R"({"max_tokens": 9,)" + tools + R"("tool_choice": )" + choice +
                            R"(, "messages": [{"role": "user", "content": "x"}]})"))
        .generation;
  };
  EXPECT_EQ(parse(R"({"type": "any"})").tool_choice, "required");
  EXPECT_EQ(parse(R"({"type": "tool", "name": "f"})").tool_choice_function, "f");
  EXPECT_TRUE(parse(R"({"type": "none"})").tools.is_null());
}

TEST(AnthropicErrorBody, NamesTheKindByStatus) {
  EXPECT_EQ(anthropic_error_body(ApiError(400, "bad")),
            ojson::parse(R"({"type": "error", "error": {"type": "invalid_request_error",
                             "message": "bad"}})"));
  EXPECT_EQ(anthropic_error_body(ApiError(401, ""))["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error_body(ApiError(404, ""))["error"]["type"], "not_found_error");
  EXPECT_EQ(anthropic_error_body(ApiError(429, ""))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(anthropic_error_body(ApiError(500, ""))["error"]["type"], "api_error");
  EXPECT_EQ(anthropic_error_body(ApiError(503, ""))["error"]["type"], "overloaded_error");
}

TEST(MessagesRenderer, StopSequenceAndToolUseBecomeTheirStopReasons) {
  MessagesRenderer text("m", 4, MessagesRequest{});
  std::string sse = text.start();
  sse += text.add({"Hi", "", {}});
  sse += text.finish({"stop", "END", 4, 2, 0, 3});
  EXPECT_EQ(event_names(sse),
            (std::vector<std::string>{"message_start", "ping", "content_block_start",
                                      "content_block_delta", "content_block_stop", "message_delta",
                                      "message_stop"}));
  EXPECT_EQ(text.body()["stop_reason"], "stop_sequence");
  EXPECT_EQ(text.body()["stop_sequence"], "END");
  // Anthropic counts cache reads apart: the prompt is input_tokens + cache_read_input_tokens,
  // and message_delta carries the final figures.
  EXPECT_EQ(text.body()["usage"]["input_tokens"], 1);
  EXPECT_EQ(text.body()["usage"]["cache_read_input_tokens"], 3);
  const std::string delta_event = "event: message_delta\ndata: ";
  const auto at = sse.find(delta_event) + delta_event.size();
  const auto delta = ojson::parse(sse.substr(at, sse.find("\n\n", at) - at));
  EXPECT_EQ(delta["usage"], text.body()["usage"]);

  // Each call it is given is a tool_use block (disable_parallel_tool_use's first call only is
  // the server's job output rule, which js_messages checks).
  MessagesRenderer calls("m", 4, MessagesRequest{});
  calls.start();
  calls.add({"", "", {ToolCall{"f", {{"x", 1}}}, ToolCall{"g", nlohmann::json::object()}}});
  calls.finish({"tool_calls", "", 4, 9, 0});
  EXPECT_EQ(calls.body()["stop_reason"], "tool_use");
  ASSERT_EQ(calls.body()["content"].size(), 2u);
  EXPECT_EQ(calls.body()["content"][0]["input"], ojson::parse(R"({"x": 1})"));
  EXPECT_EQ(calls.body()["content"][1]["name"], "g");
}

TEST(MessagesRequest, AdaptiveThinkingIsOnAndDisplayOmittedKeepsTheTextBack) {
  const auto r = parse_messages_request(ojson::parse(R"({"max_tokens": 9,
      "thinking": {"type": "adaptive", "display": "omitted"},
      "messages": [{"role": "user", "content": "x"}]})"));
  EXPECT_EQ(r.generation.template_kwargs["enable_thinking"], true);
  EXPECT_TRUE(r.omit_thinking);
  MessagesRenderer renderer("m", 4, r);
  renderer.start();
  const std::string sse = renderer.add({"", "secret", {}});
  EXPECT_EQ(sse.find("secret"), std::string::npos);
  renderer.finish({"stop", "", 4, 1, 1});
  EXPECT_EQ(renderer.body()["content"][0],
            ojson::parse(R"({"type": "thinking", "thinking": "", "signature": ""})"));
}

TEST(Renamed, ChatsFieldNamesBecomeTheWireFormatsInParamAndMessage) {
  const ApiError chat(400, "'response_format.json_schema.schema' must be a JSON Schema object",
                      "invalid_request_error", "response_format.json_schema.schema", "x");
  const ApiError e = as_responses_error(chat);
  EXPECT_EQ(e.param, "text.format.schema");
  EXPECT_STREQ(e.what(), "'text.format.schema' must be a JSON Schema object");
  EXPECT_EQ(e.code, "x");
  EXPECT_EQ(as_messages_error(chat).param, "output_config.format.schema");
  EXPECT_EQ(as_responses_error(ApiError(400, "m", "invalid_request_error", "temperature")).param,
            "temperature");
}

TEST(StopStrings, SaysWhichSequenceMatchedFirstInTheText) {
  StopStrings stops({"b", "ab"});
  EXPECT_EQ(stops.push("xab"), "x");
  EXPECT_EQ(stops.matched(), "ab");
}

}  // namespace
}  // namespace torchtpu::server
