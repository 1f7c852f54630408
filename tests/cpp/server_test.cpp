// The server's pure parts: OpenAI request parsing and errors, stop sequences over streamed text,
// the Prometheus rendering, and the disconnect check on real loopback sockets.
#include "server/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error_message.h"
#include "common/errors.h"
#include "server/connection.h"
#include "server/demo.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/stop_strings.h"

namespace torchtpu::server {
namespace {

ojson chat(const std::string& extra = "") {
  return ojson::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + extra + "}");
}

// The ApiError a parse throws, or a failure if it throws none.
ApiError error_of(const std::function<void()>& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}

TEST(ParseBody, MalformedJsonIsA400NamingTheProblem) {
  auto e = error_of([] { parse_body("{\"messages\": ["); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  // Where and what, without the JSON library's exception class.
  EXPECT_EQ(std::string(e.what()),
            "the request body is not valid JSON: parse error at line 1, column 15: syntax error "
            "while parsing value - unexpected end of input; expected '[', '{', or a literal");
  EXPECT_EQ(error_of([] { parse_body("[1,2]"); }).status, 400);
}

std::string nested(int depth) {
  return "{\"a\":" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
}

TEST(ParseBody, NestingBeyondTheLimitIsA400BeforeAnythingRecursesIntoIt) {
  EXPECT_NO_THROW(parse_body(nested(kMaxJsonDepth)));
  auto e = error_of([] { parse_body(nested(kMaxJsonDepth + 1)); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "json_too_deep");
  EXPECT_NE(std::string(e.what()).find("deeper than 64 levels"), std::string::npos);
  // Deep enough to overflow the stack of anything that recursed into it (a template's context,
  // dump()): refused while parsing, at the same cost as any 2 MB body.
  EXPECT_EQ(error_of([] { parse_body(nested(1 << 20)); }).code, "json_too_deep");
}

TEST(ChatRequest, ToolCallArgumentsNestedTooDeeplyAreA400NamingThem) {
  const std::string deep = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  ojson body = {{"messages",
                 {{{"role", "assistant"},
                   {"tool_calls",
                    {{{"type", "function"},
                      {"function", {{"name", "f"}, {"arguments", "{\"x\":" + deep + "}"}}}}}}}}}};
  auto e = error_of([&] { parse_chat_request(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "json_too_deep");
  EXPECT_EQ(e.param, "messages[0].tool_calls[0].function.arguments");
}

TEST(ParseBody, KeepsTheClientsKeyOrder) {
  auto body = parse_body(R"({"z":1,"a":2})");
  EXPECT_EQ(body.begin().key(), "z");
}

// parse_json builds its values from parse events rather than through ordered_json::parse (whose
// key lookups made n keys cost n^2): the value must be ordered_json::parse's, every kind of value,
// repeated keys (first place, last value) and failures included.
TEST(ParseBody, GivesWhatOrderedJsonParseGives) {
  for (const std::string text :
       {R"({"z":1,"a":[true,false,null,{"k":"v","j":{}}],"n":-5,"u":18446744073709551615,)"
        R"("f":1.5e3,"s":"\u00e9\n","e":[],"o":{}})",
        R"({"a":1,"b":2,"a":3})", R"({"x":{"y":[1,{"y":2,"y":[3]}]},"x":[4]})",
        R"([1,[2,[3,{"a":[{}]}]]])", R"("text")", "17", "null", R"(  {"a" : 1 }  )"}) {
    const ojson expected = ojson::parse(text);
    const ojson got = parse_json(text);
    EXPECT_EQ(got, expected) << text;
    EXPECT_EQ(got.dump(), expected.dump()) << text;  // the same order of keys
  }
  for (const std::string text : {R"({"a":1,})", R"({"a":1} x)", R"({"a")", "[1,2", "", "nan",
                                 R"({"a":"\ud800"})", "1e400"}) {
    std::string expected;
    try {
      ojson::parse(text);
    } catch (const ojson::exception& e) {
      expected = e.what();
    }
    std::string got;
    try {
      parse_json(text);
    } catch (const ojson::exception& e) {
      got = e.what();
    }
    EXPECT_FALSE(expected.empty()) << text;
    EXPECT_EQ(got, expected) << text;
  }
  // Many keys: every one kept, in order, the repeated one once with its last value.
  std::string many = "{";
  for (int i = 0; i < 100000; ++i)
    many += "\"" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  many += "\"7\":-1}";
  const ojson body = parse_json(many);
  ASSERT_EQ(body.size(), 100000u);
  EXPECT_EQ(body["7"], -1);
  EXPECT_EQ(std::next(body.begin(), 99999).key(), "99999");
}

TEST(ChatRequest, ReadsTheOpenAIFields) {
  auto r = parse_chat_request(chat(R"(,"max_tokens":7,"stop":["a","bc"],"stream":true,
      "stream_options":{"include_usage":true},"temperature":0.5,"top_p":1,"top_k":4,"seed":3,
      "n":1,"chat_template_kwargs":{"enable_thinking":true})"));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], true);
  EXPECT_EQ(r.messages.size(), 1u);
}

TEST(ChatRequest, SamplingFieldsGivenAreKeptAndOthersLeftUnset) {
  auto r = parse_chat_request(chat(R"(,"temperature":0.7,"top_p":0.9,"top_k":-1,"seed":-1,
      "logit_bias":{"42":-100,"7":2.5})"));
  EXPECT_EQ(r.sampling.temperature, 0.7);
  EXPECT_EQ(r.sampling.top_p, 0.9);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(r.sampling.logit_bias, (std::map<int64_t, double>{{7, 2.5}, {42, -100}}));
  EXPECT_FALSE(r.sampling.min_p.has_value());
  EXPECT_FALSE(parse_chat_request(chat()).sampling.temperature.has_value());
}

TEST(ChatRequest, MaxCompletionTokensWinsOverMaxTokens) {
  auto r = parse_chat_request(chat(R"(,"max_tokens":7,"max_completion_tokens":3)"));
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_FALSE(parse_chat_request(chat(R"(,"max_tokens":null)")).max_tokens.has_value());
}

TEST(ChatRequest, StopAsOneString) {
  EXPECT_EQ(parse_chat_request(chat(R"(,"stop":"\n")")).stop, std::vector<std::string>{"\n"});
}

TEST(ChatRequest, ContentAsTextParts) {
  auto body = ojson::parse(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})");
  EXPECT_TRUE(parse_chat_request(body).messages[0]["content"].is_array());
  body["messages"][0]["content"][1] = {{"type", "video_url"}, {"video_url", "x"}};
  auto e = error_of([&] { parse_chat_request(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[0].content[1].type");
}

TEST(ChatRequest, AssistantMayHaveNullContent) {
  auto body = ojson::parse(
      R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null}]})");
  EXPECT_NO_THROW(parse_chat_request(body));
  body["messages"][0]["content"] = nullptr;
  EXPECT_EQ(error_of([&] { parse_chat_request(body); }).param, "messages[0].content");
}

TEST(ChatRequest, AcceptsTheFiveRolesOfTheTemplate) {
  auto body = ojson::parse(R"({"messages":[{"role":"system","content":"s"},
      {"role":"developer","content":"d"},{"role":"user","content":"u"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
        "function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c","content":"t"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(parse_chat_request(body).messages.size(), 5u);
}

struct BadChat {
  std::string body;
  std::string param;
};

void PrintTo(const BadChat& c, std::ostream* os) { *os << c.body; }

// "3_max_tokens" for the fourth case, whose field is max_tokens.
std::string case_name(const ::testing::TestParamInfo<BadChat>& info) {
  std::string name = std::to_string(info.index) + "_";
  for (char c : info.param.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class ChatRequestErrors : public ::testing::TestWithParam<BadChat> {};

TEST_P(ChatRequestErrors, AreA400NamingTheField) {
  auto e = error_of([] { parse_chat_request(ojson::parse(GetParam().body)); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, GetParam().param);
  EXPECT_NE(std::string(e.what()).find(GetParam().param.empty() ? "" : GetParam().param),
            std::string::npos)
      << e.what();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ChatRequestErrors,
    ::testing::Values(
        BadChat{R"({})", "messages"}, BadChat{R"({"messages":[]})", "messages"},
        BadChat{R"({"messages":"hi"})", "messages"},
        BadChat{R"({"messages":[{"content":"hi"}]})", "messages[0].role"},
        BadChat{R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
        BadChat{R"({"messages":[{"role":"user"}]})", "messages[0].content"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"max_tokens":0})", "max_tokens"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"max_tokens":"5"})", "max_tokens"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"max_tokens":2.5})", "max_tokens"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"max_completion_tokens":-1})",
                "max_completion_tokens"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"n":0})", "n"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"n":129})", "n"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"n":1.5})", "n"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stream":"yes"})", "stream"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stop":[1]})", "stop[0]"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stop":["a","b","c","d","e"]})",
                "stop"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"temperature":"hot"})",
                "temperature"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"temperature":3})", "temperature"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"model":7})", "model"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"top_k":1.5})", "top_k"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"logit_bias":{"x":1}})",
                "logit_bias.x"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"logit_bias":{"5":101}})",
                "logit_bias.5"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stream_options":[]})",
                "stream_options"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stream_options":{}})",
                "stream_options"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"continue_final_message":true})",
                "continue_final_message"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"add_generation_prompt":false})",
                "add_generation_prompt"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],)"
                R"("chat_template_kwargs":{"add_generation_prompt":false}})",
                "chat_template_kwargs.add_generation_prompt"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"stream":false,)"
                R"("stream_options":{"include_usage":true}})",
                "stream_options"},
        BadChat{R"({"messages":[{"role":"wizard","content":"a"}]})", "messages[0].role"},
        BadChat{R"({"messages":[{"role":"user","content":"a"},{"role":"","content":"b"}]})",
                "messages[1].role"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"tools":[5]})", "tools[0]"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]})",
                "tools[0].function"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],
                    "tools":[{"type":"function","function":{"description":"d"}}]})",
                "tools[0].function.name"},
        BadChat{R"({"messages":[{"role":"user","content":"a"}],
                    "tools":[{"type":"function","function":{"name":"f"}},
                             {"type":"function","function":{"name":7}}]})",
                "tools[1].function.name"}),
    case_name);

TEST(CompletionRequest, PromptAsTextOrIds) {
  EXPECT_EQ(parse_completion_request(ojson::parse(R"({"prompt":"hi"})")).prompt, "hi");
  EXPECT_EQ(parse_completion_request(ojson::parse(R"({"prompt":["hi"]})")).prompt, "hi");
  EXPECT_EQ(*parse_completion_request(ojson::parse(R"({"prompt":[2,5]})")).prompt_ids,
            (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(*parse_completion_request(ojson::parse(R"({"prompt":[[2,5]]})")).prompt_ids,
            (std::vector<int64_t>{2, 5}));
}

TEST(CompletionRequest, ChoicesAsked) {
  EXPECT_EQ(parse_completion_request(ojson::parse(R"({"prompt":"a"})")).n, 1);
  EXPECT_EQ(parse_completion_request(ojson::parse(R"({"prompt":"a","n":128})")).n, 128);
  EXPECT_EQ(parse_chat_request(ojson::parse(R"({"messages":[{"role":"user","content":"a"}],
                                                "n":3})")).n,
            3);
}

TEST(CompletionRequest, Errors) {
  for (const char* body :
       {R"({})", R"({"prompt":""})", R"({"prompt":7})", R"({"prompt":["a",""]})",
        R"({"prompt":["a",7]})", R"({"prompt":[[1],"a",[]]})", R"({"prompt":[1,"a"]})",
        R"({"prompt":"a","n":0})", R"({"prompt":"a","echo":1})",
        R"({"prompt":"a","max_tokens":0})", R"({"prompt":"a","echo":true,"max_tokens":-1})",
        R"({"prompt":"a","prompt_logprobs":21})", R"({"prompt":"a","prompt_logprobs":true})",
        R"({"prompt":"a","prompt_logprobs":0,"stream":true})"}) {
    EXPECT_EQ(error_of([&] { parse_completion_request(ojson::parse(body)); }).status, 400) << body;
  }
}

TEST(CompletionRequest, SeveralPromptsAreTheFirstAndTheRestInOrder) {
  const auto r = parse_completion_request(ojson::parse(R"({"prompt":["a",[5,6],"c"],"n":2})"));
  EXPECT_EQ(r.prompt, "a");
  EXPECT_FALSE(r.prompt_ids);
  ASSERT_EQ(r.more_prompts.size(), 2u);
  EXPECT_EQ(r.more_prompts[0].ids, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(r.more_prompts[1].text, "c");
  const auto one = parse_completion_request(ojson::parse(R"({"prompt":[[5,6]]})"));
  EXPECT_EQ(one.prompt_ids, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(one.more_prompts.empty());
  const auto e = error_of([] {
    parse_completion_request(ojson::parse(R"({"prompt":["a",[2,"x"]]})"));
  });
  EXPECT_EQ(e.param, "prompt[1][1]");
  ojson many = {{"prompt", std::vector<std::string>(65, "a")}, {"n", 2}};
  EXPECT_EQ(error_of([&] { parse_completion_request(many); }).what(),
            std::string("'prompt' lists 65 prompts of 2 choices each ('n'): at most 128 choices "
                        "in all"));
}

TEST(CompletionRequest, EchoAndPromptLogprobs) {
  const auto plain = parse_completion_request(ojson::parse(R"({"prompt":"a"})"));
  EXPECT_FALSE(plain.echo);
  EXPECT_FALSE(plain.prompt_logprobs);
  const auto scored = parse_completion_request(
      ojson::parse(R"({"prompt":"a","echo":true,"max_tokens":0,"prompt_logprobs":0})"));
  EXPECT_TRUE(scored.echo);
  EXPECT_EQ(scored.max_tokens, 0);
  EXPECT_EQ(scored.prompt_logprobs, 0);
  const auto chat = parse_chat_request(
      ojson::parse(R"({"messages":[{"role":"user","content":"a"}],"prompt_logprobs":20})"));
  EXPECT_EQ(chat.prompt_logprobs, 20);
  EXPECT_EQ(error_of([] {
              parse_chat_request(
                  ojson::parse(R"({"messages":[{"role":"user","content":"a"}],"max_tokens":0})"));
            }).what(),
            std::string("'max_tokens' must be at least 1, got 0"));
}

TEST(TokenizeRequests, AsLlamaCppHasThem) {
  auto t = parse_tokenize_request(ojson::parse(R"({"content":"x","with_pieces":true})"));
  EXPECT_EQ(t.content, "x");
  EXPECT_FALSE(t.add_special);
  EXPECT_TRUE(t.with_pieces);
  EXPECT_EQ(parse_detokenize_request(ojson::parse(R"({"tokens":[1,2]})")),
            (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(error_of([] { parse_tokenize_request(ojson::parse("{}")); }).param, "content");
  EXPECT_EQ(error_of([] { parse_detokenize_request(ojson::parse(R"({"tokens":["a"]})")); }).param,
            "tokens[0]");
}

TEST(ErrorBody, IsTheOpenAIShape) {
  auto body = error_body(
      ApiError(404, "no such model", "invalid_request_error", "model", "model_not_found"));
  EXPECT_EQ(body.dump(), R"({"error":{"message":"no such model","type":"invalid_request_error",)"
                         R"("param":"model","code":"model_not_found"}})");
  EXPECT_TRUE(error_body(ApiError(500, "x", "server_error"))["error"]["param"].is_null());
}

// A 500's message comes from error_message: a c10 error (an engine check that failed) without
// the backtrace c10 appends, whose frames name the process's load addresses and library paths.
TEST(ErrorMessage, IsAC10ErrorsWithoutItsBacktraceAndAnyOtherErrorsWhat) {
  try {
    TORCH_CHECK(false, "attention: a query row at position ", 35, " sees no key");
  } catch (const std::exception& e) {
    ASSERT_NE(std::string(e.what()).find("Exception raised from"), std::string::npos);
    EXPECT_EQ(error_message(e), "attention: a query row at position 35 sees no key");
  }
  try {
    TORCH_CHECK_VALUE(false, "a value error");
  } catch (const std::exception& e) {
    EXPECT_EQ(error_message(e), "a value error");
  }
  EXPECT_EQ(error_message(std::runtime_error("plain")), "plain");
}

TEST(CompletionId, HasThePrefixAndIsFresh) {
  auto a = new_completion_id("chatcmpl-");
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, new_completion_id("chatcmpl-"));
}

// What the client must see: the text up to the first stop sequence (or all of it), whatever the
// pieces the text streamed in.
std::string reference_cut(const std::string& text, const std::vector<std::string>& stops) {
  size_t cut = std::string::npos;
  for (const auto& s : stops) cut = std::min(cut, text.find(s));
  return cut == std::string::npos ? text : text.substr(0, cut);
}

TEST(StopStrings, EveryWayOfSplittingTheStreamGivesTheCutText) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world. The end", {"."}},
      {"abcabcabd tail", {"abd"}},
      {"one\n\ntwo", {"\n\n", "tw"}},
      {"no stop here", {"xyz"}},
      {"ends with a partial st", {"stop"}},
      {"x <turn|> y", {"<turn|>"}},
      {"h\xC3\xA9llo \xE2\x9C\x93 done", {"\xE2\x9C\x93"}},
  };
  for (const auto& [text, stops] : cases) {
    const std::string want = reference_cut(text, stops);
    for (size_t a = 0; a <= text.size(); ++a) {
      for (size_t b = a; b <= text.size(); ++b) {
        StopStrings s(stops);
        std::string got = s.push(text.substr(0, a));
        got += s.push(text.substr(a, b - a));
        got += s.push(text.substr(b));
        got += s.finish();
        ASSERT_EQ(got, want) << "text '" << text << "' split at " << a << ", " << b;
        ASSERT_EQ(s.stopped(), want.size() < text.size());
      }
    }
  }
}

TEST(StopStrings, HoldsBackOnlyWhatCouldStartAStop) {
  StopStrings s({"END"});
  EXPECT_EQ(s.push("abc E"), "abc ");
  EXPECT_EQ(s.push("x"), "Ex");
  EXPECT_EQ(s.push("EN"), "");
  EXPECT_EQ(s.push("D more"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("later"), "");
}

TEST(StopStrings, OpaqueTextIsNeverMatchedNorMatchedAcross) {
  StopStrings s({"call", "ab"});
  EXPECT_EQ(s.push("x a"), "x ");
  // "a" held could begin "ab"; a marker after it ends that chance and passes whole.
  EXPECT_EQ(s.push("<|tool_call>", /*opaque=*/true), "a<|tool_call>");
  EXPECT_EQ(s.push("b call", /*opaque=*/true), "b call");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.push("y cal"), "y ");
  EXPECT_EQ(s.push("l z"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched(), "call");
}

TEST(Metrics, RendersPrometheusText) {
  Metrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 400);
  m.count_tokens(10, 5);
  m.count_cancelled();
  // A request waiting 5 ms, reading its prompt for 15, decoding 3 more tokens in 0.1 s; one that
  // waited 2 s and was cancelled after its first token.
  m.observe_request({.queue_s = 0.005, .prefill_s = 0.015, .decode_s = 0.1, .e2e_s = 0.125,
                     .tokens = 4});
  m.observe_request({.queue_s = 2, .prefill_s = 5, .decode_s = 0, .e2e_s = 7, .tokens = 1});
  m.observe_inter_token_latency(0.03);
  m.observe_inter_token_latency(0.05);
  const std::string text = m.render({.waiting = 3,
                                     .running = 1,
                                     .rows = 4,
                                     .kv_cache_usage = 0.25,
                                     .block_size = 1,
                                     .blocks = 4096,
                                     .busy_seconds = 1.5,
                                     .prefix_cache = {.hits = 2,
                                                      .misses = 5,
                                                      .reused_tokens = 300,
                                                      .evictions = 1,
                                                      .bytes = 4096},
                                     .prefix_cache_budget = 1 << 20});
  auto has = [&](const std::string& line) {
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has(R"(torchtpu_requests_total{endpoint="/v1/chat/completions",status="200"} 2)"));
  EXPECT_TRUE(has(R"(torchtpu_requests_total{endpoint="/v1/chat/completions",status="400"} 1)"));
  EXPECT_TRUE(has("torchtpu_prompt_tokens_total 10"));
  EXPECT_TRUE(has("torchtpu_generated_tokens_total 5"));
  EXPECT_TRUE(has("torchtpu_requests_cancelled_total 1"));
  EXPECT_TRUE(has("torchtpu_queue_depth 3"));
  EXPECT_TRUE(has("torchtpu_running_requests 1"));
  EXPECT_TRUE(has("torchtpu_kv_cache_usage_ratio 0.25"));
  EXPECT_TRUE(has(R"(torchtpu_cache_config_info{block_size="1",num_gpu_blocks="4096"} 1)"));
  // vLLM's names only when asked for.
  EXPECT_EQ(text.find("vllm:"), std::string::npos);
  EXPECT_TRUE(has(R"(torchtpu_time_to_first_token_seconds_bucket{le="0.01"} 0)"));
  EXPECT_TRUE(has(R"(torchtpu_time_to_first_token_seconds_bucket{le="0.025"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_time_to_first_token_seconds_bucket{le="10"} 2)"));
  EXPECT_TRUE(has(R"(torchtpu_time_to_first_token_seconds_bucket{le="+Inf"} 2)"));
  EXPECT_TRUE(has("torchtpu_time_to_first_token_seconds_count 2"));
  // The rate of the request that decoded (3 tokens in 0.1 s) only.
  EXPECT_TRUE(has(R"(torchtpu_decode_tokens_per_second_bucket{le="20"} 0)"));
  EXPECT_TRUE(has(R"(torchtpu_decode_tokens_per_second_bucket{le="50"} 1)"));
  EXPECT_TRUE(has("torchtpu_decode_tokens_per_second_count 1"));
  // A bound holds the values equal to it.
  EXPECT_TRUE(has(R"(torchtpu_request_queue_time_seconds_bucket{le="0.005"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_request_queue_time_seconds_bucket{le="1.5"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_request_queue_time_seconds_bucket{le="2"} 2)"));
  EXPECT_TRUE(has("torchtpu_request_queue_time_seconds_sum 2.005"));
  EXPECT_TRUE(has(R"(torchtpu_request_prefill_time_seconds_bucket{le="0.025"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_request_prefill_time_seconds_bucket{le="2.5"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_request_prefill_time_seconds_bucket{le="5"} 2)"));
  EXPECT_TRUE(has(R"(torchtpu_request_decode_time_seconds_bucket{le="0.005"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_request_decode_time_seconds_bucket{le="0.1"} 2)"));
  EXPECT_TRUE(has(R"(torchtpu_e2e_request_latency_seconds_bucket{le="0.1"} 0)"));
  EXPECT_TRUE(has(R"(torchtpu_e2e_request_latency_seconds_bucket{le="0.25"} 1)"));
  EXPECT_TRUE(has(R"(torchtpu_e2e_request_latency_seconds_bucket{le="+Inf"} 2)"));
  EXPECT_TRUE(has("torchtpu_e2e_request_latency_seconds_sum 7.125"));
  EXPECT_TRUE(has("torchtpu_e2e_request_latency_seconds_count 2"));
  EXPECT_TRUE(has(R"(torchtpu_inter_token_latency_seconds_bucket{le="0.025"} 0)"));
  EXPECT_TRUE(has(R"(torchtpu_inter_token_latency_seconds_bucket{le="0.05"} 2)"));
  EXPECT_TRUE(has("torchtpu_inter_token_latency_seconds_count 2"));
  EXPECT_TRUE(has("torchtpu_engine_busy_seconds_total 1.5"));
  EXPECT_TRUE(has("torchtpu_batch_rows 4"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_hits_total 2"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_misses_total 5"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_reused_tokens_total 300"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_evictions_total 1"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_bytes 4096"));
  EXPECT_TRUE(has("torchtpu_prefix_cache_budget_bytes 1048576"));
  // Every sample belongs to a metric declared by # TYPE before it.
  std::istringstream lines(text);
  std::string line, declared;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      declared = line.substr(7, line.find(' ', 7) - 7);
    } else if (line[0] != '#') {
      EXPECT_EQ(line.rfind(declared, 0), 0u) << line;
    }
  }
}

TEST(Metrics, VllmNamesCarryTheSameFiguresAndTheModelName) {
  Metrics m(MetricsCompat::kVllm, "gemma \"4\"");
  m.count_tokens(10, 5);
  m.observe_request({.queue_s = 0.5, .prefill_s = 0.25, .decode_s = 1, .e2e_s = 1.75, .tokens = 5});
  m.observe_inter_token_latency(0.25);
  const std::string text = m.render({.waiting = 2,
                                     .running = 1,
                                     .kv_cache_usage = 0.5,
                                     .block_size = 1,
                                     .blocks = 8,
                                     .prefix_cache = {.reused_tokens = 7}});
  auto has = [&](const std::string& line) {
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  const std::string model = R"({model_name="gemma \"4\""})";
  EXPECT_TRUE(has("torchtpu_queue_depth 2"));
  EXPECT_TRUE(has("vllm:num_requests_waiting" + model + " 2"));
  EXPECT_TRUE(has("vllm:num_requests_running" + model + " 1"));
  EXPECT_TRUE(has("vllm:kv_cache_usage_perc" + model + " 0.5"));
  EXPECT_TRUE(has("vllm:gpu_cache_usage_perc" + model + " 0.5"));
  EXPECT_TRUE(has(R"(vllm:cache_config_info{block_size="1",num_gpu_blocks="8"} 1)"));
  EXPECT_TRUE(has("# TYPE vllm:num_requests_waiting gauge"));
  EXPECT_NE(text.find("\nvllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\","
                      "waiting_lora_adapters=\"\"} "),
            std::string::npos);
  EXPECT_TRUE(has("vllm:prompt_tokens_total" + model + " 10"));
  EXPECT_TRUE(has("vllm:generation_tokens_total" + model + " 5"));
  // vLLM counts prefix cache queries and hits in tokens.
  EXPECT_TRUE(has("vllm:prefix_cache_queries_total" + model + " 10"));
  EXPECT_TRUE(has("vllm:prefix_cache_hits_total" + model + " 7"));
  // The timing histograms: the model's label before le, and on _sum and _count.
  const std::string before_le = R"({model_name="gemma \"4\"",le=)";
  EXPECT_TRUE(has("# TYPE vllm:e2e_request_latency_seconds histogram"));
  EXPECT_TRUE(has("vllm:e2e_request_latency_seconds_bucket" + before_le + R"("1.5"} 0)"));
  EXPECT_TRUE(has("vllm:e2e_request_latency_seconds_bucket" + before_le + R"("2"} 1)"));
  EXPECT_TRUE(has("vllm:e2e_request_latency_seconds_bucket" + before_le + R"("+Inf"} 1)"));
  EXPECT_TRUE(has("vllm:e2e_request_latency_seconds_sum" + model + " 1.75"));
  EXPECT_TRUE(has("vllm:e2e_request_latency_seconds_count" + model + " 1"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_sum" + model + " 0.75"));
  EXPECT_TRUE(has("vllm:request_queue_time_seconds_sum" + model + " 0.5"));
  EXPECT_TRUE(has("vllm:request_prefill_time_seconds_sum" + model + " 0.25"));
  EXPECT_TRUE(has("vllm:request_decode_time_seconds_sum" + model + " 1"));
  EXPECT_TRUE(has("vllm:inter_token_latency_seconds_sum" + model + " 0.25"));
  EXPECT_TRUE(has("torchtpu_e2e_request_latency_seconds_sum 1.75"));
  // vLLM has no histogram of decode rates.
  EXPECT_EQ(text.find("vllm:decode"), std::string::npos);
}

TEST(Metrics, CacheInfoWaitsForTheEngineAndCompatIsChecked) {
  // Before the engine is loaded the cache's shape is unknown: declared, no sample.
  const std::string text = Metrics(MetricsCompat::kVllm, "m").render({});
  EXPECT_NE(text.find("# TYPE torchtpu_cache_config_info gauge"), std::string::npos);
  EXPECT_EQ(text.find("torchtpu_cache_config_info{"), std::string::npos);
  EXPECT_EQ(text.find("vllm:cache_config_info{"), std::string::npos);
  EXPECT_EQ(parse_metrics_compat("vllm"), MetricsCompat::kVllm);
  EXPECT_EQ(parse_metrics_compat("none"), MetricsCompat::kNone);
  try {
    parse_metrics_compat("sglang");
    FAIL() << "sglang was accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "--metrics-compat must be none or vllm, got 'sglang'");
  }
}

// A loopback TCP connection: the server's accepted end and the client's end.
struct Loopback {
  int listener = -1, client = -1, accepted = -1;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(listener, 1);
    socklen_t len = sizeof(addr);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    accepted = accept(listener, nullptr, nullptr);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) close(fd);
    }
  }
};

TEST(Connection, PeerClosedOnlyOnceTheClientHasGone) {
  Loopback c;
  EXPECT_FALSE(peer_closed(c.accepted));
  // Data waiting to be read is not a disconnect.
  ASSERT_EQ(write(c.client, "x", 1), 1);
  EXPECT_FALSE(peer_closed(c.accepted));
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(peer_closed(c.accepted));
  EXPECT_FALSE(peer_closed(-1));
}

// Connections that complete their handshake at once while nobody accepts them: as many as the
// listener's accept queue holds, the rest wait for a SYN retransmit (a second or more).
int connections_completed_at_once(int port, int count) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::vector<pollfd> pending;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    pending.push_back({fd, POLLOUT, 0});
  }
  int completed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < deadline && completed < count) {
    poll(pending.data(), pending.size(), 50);
    completed = 0;
    for (const auto& p : pending) {
      int error = 1;
      socklen_t len = sizeof(error);
      getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &error, &len);
      if ((p.revents & POLLOUT) && error == 0) ++completed;
    }
  }
  for (const auto& p : pending) close(p.fd);
  return completed;
}

// httplib's own bind listens with a backlog of 5: of a burst of 64 connections about 6 complete
// before the listener thread accepts, and under load the others' clients wait (issue #16's soak).
TEST(Connection, BindListenerQueuesABurstOfConnections) {
  httplib::Server widened;
  const int port = bind_listener(widened, "127.0.0.1", 0);
  ASSERT_GT(port, 0);
  EXPECT_EQ(connections_completed_at_once(port, 64), 64);

  httplib::Server plain;
  const int plain_port = plain.bind_to_any_port("127.0.0.1");
  ASSERT_GT(plain_port, 0);
  EXPECT_LT(connections_completed_at_once(plain_port, 64), 64)
      << "httplib's own backlog took the burst: bind_listener's listen() proves nothing here";
}

// httplib's default socket options (SO_REUSEPORT) let a second server bind a port in use.
TEST(Connection, BindListenerRefusesAPortAnotherServerListensOn) {
  httplib::Server first, second;
  const int port = bind_listener(first, "127.0.0.1", 0);
  ASSERT_GT(port, 0);
  EXPECT_EQ(bind_listener(second, "127.0.0.1", port), -1);
}

// The peer's port of socket `fd`, -1 when it has none.
int peer_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  return ntohs(addr.sin_port);
}

// An HttpServer on a free loopback port with small limits (a body of 64 KiB at most, after 400 ms
// coming at 100 bytes a second or more): GET /echo answers the peer's address as the request has
// it, POST /echo the body; refused requests get read_refusal()'s status and code.
struct BoundedServer {
  HttpServer http{
      RequestLimits{4096, std::chrono::milliseconds(600), std::chrono::milliseconds(400), 100}};
  std::thread listener;
  int port = 0;
  BoundedServer() {
    http.set_payload_max_length(64 * 1024);
    http.Get("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.remote_addr + ":" + std::to_string(req.remote_port), "text/plain");
    });
    // A stream of two pieces.
    http.Get("/stream", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t offset, httplib::DataSink& sink) {
        if (offset == 0) return sink.write("first,", 6);
        sink.write("second", 6);
        sink.done();
        return true;
      });
    });
    // The client port of the connection connection_socket() names, in the handler and in a
    // streamed answer's content provider, beside the port the library read.
    http.Get("/peer", [](const httplib::Request& req, httplib::Response& res) {
      const std::string in_handler = std::to_string(peer_port(connection_socket()));
      const std::string read = std::to_string(req.remote_port);
      res.set_chunked_content_provider("text/plain", [=](size_t, httplib::DataSink& sink) {
        const std::string got =
            read + " " + in_handler + " " + std::to_string(peer_port(connection_socket()));
        sink.write(got.data(), got.size());
        sink.done();
        return true;
      });
    });
    // Answers after the client had time to close its side.
    http.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      res.set_content("slow", "text/plain");
    });
    handle_post(http, "/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.body, "text/plain");
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (const auto refusal = read_refusal()) {
        res.status = refusal->status;
        res.set_content(refusal->code + ": " + refusal->message, "text/plain");
      }
    });
    port = bind_listener(http, "127.0.0.1", 0);
    listener = std::thread([this] { http.listen_after_bind(); });
    while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~BoundedServer() {
    http.stop();
    listener.join();
  }

  // A connection to the server; `local_port` is its client end's.
  int connect_client(int* local_port = nullptr) const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (local_port) {
      socklen_t len = sizeof(addr);
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
      *local_port = ntohs(addr.sin_port);
    }
    return fd;
  }
};

void send_all(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// What the server sends on `fd` until it closes the connection (10 s at most, then a failure).
std::string read_until_closed(int fd) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the connection stayed open; got so far: " << got.substr(0, 200);
      break;
    }
  }
  close(fd);
  return got;
}

// The header lines of the first answer in `got` (its head, up to the empty line).
std::string answer_head(const std::string& got) { return got.substr(0, got.find("\r\n\r\n")); }

// An answer that ends its connection says so, and not that it keeps it.
void expect_says_it_closes(const std::string& got) {
  const std::string head = answer_head(got);
  EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
  EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
}

TEST(HttpServer, AHeadPastItsBytesIsA431AndTheConnectionCloses) {
  BoundedServer server;
  std::string headers;
  for (int i = 0; i < 8; ++i)
    headers += "X-Filler-" + std::to_string(i) + ": " + std::string(600, 'a') + "\r\n";
  int fd = server.connect_client();
  send_all(fd, "GET /echo HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 431 ", 0), 0u) << got;
  EXPECT_NE(got.find("request_header_fields_too_large: the request's head (its request line and "
                     "headers) is larger than 4096 bytes"),
            std::string::npos)
      << got;
  expect_says_it_closes(got);

  // One header line that never ends, and a request line that never ends: answered once the limit
  // is passed, without waiting for the rest.
  for (const std::string& start :
       {std::string("GET /echo HTTP/1.1\r\nX-Long: "), std::string("GET /")}) {
    fd = server.connect_client();
    send_all(fd, start + std::string(100'000, 'b'));
    got = read_until_closed(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 431 ", 0), 0u) << start << ": " << got.substr(0, 200);
    expect_says_it_closes(got);
  }
}

TEST(HttpServer, AHeadSlowerThanItsTimeIsA408) {
  BoundedServer server;
  // Every piece comes well within the library's 5 s read timeout; the head as a whole does not.
  for (const std::string& start : {std::string("GET /echo HTTP/1.1\r\n"), std::string("GE")}) {
    const int fd = server.connect_client();
    send_all(fd, start);
    for (int i = 0; i < 6; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      send(fd, start.size() > 2 ? "X-Slow: 1\r\n" : "T", start.size() > 2 ? 11 : 1, MSG_NOSIGNAL);
    }
    const std::string got = read_until_closed(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 408 ", 0), 0u) << start << ": " << got.substr(0, 200);
    EXPECT_NE(got.find("request_timeout: the request's head (its request line and headers) did "
                       "not arrive within 600 ms"),
              std::string::npos)
        << got;
    expect_says_it_closes(got);
  }
}

// After a head the library cannot read, where the next request starts is unknown: the rest is
// not read as requests (each a 400 of its own before), and the connection closes.
TEST(HttpServer, AMalformedHeadIsAnsweredOnceAndItsConnectionClosed) {
  BoundedServer server;
  const int fd = server.connect_client();
  send_all(fd, "NOT-HTTP\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << got;
  EXPECT_EQ(got.find("HTTP/1.1", 1), std::string::npos) << got;
  expect_says_it_closes(got);
}

// A handler and its content provider find their connection's socket, which is what cancels a
// generation when the client leaves; a thread that answers no request has none.
TEST(HttpServer, AHandlerFindsItsConnectionsSocket) {
  BoundedServer server;
  EXPECT_EQ(connection_socket(), -1);
  for (int i = 0; i < 2; ++i) {
    int client_port = 0;
    const int fd = server.connect_client(&client_port);
    send_all(fd, "GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const std::string got = read_until_closed(fd);
    const std::string port = std::to_string(client_port);
    EXPECT_NE(got.find("\r\n" + port + " " + port + " " + port + "\r\n"), std::string::npos) << got;
  }
}

// A body left unread (refused for its Content-Encoding) leaves no telling where the next request
// starts: its bytes are not read as one, and the answer ends the connection. A client that closed
// its side after sending is still answered (HTTP/1.0 tools, `nc -N`).
TEST(HttpServer, ABodyLeftUnreadEndsTheConnectionWithItsAnswer) {
  BoundedServer server;
  for (const bool half_close : {false, true}) {
    const int fd = server.connect_client();
    send_all(fd,
             "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
             "Content-Length: 5\r\n\r\nhelloGET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    if (half_close) ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
    const std::string got = read_until_closed(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 415 ", 0), 0u) << got;
    EXPECT_EQ(got.find("HTTP/1.1", 1), std::string::npos) << got;
    expect_says_it_closes(got);
  }
}

// A body may take as long as its bytes need at the limits' pace, but no longer: a byte every few
// seconds would hold a thread for as long as the sender liked (each read waits 5 s at most).
TEST(HttpServer, ABodySlowerThanItsPaceIsA408AndOneAtItsPaceIsServed) {
  BoundedServer server;
  const std::string head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 700\r\n";
  // 100 bytes every 200 ms: 1.2 s in all, twice the pace asked for, three times the grace.
  int fd = server.connect_client();
  send_all(fd, head + "Connection: close\r\n\r\n");
  for (int i = 0; i < 7; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    send_all(fd, std::string(100, static_cast<char>('a' + i)));
  }
  std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find(std::string(100, 'a') + std::string(100, 'b')), std::string::npos);

  // 10 bytes every 200 ms: within the read timeout each time, and refused once the grace and
  // the bytes' share of time are spent.
  fd = server.connect_client();
  send_all(fd, head + "\r\n");
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (send(fd, "0123456789", 10, MSG_NOSIGNAL) != 10) break;
  }
  got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 408 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find("request_timeout: the request's body came slower than 100 bytes a second "
                     "after its first 400 ms ("),
            std::string::npos)
      << got;
  expect_says_it_closes(got);
}

// cpp-httplib 0.11 kept a chunked body of any size (a 64 MiB one reached a server of 8 MiB),
// and read all of a body whose Content-Length passed the limit before its 413.
TEST(HttpServer, ABodyPastThePayloadLimitIsA413WithoutReadingTheRest) {
  BoundedServer server;
  // Longer than read_until_closed waits: the answer cannot come from the read timeout.
  server.http.set_read_timeout(30);
  int fd = server.connect_client();
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\nsome");
  std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 413 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find("request_too_large: the request body is larger than the server's limit of "
                     "65536 bytes"),
            std::string::npos)
      << got;
  expect_says_it_closes(got);

  fd = server.connect_client();
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = "1000\r\n" + std::string(4096, 'c') + "\r\n";
  for (int i = 0; i < 17; ++i) {
    if (send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(chunk.size()))
      break;
  }
  got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 413 ", 0), 0u) << got.substr(0, 200);
  expect_says_it_closes(got);

  // A chunked body within the limit is read whole.
  fd = server.connect_client();
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           "Connection: close\r\n\r\n" +
               chunk + chunk + "0\r\n\r\n");
  got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find("\r\n\r\n" + std::string(8192, 'c')), std::string::npos);
}

// A client that closes its sending side once its request is out (socat, `nc -N`, Go's
// CloseWrite) still reads the answer: its end of input is not a client gone.
TEST(HttpServer, AClientThatClosedItsSendingSideIsAnswered) {
  BoundedServer server;
  const int fd = server.connect_client();
  send_all(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nslow"), std::string::npos) << got;
}

// HTTP/1.0 has no chunked coding (RFC 9112, 6.1): a stream goes to such a client as it is made,
// its end the connection's, and no answer to it says Keep-Alive unless it asked to be kept.
TEST(HttpServer, AnHttp10ClientGetsAStreamUnchunkedAndNoKeepAliveItDidNotAskFor) {
  BoundedServer server;
  for (const std::string& connection : {std::string(""), std::string("Keep-Alive")}) {
    int fd = server.connect_client();
    const std::string asked = connection.empty() ? "" : "Connection: " + connection + "\r\n";
    send_all(fd, "GET /stream HTTP/1.0\r\nHost: x\r\n" + asked + "\r\n");
    std::string got = read_until_closed(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got;
    EXPECT_EQ(answer_head(got).find("Transfer-Encoding"), std::string::npos) << got;
    EXPECT_NE(got.find("\r\n\r\nfirst,second"), std::string::npos) << got;
    expect_says_it_closes(got);
  }
  const int fd = server.connect_client();
  send_all(fd, "GET /echo HTTP/1.0\r\nHost: x\r\n\r\n");
  expect_says_it_closes(read_until_closed(fd));
  // HTTP/1.1 streams are chunked as before.
  const int chunked = server.connect_client();
  send_all(chunked, "GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = read_until_closed(chunked);
  EXPECT_NE(answer_head(got).find("Transfer-Encoding: chunked"), std::string::npos) << got;
}

// RFC 9112 (6.1, 6.3): a body whose length the server and a proxy in front of it could read
// differently is refused before any route, and the connection ends with the answer, so the
// bytes after it are never read as a request (request smuggling).
TEST(HttpServer, ABodyOfUnclearLengthIsRefusedAndItsConnectionEnded) {
  BoundedServer server;
  const std::string next = "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n";
  const struct {
    std::string headers, status, answer;
  } cases[] = {
      {"Content-Length: 5x\r\n", "400",
       "malformed_request: the request's Content-Length '5x' is not a length"},
      {"Content-Length: -1\r\n", "400",
       "malformed_request: the request's Content-Length '-1' is not a length"},
      {"Content-Length: 5\r\nContent-Length: 50\r\n", "400",
       "malformed_request: the request has two Content-Length headers that disagree (5 and 50)"},
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "400",
       "malformed_request: the request has both Content-Length and Transfer-Encoding: send one"},
      {"Transfer-Encoding: gzip, chunked\r\n", "501",
       "unsupported_transfer_encoding: the request body is sent with Transfer-Encoding 'gzip, "
       "chunked': this server reads 'chunked' alone"},
      {"Content-Length: 99999999999999999999999\r\n", "413",
       "request_too_large: the request body is larger than the server's limit of 65536 bytes"},
  };
  for (const auto& c : cases) {
    const int fd = server.connect_client();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\n" + c.headers + "\r\nhello" + next);
    const std::string got = read_until_closed(fd);
    EXPECT_EQ(got.rfind("HTTP/1.1 " + c.status + " ", 0), 0u) << c.headers << got;
    EXPECT_NE(got.find(c.answer), std::string::npos) << c.headers << got;
    EXPECT_EQ(got.find("HTTP/1.1", 1), std::string::npos) << c.headers << got;
    expect_says_it_closes(got);
  }
  // The same length twice is one length.
  const int fd = server.connect_client();
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n"
           "Connection: close\r\n\r\nhello");
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got;
}

// Range is GET's (RFC 9110, 14.2): the library cut any answer to it, a POST's JSON included.
TEST(HttpServer, ARangeOnAPostIsIgnored) {
  BoundedServer server;
  const int fd = server.connect_client();
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nContent-Length: 5\r\n"
           "Connection: close\r\n\r\nhello");
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got;
  EXPECT_NE(got.find("\r\n\r\nhello"), std::string::npos) << got;
}

// A client that waits for "100 Continue" before sending a body the server will refuse gets the
// refusal at once, and sends nothing.
TEST(HttpServer, AnExpectationOfABodyTooLargeIsAnsweredWithTheRefusal) {
  BoundedServer server;
  const int fd = server.connect_client();
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
           "Content-Length: 1000000\r\n\r\n");
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 413 ", 0), 0u) << got;
  EXPECT_EQ(got.find("100 Continue"), std::string::npos) << got;
}

TEST(HttpServer, AnExpectationOtherThanContinueIsA417AtOnce) {
  BoundedServer server;
  const int fd = server.connect_client();
  // The client holds its body back until it is told to send it.
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 5\r\n\r\n");
  const std::string got = read_until_closed(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 417 ", 0), 0u) << got;
  EXPECT_NE(got.find("expects '200-ok'"), std::string::npos) << got;
  EXPECT_NE(answer_head(got).find("Connection: close"), std::string::npos) << got;
}

TEST(HttpServer, HeadsWithinTheLimitsAreServedPipelinedRequestsAndBodiesIncluded) {
  BoundedServer server;
  int local_port = 0;
  const int fd = server.connect_client(&local_port);
  // A head just under the limit, a body, and a second request in the same write as the first:
  // the bytes read past one request's end are the next one's.
  std::string head = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-Pad: ";
  head += std::string(4096 - head.size() - 4, 'p') + "\r\n\r\n";
  ASSERT_EQ(head.size(), 4096u);
  send_all(fd, head + "hello" + "GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = read_until_closed(fd);
  const auto first = got.find("HTTP/1.1 200 "), second = got.find("HTTP/1.1 200 ", first + 1);
  ASSERT_EQ(first, 0u) << got;
  ASSERT_NE(second, std::string::npos) << got;
  // The first answer keeps its connection, and says so; the second, asked to, closes it.
  EXPECT_EQ(answer_head(got).find("Connection: close"), std::string::npos) << got;
  EXPECT_NE(answer_head(got).find("Keep-Alive: "), std::string::npos) << got;
  EXPECT_NE(answer_head(got.substr(second)).find("Connection: close"), std::string::npos) << got;
  EXPECT_NE(got.substr(0, second).find("\r\n\r\nhello"), std::string::npos) << got;
  EXPECT_NE(got.substr(second).find("127.0.0.1:" + std::to_string(local_port)), std::string::npos)
      << got;
}

TEST(Demo, EmbeddedChatTemplateIsGemma4s) {
  const std::string t = gemma4_chat_template();
  EXPECT_EQ(t.size(), 18569u);  // data/gemma4/SOURCES.md: the published file's length
  EXPECT_NE(t.find("<|turn>"), std::string::npos);
}

// A checkpoint directory that passes run()'s look before it listens (it holds a config.json) and
// that a load refuses: the engine factory's own failure, or the config's, comes after the listener
// started.
std::string unloadable_checkpoint() {
  const auto dir = std::filesystem::path(testing::TempDir()) / "unloadable-checkpoint";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << "{}";
  return dir.string();
}

// What the Python host does: run() on a thread of its own, the engine built by a factory, no
// signal handlers, and request_stop() from elsewhere. Uses the demo checkpoint (XDG_CACHE_HOME is
// set by tests/cpp/server.cmake so it is generated once per build tree).
TEST(Run, ServesFromAnyThreadWithTheFactorysEngineOnTheEngineThread) {
  ServeOptions options;
  options.port = 0;
  options.engine.context = 256;
  options.install_signal_handlers = false;
  std::promise<int> bound;
  options.on_listening = [&](int port) { bound.set_value(port); };
  std::thread::id factory_thread;
  std::thread::id host_thread;
  int code = -1;
  std::thread host([&] {
    host_thread = std::this_thread::get_id();
    code = run(options, [&](const EngineOptions& engine_options) {
      factory_thread = std::this_thread::get_id();
      return std::make_unique<Engine>(engine_options);
    });
  });
  httplib::Client client("127.0.0.1", bound.get_future().get());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
  while (true) {
    auto health = client.Get("/health");
    if (health && health->status == 200) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the server never became healthy";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto res = client.Post("/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,)"
                         R"("ignore_eos":true})",
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(ojson::parse(res->body)["usage"]["completion_tokens"], 3);
  auto engine = client.Get("/v1/engine");
  ASSERT_TRUE(engine);
  EXPECT_EQ(ojson::parse(engine->body)["engine_thread"], "torchtpu-engine");
  request_stop();
  host.join();
  EXPECT_EQ(code, 0);
  EXPECT_NE(factory_thread, std::thread::id());
  EXPECT_NE(factory_thread, host_thread);
  EXPECT_NE(factory_thread, std::this_thread::get_id());
}

TEST(Run, ALoadFailureIsThrownFromRunAfterTheListenerCloses) {
  ServeOptions options;
  options.model_dir = unloadable_checkpoint();
  options.port = 0;
  options.install_signal_handlers = false;
  EXPECT_ANY_THROW(run(options));
}

// The ways a run can be told to end before its listener thread has started accepting, where
// httplib ignores stop(): its engine failing to load, request_stop() (before run() or as soon as
// the port is bound) and SIGTERM (as soon as the port is bound, or from the engine thread).
enum class EarlyEnd {
  kLoadFailure,
  kStopBeforeRun,
  kStopOnceBound,
  kSignalOnceBound,
  kSignalWhileLoading
};

TEST(Run, EndsWithTheLoadErrorHoweverLoadFailureStopAndSignalInterleave) {
  constexpr int kIterations = 250;
  std::atomic<int> started = 0;
  auto loop = std::async(std::launch::async, [&] {
    std::ostringstream quiet;  // 250 "serving ..." lines
    std::streambuf* out = std::cout.rdbuf(quiet.rdbuf());
    for (int i = 0; i < kIterations; ++i) {
      started = i;
      const auto end = static_cast<EarlyEnd>(i % 5);
      // The engine fails 0 to 350 us into loading, moving the failure around the listener start.
      const auto delay = std::chrono::microseconds(i / 5 % 8 * 50);
      const std::string error = "no engine, iteration " + std::to_string(i);
      ServeOptions options;
      options.model_dir = unloadable_checkpoint();
      options.port = 0;
      options.max_queue = 0;
      options.install_signal_handlers =
          end == EarlyEnd::kSignalOnceBound || end == EarlyEnd::kSignalWhileLoading;
      if (end == EarlyEnd::kStopBeforeRun) request_stop();
      if (end == EarlyEnd::kStopOnceBound) options.on_listening = [](int) { request_stop(); };
      if (end == EarlyEnd::kSignalOnceBound) options.on_listening = [](int) { raise(SIGTERM); };
      try {
        run(options, [&](const EngineOptions&) -> std::unique_ptr<Engine> {
          if (end == EarlyEnd::kSignalWhileLoading) raise(SIGTERM);
          std::this_thread::sleep_for(delay);
          throw std::runtime_error(error);
        });
        ADD_FAILURE() << "iteration " << i << ": run() returned instead of throwing";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(e.what(), error);
      }
    }
    std::cout.rdbuf(out);
  });
  if (loop.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // The hung run() cannot be unwound; end the process with the iteration that hung.
    std::cerr << "run() did not return in iteration " << started << " (EarlyEnd " << started % 5
              << ")" << std::endl;
    std::_Exit(1);
  }
  loop.get();
}

TEST(Run, AStopThatComesWhileARunEndsIsNotLeftForTheNextRun) {
  ServeOptions options;
  options.model_dir = unloadable_checkpoint();
  options.port = 0;
  options.install_signal_handlers = false;
  // Two stops for this run: one before it starts, then its engine thread's after loading fails.
  request_stop();
  EXPECT_THROW(run(options,
                   [](const EngineOptions&) -> std::unique_ptr<Engine> {
                     std::this_thread::sleep_for(std::chrono::milliseconds(50));
                     throw std::runtime_error("no engine");
                   }),
               std::runtime_error);

  std::promise<int> bound;
  std::atomic<bool> listened = false;
  options.on_listening = [&](int port) {
    listened = true;
    bound.set_value(port);
  };
  std::promise<void> fail;
  std::thread host([&, failed = fail.get_future().share()] {
    EXPECT_THROW(run(options,
                     [&](const EngineOptions&) -> std::unique_ptr<Engine> {
                       failed.wait();
                       throw std::runtime_error("no engine");
                     }),
                 std::runtime_error);
    if (!listened) bound.set_value(0);  // ended before listening: the wait below must not hang
  });
  const int port = bound.get_future().get();
  if (port == 0) {
    ADD_FAILURE() << "the second run ended before it listened";
    host.join();
    return;
  }
  httplib::Client client("127.0.0.1", port);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto health = client.Get("/health");
  EXPECT_TRUE(health) << "the second run stopped on its own: "
                      << httplib::to_string(health.error());
  fail.set_value();
  host.join();
}

}  // namespace
}  // namespace torchtpu::server
