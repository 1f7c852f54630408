// Specifications of src/server/structured: response_format read into a grammar (and the 400s),
// and the Lark grammar of Gemma 4's tool-call syntax compiled by llguidance and walked token by
// token over byte_tokenizer.h's vocabulary: which calls it lets through and where it stops others.
#include "server/structured.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "byte_tokenizer.h"
#include "grammar/constraint.h"

namespace torchtpu::server {
namespace {

constexpr int64_t kCallOpen = kFirstExtraSpecial;
constexpr int64_t kCallClose = kFirstExtraSpecial + 1;
constexpr int64_t kQuote = kFirstExtraSpecial + 2;
const ToolCallTokens kTokens{kCallOpen, kCallClose, kQuote};

std::shared_ptr<const GrammarVocabulary> vocabulary() {
  static const auto v = std::make_shared<const GrammarVocabulary>(
      byte_tokenizer({"<|tool_call>", "<tool_call|>", "<|\"|>"}), std::vector<int64_t>{kEndOfTurn});
  return v;
}

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "book", "parameters": {"type": "object",
    "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"},
                   "mode": {"enum": ["fast", "slow"]}, "tags": {"type": "array", "items": {"type": "boolean"}}},
    "required": ["alpha"]}}},
  {"type": "function", "function": {"name": "ping"}}
])");

// Commits `call`, where '"' stands for the <|"|> delimiter and '^' / '$' for <|tool_call> and
// <tool_call|>; returns how many characters the grammar took before refusing one (all: -1).
int64_t walk(Constraint& c, const std::string& call) {
  for (size_t i = 0; i < call.size(); ++i) {
    const char ch = call[i];
    const int64_t token = ch == '"'   ? kQuote
                          : ch == '^' ? kCallOpen
                          : ch == '$' ? kCallClose
                                      : byte_id(ch);
    try {
      c.commit(token);
    } catch (const std::logic_error&) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

std::set<std::string> names_of(const ojson& tools) {
  std::set<std::string> names;
  for (const auto& tool : tools) names.insert(tool["function"]["name"].get<std::string>());
  return names;
}

Constraint tool_constraint(CallStart start, const ojson& tools = kTools,
                           const std::set<std::string>& callable = names_of(kTools)) {
  return Constraint(vocabulary(),
                    {GrammarKind::kLark, tool_call_grammar(tools, callable, kTokens, start)});
}

TEST(ToolCallGrammar, AcceptsCallsToDeclaredToolsWithArgumentsInSchemaOrder) {
  Constraint c = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(c, R"(book{zeta:"x, y",alpha:-12,mode:"slow",tags:[true,false]}$)"), -1);
  EXPECT_TRUE(c.allowed()[kEndOfTurn / 32] >> (kEndOfTurn % 32) & 1);
  EXPECT_EQ(walk(c, "^call:ping{}$"), -1);
}

TEST(ToolCallGrammar, RefusesUndeclaredToolsOrderAndMissingRequiredKeys) {
  Constraint undeclared = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(undeclared, "bake{"), 1);  // only "book" and "ping" begin a call
  Constraint order = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(order, "book{alpha:1,zeta:"), 13);  // zeta is declared before alpha
  Constraint required = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(required, "book{zeta:\"a\"}"), 13);  // '}' before the required alpha
  Constraint extra = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(extra, "book{alpha:1,other"), 13);  // undeclared keys are refused
}

TEST(ToolCallGrammar, StringsCannotHoldTheDelimitersOpening) {
  Constraint c = tool_constraint(CallStart::kAfterCallPrefix);
  EXPECT_EQ(walk(c, "book{zeta:\"a<|"), 13);
}

TEST(ToolCallGrammar, AnOpenedCallStartsInsideTheArguments) {
  const ojson only_book = ojson::array({kTools[0]});
  Constraint c = tool_constraint(CallStart::kInsideArguments, only_book, {"book"});
  EXPECT_EQ(walk(c, "alpha:3}$"), -1);
}

TEST(ToolCallGrammar, OnlyTheCallableToolsMayBeCalled) {
  Constraint ping = tool_constraint(CallStart::kReply, kTools, {"ping"});
  EXPECT_EQ(walk(ping, "text ^call:ping{}$"), -1);
  Constraint book = tool_constraint(CallStart::kReply, kTools, {"ping"});
  EXPECT_EQ(walk(book, "text ^call:b"), 11);
  Constraint forced = tool_constraint(CallStart::kAfterCallPrefix, kTools, {"book"});
  EXPECT_EQ(walk(forced, "p"), 0);
  Constraint inside = tool_constraint(CallStart::kInsideArguments, kTools, {"ping"});
  EXPECT_EQ(walk(inside, "}$"), -1);  // the first callable tool's arguments, not kTools[0]'s
}

TEST(ToolCallGrammar, AReplyMayBeTextCallsOrBothButEveryCallIsValid) {
  Constraint text = tool_constraint(CallStart::kReply);
  EXPECT_EQ(walk(text, "Let me look: {not a call}."), -1);
  EXPECT_EQ(walk(text, "^call:ping{}$ and then ^call:book{alpha:1}$"), -1);
  Constraint bad = tool_constraint(CallStart::kReply);
  EXPECT_EQ(walk(bad, "ok ^call:book{zeta:1"), 19);  // zeta is a string
}

TEST(ToolCallGrammar, KeywordsItCannotEnforceAre400sNamingTheirPath) {
  ojson tools = kTools;
  tools[0]["function"]["parameters"]["properties"]["zeta"]["minLength"] = 3;
  try {
    tool_call_grammar(tools, names_of(tools), kTokens, CallStart::kAfterCallPrefix);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "tools[0].function.parameters.properties.zeta.minLength");
  }
  tools = kTools;
  tools[1]["function"]["parameters"] = {{"type", "array"}};
  try {
    tool_call_grammar(tools, names_of(tools), kTokens, CallStart::kAfterCallPrefix);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools[1].function.parameters");
  }
  // A tool that cannot be called is not compiled, and the path counts every tool.
  EXPECT_NO_THROW(tool_call_grammar(tools, {"book"}, kTokens, CallStart::kAfterCallPrefix));
  try {
    tool_call_grammar(tools, {"ping"}, kTokens, CallStart::kReply);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools[1].function.parameters");
  }
}

std::string format_error(const ojson& format) {
  try {
    parse_response_format({{"response_format", format}});
  } catch (const ApiError& e) {
    return e.param;
  }
  return "no error";
}

// The param of the 400 for `schema` as response_format's json_schema, or "no error".
std::string schema_error(const char* schema) {
  return format_error({{"type", "json_schema"},
                       {"json_schema", {{"name", "n"}, {"schema", ojson::parse(schema)}}}});
}

TEST(ResponseFormat, KeysJsonSchemaDoesNotDefineAre400sNamingThem) {
  const std::string s = "response_format.json_schema.schema";
  EXPECT_EQ(schema_error(R"({"type": "object", "requried": ["a"]})"), s + ".requried");
  EXPECT_EQ(schema_error(R"({"type": "object", "properties": {"a": {"type": "string",
              "nullable": true}}})"),
            s + ".properties.a.nullable");
  EXPECT_EQ(schema_error(R"({"type": "array", "items": {"maxItem": 1}})"), s + ".items.maxItem");
  EXPECT_EQ(schema_error(R"({"anyOf": [{"type": "null"}, {"frobnicate": true}]})"),
            s + ".anyOf[1].frobnicate");
  EXPECT_EQ(schema_error(R"({"$defs": {"P": {"type": "object", "propertys": {}}},
              "$ref": "#/$defs/P"})"),
            s + ".$defs.P.propertys");
  EXPECT_EQ(schema_error(R"({"prefixItems": [true, {"tpye": "string"}]})"),
            s + ".prefixItems[1].tpye");
}

TEST(ResponseFormat, KeywordsAnnotationsAndExtensionsPass) {
  // A property may be named like a misspelled keyword; dependencies may list names; pydantic's
  // discriminator, x- extensions and annotations describe.
  EXPECT_EQ(schema_error(R"({"type": "object", "title": "T", "x-order": 1, "$comment": "c",
              "properties": {"requried": {"type": "string", "deprecated": true,
                                          "examples": ["a"], "readOnly": false}},
              "dependencies": {"requried": ["other"], "other": {"required": ["requried"]}},
              "oneOf": [{"type": "object"}], "discriminator": {"propertyName": "kind"},
              "items": [{"type": "string"}], "additionalProperties": false})"),
            "no error");
}

TEST(ResponseFormat, TextIsNoGrammarJsonObjectAndJsonSchemaAre) {
  EXPECT_FALSE(parse_response_format(ojson::object()));
  EXPECT_FALSE(parse_response_format({{"response_format", {{"type", "text"}}}}));
  EXPECT_EQ(parse_response_format({{"response_format", {{"type", "json_object"}}}})->kind,
            GrammarKind::kJsonObject);
  const auto schema = parse_response_format(ojson::parse(
      R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}})"));
  EXPECT_EQ(schema->kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(schema->source, R"({"type":"object","properties":{"b":{},"a":{}}})");
  // A json_schema without a schema (OpenAI's is optional) asks for a JSON object.
  const auto unnamed = parse_response_format(
      ojson::parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})"));
  EXPECT_EQ(unnamed->kind, GrammarKind::kJsonObject);
}

TEST(ResponseFormat, MalformedFieldsAre400sNamingThem) {
  EXPECT_EQ(format_error("json"), "response_format");
  EXPECT_EQ(format_error(ojson::object()), "response_format.type");
  EXPECT_EQ(format_error({{"type", "yaml"}}), "response_format.type");
  EXPECT_EQ(format_error({{"type", "text"}, {"json_schema", ojson::object()}}),
            "response_format.json_schema");
  EXPECT_EQ(format_error({{"type", "json_schema"}}), "response_format.json_schema");
  EXPECT_EQ(format_error({{"type", "json_schema"}, {"json_schema", {{"schema", true}}}}),
            "response_format.json_schema.schema");
  EXPECT_EQ(format_error({{"type", "json_schema"},
                          {"json_schema", {{"schema", ojson::object()}, {"extra", 1}}}}),
            "response_format.json_schema.extra");
}

// OpenAI holds a format's name to 1-64 of [a-zA-Z0-9_-]; the Responses route's text.format.name
// comes here too.
TEST(ResponseFormat, ANameOutsideOpenAIsPatternIsA400) {
  for (const std::string& name :
       std::vector<std::string>{"", "with space", "dot.ted", "caf\u00e9", std::string(65, 'a')}) {
    try {
      parse_response_format(
          {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", name}}}}}});
      ADD_FAILURE() << "accepted " << name;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "response_format.json_schema.name");
      EXPECT_EQ(std::string(e.what()),
                "'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-', "
                "got " +
                    ojson(name).dump());
    }
  }
  for (const std::string& name :
       std::vector<std::string>{"a", "Output_2-b", std::string(64, 'z')}) {
    EXPECT_NO_THROW(parse_response_format(
        {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", name}}}}}}));
  }
}

}  // namespace
}  // namespace torchtpu::server
