// OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}) over the chat path: a
// request's input items become chat messages (openai.h's GenerationRequest, parsed by the chat
// parser itself), and the parsed output comes back as Responses output items, whole or as the
// event stream the official clients accumulate. No HTTP here (tests/cpp/server_test.cpp).
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "server/wire.h"

namespace torchtpu::server {

// A finished response and the conversation that led to it, for previous_response_id.
struct StoredResponse {
  ojson response;      // the response object, as GET /v1/responses/{id} returns it
  ojson conversation;  // chat messages: the earlier turns, this input and this output
  // Responses items: the earlier responses' input and output items, then this input's, each
  // with an id (GET /v1/responses/{id}/input_items).
  ojson input_items;
};

// The responses kept for `store: true` (the default): the last `capacity` by use, in memory only.
// Thread-safe; a lookup counts as a use.
class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity = 256);
  void put(const std::string& id, StoredResponse entry);
  std::optional<StoredResponse> get(const std::string& id);
  // Whether the store held `id` (which it no longer does).
  bool erase(const std::string& id);

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::list<std::string> order_;  // most recently used first
  struct Slot {
    StoredResponse entry;
    std::list<std::string>::iterator position;
  };
  std::unordered_map<std::string, Slot> slots_;
};

struct ResponsesRequest {
  GenerationRequest generation;
  // The chat messages of this turn without `instructions` (which apply to one response only):
  // what a later previous_response_id continues.
  ojson conversation;
  ojson input_items;  // as StoredResponse's
  bool store = true;
  bool one_call = false;          // parallel_tool_calls: false keeps the first call only
  bool sealed_reasoning = false;  // include: ["reasoning.encrypted_content"]
  // The tools offered as NAMESPACE.NAME, from a namespace tool: their calls go out as
  // function_call items with that namespace and name.
  std::set<std::string> namespaced;
  // Request fields the response object repeats (instructions, tools, temperature, ...).
  ojson echo;
};

// ApiError 400 naming the field ("input[2].call_id") for anything malformed or unsupported, 404
// for a previous_response_id the store does not hold.
ResponsesRequest parse_responses_request(const ojson& body, ResponseStore& store);

// One page of a stored response's input items, as GET /v1/responses/{id}/input_items lists them:
// `query` holds limit (1-100, 20 when absent), order ("desc", the default, or "asc") and after
// (the id of the item the page starts after). ApiError 400 naming the parameter for anything
// else, or a value out of range.
ojson input_items_page(const ojson& items, const std::multimap<std::string, std::string>& query);

// An error about a chat field that a Responses field became, renamed to that field
// ("response_format.json_schema.schema" is "text.format.schema"); others as they are.
ApiError as_responses_error(const ApiError& error);

// One response, streamed or whole. With a store, finish() keeps the response there.
class ResponsesRenderer : public Renderer {
 public:
  ResponsesRenderer(std::string model, const ResponsesRequest& request, ResponseStore* store);
  std::string start() override;
  void logprobs(const ojson& entries) override;
  std::string add(const OutputDelta& delta) override;
  std::string finish(const GenerationOutcome& outcome) override;
  std::string error(const ApiError& error) override;
  ojson body() const override { return response_; }

 private:
  enum class Open { kNone, kReasoning, kMessage };
  std::string event(const std::string& type, ojson data);
  std::string open(Open kind);
  // Ends the open item; `status` is a message item's.
  std::string close(const char* status = "completed");

  ojson response_;
  ojson conversation_;
  ojson input_items_;
  ResponseStore* store_;
  bool sealed_reasoning_;
  std::set<std::string> namespaced_;
  int64_t sequence_ = 0;
  Open open_ = Open::kNone;
  std::string item_id_;  // of the open item
  std::string text_;     // of the open item
  ojson logprobs_ = ojson::array();       // of the tokens behind the next add()
  ojson text_logprobs_ = ojson::array();  // of the open message's text
  ojson assistant_;      // this output as a chat message, for the store
};

}  // namespace torchtpu::server
