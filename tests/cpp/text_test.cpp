// Specifications of src/text: tokenizer.json loading and errors, BPE details, streaming decode,
// and the tool-call / thinking parser. Comparisons with Hugging Face tokenizers on the real Gemma
// files are in tests/python/test_tokenizer.py.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace torchtpu {
namespace {

using nlohmann::json;
using Ids = std::vector<int64_t>;

// A small Gemma-shaped tokenizer.json: "▁" for spaces, byte fallback, <bos> template.
json tiny_tokenizer() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
      {"id": 1, "content": "<bos>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
      {"id": 2, "content": "<eos>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
      {"id": 12, "content": "<tool>", "special": false, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}
    ],
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [],
      "special_tokens": {"<bos>": {"id": "<bos>", "ids": [1], "tokens": ["<bos>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
      "byte_fallback": true, "ignore_merges": false,
      "vocab": {"<unk>": 0, "<bos>": 1, "<eos>": 2, "a": 3, "b": 4, "ab": 5, "\u2581": 6,
                "\u2581ab": 7, "c": 8, "<0xC3>": 9, "<0xA9>": 10, "abc": 11},
      "merges": [["a", "b"], ["\u2581", "ab"]]}
  })");
}

Tokenizer load(const json& j) { return Tokenizer::from_json_string(j.dump(), "tiny.json"); }

std::string load_error(const json& j) {
  try {
    load(j);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Tokenizer, MergesLowestRankFirstAcrossTheNormalizedText) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(tok.encode("ab ab"), (Ids{5, 7}));  // a b ▁ a b -> ab ▁ ab -> ab ▁ab
  EXPECT_EQ(tok.decode({5, 7}), "ab ab");
}

TEST(Tokenizer, MergesWrittenAsStringsEqualMergesWrittenAsPairs) {
  json j = tiny_tokenizer();
  j["model"]["merges"] = {"a b", "\u2581 ab"};
  EXPECT_EQ(load(j).encode("ab ab c"), load(tiny_tokenizer()).encode("ab ab c"));
}

TEST(Tokenizer, UnknownCharactersFallBackToBytesOrOneFusedUnk) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{9, 10}));  // é: bytes C3 A9 are in the vocabulary
  EXPECT_EQ(tok.encode("\xE1\xBA\x9E\xE1\xBA\x9E"), (Ids{0}));  // ẞẞ: no byte tokens, one fused unk
  json j = tiny_tokenizer();
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load(j).encode("\xE1\xBA\x9E\xE1\xBA\x9E"), (Ids{0, 0}));
}

TEST(Tokenizer, AddedTokensAreMatchedBeforeBpe) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(tok.encode("c<tool>ab<bos>"), (Ids{8, 12, 5, 1}));
  EXPECT_EQ(tok.vocab_size(), 13);
  EXPECT_EQ(tok.token_to_id("<tool>"), 12);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(12));
}

TEST(Tokenizer, LstripAndRstripTokensTakeTheSurroundingSpaces) {
  json j = tiny_tokenizer();
  j["added_tokens"][3]["lstrip"] = true;
  j["added_tokens"][3]["rstrip"] = true;
  EXPECT_EQ(load(j).encode("c  <tool> ab"), (Ids{8, 12, 5}));
}

TEST(Tokenizer, AddSpecialTokensPutsBosFirstOnce) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(tok.encode("ab", true), (Ids{1, 5}));
  EXPECT_EQ(tok.encode("ab", false), (Ids{5}));
  EXPECT_EQ(tok.prefix_special_ids(), (Ids{1}));
}

TEST(Tokenizer, DecodeSkipsSpecialTokensOnRequestAndReplacesBadBytes) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(tok.decode({1, 3}, true), "a");
  EXPECT_EQ(tok.decode({1, 3}, false), "<bos>a");
  EXPECT_EQ(tok.decode({9, 3}),
            "\xEF\xBF\xBD"
            "a");                                                             // a lone lead byte
  EXPECT_EQ(tok.decode({9, 10, 9}), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // one per byte
  EXPECT_THROW(tok.decode({99}), ValueError);
  EXPECT_THROW(tok.encode("\xFF"), ValueError);
}

TEST(Tokenizer, UnsupportedComponentsAreNamedInTheError) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"normalizer", {{"type", "NFKC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "Metaspace"}}},
      {"post_processor", {{"type", "RobertaProcessing"}}},
      {"model", {{"type", "WordPiece"}, {"vocab", json::object()}}},
  };
  for (const auto& [field, value] : cases) {
    json j = tiny_tokenizer();
    j[field] = value;
    const std::string message = load_error(j);
    EXPECT_NE(message.find(value["type"].get<std::string>()), std::string::npos) << message;
    EXPECT_NE(message.find("tiny.json"), std::string::npos) << message;
  }
  json j = tiny_tokenizer();
  j["normalizer"]["pattern"] = {{"Regex", "\\s"}};
  EXPECT_NE(load_error(j).find("Regex"), std::string::npos);
}

TEST(Tokenizer, InconsistentFilesAreRefused) {
  json j = tiny_tokenizer();
  j["added_tokens"][3]["id"] = 40;  // "<tool>" would get id 12
  EXPECT_NE(load_error(j).find("<tool>"), std::string::npos);
  j = tiny_tokenizer();
  j["model"]["merges"].push_back({"b", "c"});  // "bc" is not in the vocabulary
  EXPECT_NE(load_error(j).find("bc"), std::string::npos);
  EXPECT_NE(load_error(json::parse("{\"model\": 3}")).find("tiny.json"), std::string::npos);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), NotFoundError);
}

// A special token without "ids" was read out of bounds (found by tests/fuzz/config_fuzz).
TEST(Tokenizer, PostProcessorSpecialTokenWithoutIdsIsRefused) {
  json j = tiny_tokenizer();
  j["post_processor"]["special_tokens"]["<bos>"].erase("ids");
  EXPECT_NE(load_error(j).find("special token \"<bos>\" has no ids"), std::string::npos);
  j["post_processor"]["special_tokens"]["<bos>"] = "<bos>";
  EXPECT_NE(load_error(j).find("special token \"<bos>\" has no ids"), std::string::npos);
}

// An id of 1.33333e+103 was converted to int64 with undefined behaviour (found by
// tests/fuzz/config_fuzz under UBSan); ids are integers in u32, as tokenizers reads them.
TEST(Tokenizer, IdsThatAreNotU32IntegersAreRefused) {
  for (const json& bad : {json(1.33333e+103), json(1.0), json(-1), json(4294967296), json("1")}) {
    json j = tiny_tokenizer();
    j["added_tokens"][1]["id"] = bad;
    EXPECT_NE(load_error(j).find("added_tokens[1].id is not a valid id: " + bad.dump()),
              std::string::npos)
        << bad.dump();
    j = tiny_tokenizer();
    j["post_processor"]["special_tokens"]["<bos>"]["ids"] = {bad};
    EXPECT_NE(load_error(j).find("special token \"<bos>\" id is not a valid id: " + bad.dump()),
              std::string::npos)
        << bad.dump();
  }
  json j = tiny_tokenizer();
  j["post_processor"]["special_tokens"]["<bos>"]["ids"] = {4294967295};
  EXPECT_NE(load_error(j).find("post_processor uses id 4294967295"), std::string::npos);
}

// A tokenizer.json nested a million deep overflowed the stack (found by feeding
// tests/fuzz/config_fuzz such a file); it is refused while parsing.
TEST(Tokenizer, JsonNestedTooDeepIsRefused) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  try {
    Tokenizer::from_json_string(R"({"model": )" + deep + "}", "deep.json");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("nest deeper than 64 levels"), std::string::npos);
  }
}

std::vector<std::string> stream(const Tokenizer& tok, const Ids& ids, bool show_special) {
  Detokenizer detok(tok, show_special);
  std::vector<std::string> pieces;
  for (int64_t id : ids) pieces.push_back(detok.push(id));
  pieces.push_back(detok.finish());
  return pieces;
}

TEST(Detokenizer, HoldsAByteRunUntilTheNextTokenEndsIt) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(stream(tok, {3, 9, 10, 4}, true), (std::vector<std::string>{"a", "", "",
                                                                        "\xC3\xA9"
                                                                        "b",
                                                                        ""}));
  EXPECT_EQ(stream(tok, {9, 10}, true), (std::vector<std::string>{"", "", "\xC3\xA9"}));
  // An invalid run becomes one U+FFFD per byte, as decode() writes it.
  EXPECT_EQ(stream(tok, {10, 3}, true), (std::vector<std::string>{"",
                                                                  "\xEF\xBF\xBD"
                                                                  "a",
                                                                  ""}));
}

TEST(Detokenizer, ShowsOrHidesSpecialTokens) {
  const Tokenizer tok = load(tiny_tokenizer());
  EXPECT_EQ(stream(tok, {1, 6, 3, 2}, true),
            (std::vector<std::string>{"<bos>", " ", "a", "<eos>", ""}));
  EXPECT_EQ(stream(tok, {1, 6, 3, 2}, false), (std::vector<std::string>{"", " ", "a", "", ""}));
  // A hidden special token does not end a byte run, as in decode(skip_special_tokens=true).
  EXPECT_EQ(stream(tok, {9, 1, 10}, false), (std::vector<std::string>{"", "", "", "\xC3\xA9"}));
  EXPECT_EQ(tok.decode({9, 1, 10}, true), "\xC3\xA9");
}

TEST(Detokenizer, StreamsAStripAfterFuseAsDecodeAppliesIt) {
  // Llama-style decoder: the leading space of the whole text is removed.
  json j = tiny_tokenizer();
  j["decoder"]["decoders"].push_back(
      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}});
  const Tokenizer tok = load(j);
  const Ids ids = {6, 3, 6, 4, 6};
  std::string joined;
  for (const std::string& p : stream(tok, ids, true)) joined += p;
  EXPECT_EQ(tok.decode(ids), "a b");
  EXPECT_EQ(joined, tok.decode(ids));
}

TEST(Detokenizer, RefusesAnIdOutsideTheVocabulary) {
  const Tokenizer tok = load(tiny_tokenizer());
  Detokenizer detok(tok, true);
  EXPECT_THROW(detok.push(13), ValueError);
  EXPECT_THROW(detok.push(-1), ValueError);
}

// Rendered by the Gemma 4 chat template (chat_template.jinja, jinja2 as transformers sets it up)
// from the arguments in the last column; tests/python/test_tokenizer.py renders such cases live.
struct RenderedTurn {
  const char* name;
  const char* text;
  const char* reasoning;
  const char* content;
  const char* calls;  // JSON list of {name, arguments}
};
const RenderedTurn kRenderedTurns[] = {
    {"string argument", R"T(<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>)T",
     R"T()T", R"T()T", R"T([{"name": "get_weather", "arguments": {"city": "Paris"}}])T"},
    {"numbers", R"T(<|tool_call>call:f{big:12345678901234,i:42,neg:-7,x:1.5}<tool_call|>)T",
     R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"i": 42, "neg": -7, "x": 1.5, "big": 12345678901234}}])T"},
    {"exponent floats", R"T(<|tool_call>call:f{large:3e+20,small:1e-07}<tool_call|>)T", R"T()T",
     R"T()T", R"T([{"name": "f", "arguments": {"small": 1e-07, "large": 3e+20}}])T"},
    {"booleans", R"T(<|tool_call>call:f{no:false,yes:true}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"yes": true, "no": false}}])T"},
    {"null", R"T(<|tool_call>call:f{nothing:null}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"nothing": null}}])T"},
    {"nested object", R"T(<|tool_call>call:f{outer:{inner:{deep:<|"|>v<|"|>,n:1}}}<tool_call|>)T",
     R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"outer": {"inner": {"deep": "v", "n": 1}}}}])T"},
    {"array of mixed values",
     R"T(<|tool_call>call:f{xs:[1,<|"|>two<|"|>,3.5,true,null]}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"xs": [1, "two", 3.5, true, null]}}])T"},
    {"array of objects", R"T(<|tool_call>call:f{rows:[{a:1},{b:[2,3]}]}<tool_call|>)T", R"T()T",
     R"T()T", R"T([{"name": "f", "arguments": {"rows": [{"a": 1}, {"b": [2, 3]}]}}])T"},
    {"nested arrays", R"T(<|tool_call>call:f{m:[[1,2],[],[[3]]]}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"m": [[1, 2], [], [[3]]]}}])T"},
    {"no arguments", R"T(<|tool_call>call:ping{}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "ping", "arguments": {}}])T"},
    {"string with brackets, commas and colons",
     R"T(<|tool_call>call:f{s:<|"|>a{b}c, d: [e]<|"|>}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"s": "a{b}c, d: [e]"}}])T"},
    {"string containing the delimiter",
     R"T(<|tool_call>call:f{s:<|"|>say <|"|>hi<|"|> now<|"|>}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"s": "say <|\"|>hi<|\"|> now"}}])T"},
    {"string containing the closing marker",
     R"T(<|tool_call>call:f{s:<|"|>x<tool_call|>y<|"|>}<tool_call|>)T", R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"s": "x<tool_call|>y"}}])T"},
    {"empty string", R"T(<|tool_call>call:f{s:<|"|><|"|>,t:<|"|>z<|"|>}<tool_call|>)T", R"T()T",
     R"T()T", R"T([{"name": "f", "arguments": {"s": "", "t": "z"}}])T"},
    {"multi-line string",
     R"T(<|tool_call>call:f{code:<|"|>def f():
    return {1: 2}
<|"|>}<tool_call|>)T",
     R"T()T", R"T()T",
     R"T([{"name": "f", "arguments": {"code": "def f():\n    return {1: 2}\n"}}])T"},
    {"unicode string", R"T(<|tool_call>call:f{s:<|"|>日本語 😀 é<|"|>}<tool_call|>)T", R"T()T",
     R"T()T", R"T([{"name": "f", "arguments": {"s": "日本語 😀 é"}}])T"},
    {"literals inside strings stay strings",
     R"T(<|tool_call>call:f{a:<|"|>true<|"|>,b:<|"|>null<|"|>,c:<|"|>12<|"|>}<tool_call|>)T",
     R"T()T", R"T()T", R"T([{"name": "f", "arguments": {"a": "true", "b": "null", "c": "12"}}])T"},
    {"two calls",
     R"T(<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{y:<|"|>z<|"|>}<tool_call|>)T",
     R"T()T", R"T()T",
     R"T([{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "z"}}])T"},
    {"thinking then call",
     R"T(<|channel>thought
Need the weather.
<channel|><|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>)T",
     R"T(Need the weather.)T", R"T()T",
     R"T([{"name": "get_weather", "arguments": {"city": "Oslo"}}])T"},
    {"thinking then answer",
     R"T(<|channel>thought
Let me think.
Step 2.
<channel|>The answer is 4.)T",
     R"T(Let me think.
Step 2.)T",
     R"T(The answer is 4.)T", R"T([])T"},
};

struct Parsed {
  std::string content, reasoning;
  json calls = json::array();
  bool cut_off = false;
  std::string raw_unparsed;
  std::string call_texts;  // each call's text, joined
};

// Feeds `text` in pieces of `chunk` bytes (0: all at once).
Parsed parse(std::string_view text, size_t chunk) {
  OutputParser parser;
  Parsed out;
  auto take = [&out](const OutputDelta& d) {
    out.content += d.content;
    out.reasoning += d.reasoning;
    for (const ToolCall& c : d.tool_calls) {
      out.calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
      out.call_texts += c.text;
    }
  };
  if (chunk == 0) {
    take(parser.push(text));
  } else {
    for (size_t i = 0; i < text.size(); i += chunk) take(parser.push(text.substr(i, chunk)));
  }
  take(parser.finish());
  out.cut_off = parser.cut_off_call();
  out.raw_unparsed = parser.raw_unparsed();
  return out;
}

TEST(OutputParser, RenderedTurnsParseBackToWhatWasRendered) {
  for (const RenderedTurn& turn : kRenderedTurns) {
    for (size_t chunk : {0, 1, 2, 7}) {
      const Parsed p = parse(turn.text, chunk);
      EXPECT_EQ(p.calls, json::parse(turn.calls)) << turn.name << ", chunk " << chunk;
      EXPECT_EQ(p.reasoning, turn.reasoning) << turn.name << ", chunk " << chunk;
      EXPECT_EQ(p.content, turn.content) << turn.name << ", chunk " << chunk;
      EXPECT_FALSE(p.cut_off) << turn.name;
      EXPECT_EQ(p.raw_unparsed, "") << turn.name;
    }
  }
}

TEST(OutputParser, TextAroundCallsStaysContent) {
  const Parsed p = parse("Sure.<|tool_call>call:f{a:1}<tool_call|>Done.", 1);
  EXPECT_EQ(p.content, "Sure.Done.");
  EXPECT_EQ(p.calls, json::parse(R"([{"name": "f", "arguments": {"a": 1}}])"));
}

// What a server hands back as text when it cannot take a call: the model's own words.
TEST(OutputParser, EachCallKeepsItsTextAsTheModelWroteIt) {
  const std::string first = R"T(<|tool_call>call:f{s:<|"|>a, b<|"|>,n:1.50}<tool_call|>)T";
  const std::string second = "<|tool_call>call:g{}<tool_call|>";
  for (size_t chunk : {0, 1, 3}) {
    const Parsed p = parse(first + "and" + second, chunk);
    EXPECT_EQ(p.call_texts, first + second) << "chunk " << chunk;
    EXPECT_EQ(p.content, "and") << "chunk " << chunk;
  }
}

TEST(OutputParser, PartialMarkersAreHeldBackAndReleasedAtTheEnd) {
  OutputParser parser;
  EXPECT_EQ(parser.push("a <|tool").content, "a ");
  EXPECT_EQ(parser.push("s>").content, "<|tools>");
  EXPECT_EQ(parser.push("<|chan").content, "");
  EXPECT_EQ(parser.finish().content, "<|chan");
}

TEST(OutputParser, AStreamEndingMidCallIsReportedCutOff) {
  const std::string text = R"T(Let me look.<|tool_call>call:search{q:<|"|>weather in Par)T";
  for (size_t chunk : {0, 1}) {
    const Parsed p = parse(text, chunk);
    EXPECT_TRUE(p.cut_off);
    EXPECT_EQ(p.content, "Let me look.");
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.raw_unparsed, R"T(<|tool_call>call:search{q:<|"|>weather in Par)T");
  }
}

TEST(OutputParser, AStreamEndingMidThoughtKeepsTheReasoning) {
  const Parsed p = parse("<|channel>thought\nstill thinking\n", 1);
  EXPECT_EQ(p.reasoning, "still thinking\n");
  EXPECT_EQ(p.content, "");
  EXPECT_FALSE(p.cut_off);
}

TEST(OutputParser, AMalformedCallIsSetAsideNotReturned) {
  const Parsed p = parse("x<|tool_call>call:f{a:1}}garbage<tool_call|>y", 0);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "xy");
  EXPECT_EQ(p.raw_unparsed, "<|tool_call>call:f{a:1}}garbage<tool_call|>");
  EXPECT_FALSE(p.cut_off);
}

TEST(OutputParser, ParseToolCallExplainsWhatIsWrong) {
  EXPECT_EQ(parse_tool_call("call:f{a:[1,{b:null}]}").arguments,
            json::parse(R"({"a": [1, {"b": null}]})"));
  EXPECT_THROW(parse_tool_call("f{a:1}"), ValueError);
  EXPECT_THROW(parse_tool_call("call:f{a:1"), ValueError);
  EXPECT_THROW(parse_tool_call("call:{a:1}"), ValueError);
}

TEST(OutputParser, ArgumentsKeepTheKeyOrderTheModelWrote) {
  EXPECT_EQ(parse_tool_call("call:f{zeta:1,alpha:{y:2,b:3},mid:4}").arguments.dump(),
            R"({"zeta":1,"alpha":{"y":2,"b":3},"mid":4})");
}

// Arguments nested a hundred thousand deep overflowed the stack (found by feeding
// tests/fuzz/output_parser_fuzz such a call); past 64 levels a call is malformed instead.
TEST(OutputParser, ArgumentsNestedTooDeepAreMalformedNotACrash) {
  const auto nested = [](int depth) {
    std::string call = "call:f{a:";
    for (int i = 0; i < depth; ++i) call += "{a:";
    call += "1";
    for (int i = 0; i < depth; ++i) call += "}";
    return call + "}";
  };
  EXPECT_EQ(parse_tool_call(nested(64)).name, "f");
  EXPECT_THROW(parse_tool_call(nested(65)), ValueError);
  const std::string deep = nested(100'000);
  EXPECT_THROW(parse_tool_call(deep), ValueError);
  const Parsed p = parse("<|tool_call>" + deep + "<tool_call|>done", 0);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "done");
}

}  // namespace
}  // namespace torchtpu
