// Specifications of src/grammar: the token masks llguidance computes over a tokenizer's vocabulary,
// committing tokens, the thinking block before the grammar, and errors for grammars it refuses.
// The vocabulary is byte_tokenizer.h's, whose 256 byte-fallback tokens spell any text, so every
// expected mask can be written down.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "byte_tokenizer.h"
#include "common/errors.h"
#include "grammar/constraint.h"

namespace torchtpu {
namespace {

std::shared_ptr<const GrammarVocabulary> vocabulary() {
  static const auto v = std::make_shared<const GrammarVocabulary>(
      byte_tokenizer(), std::vector<int64_t>{kEndOfTurn, kEos});
  return v;
}

std::set<int64_t> allowed(Constraint& c) {
  std::set<int64_t> ids;
  const auto& words = c.allowed();
  for (int64_t id = 0; id < vocabulary()->size(); ++id) {
    if (words[id / 32] >> (id % 32) & 1) ids.insert(id);
  }
  return ids;
}

void commit_text(Constraint& c, const std::string& text) {
  for (char ch : text) c.commit(byte_id(ch));
}

Grammar schema(const std::string& text) { return {GrammarKind::kJsonSchema, text}; }

std::string error_of(const Grammar& grammar) {
  try {
    Constraint c(vocabulary(), grammar);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "no error";
}

TEST(GrammarVocabulary, SpansTheTokenizerAndRefusesEndTokensOutsideIt) {
  EXPECT_EQ(vocabulary()->size(), 263);
  EXPECT_THROW(GrammarVocabulary(byte_tokenizer(), {263}), ValueError);
  EXPECT_THROW(GrammarVocabulary(byte_tokenizer(), {}), ValueError);
}

TEST(Constraint, EnumAllowsOnlyTheBytesOfItsValuesThenOnlyTheEndOfTurn) {
  Constraint c(vocabulary(), schema(R"({"enum": ["yes", "no"]})"));
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('"')}));
  c.commit(byte_id('"'));
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('y'), byte_id('n')}));
  commit_text(c, "yes");
  EXPECT_FALSE(c.complete());
  c.commit(byte_id('"'));
  EXPECT_TRUE(c.complete());
  EXPECT_EQ(allowed(c), (std::set<int64_t>{kEndOfTurn}));
}

TEST(Constraint, MultiByteTokensAreAllowedWhenTheirWholeTextFits) {
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"));
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('t'), byte_id('f'), kTrue}));
  c.commit(kTrue);
  EXPECT_TRUE(c.complete());
}

TEST(Constraint, SpecialTokensNeverMatchText) {
  Constraint c(vocabulary(), {GrammarKind::kRegex, "(.|\n)*"});
  const auto ids = allowed(c);
  for (int64_t special : {int64_t{0}, kChannelOpen, kChannelClose})
    EXPECT_EQ(ids.count(special), 0);
  EXPECT_EQ(ids.count(byte_id('<')), 1);
  EXPECT_EQ(ids.count(kSpaceA), 1);
  EXPECT_EQ(ids.count(kEndOfTurn), 1);  // the empty string matches: the output may end
}

TEST(Constraint, LarkNamesSpecialTokensById) {
  Constraint c(vocabulary(), {GrammarKind::kLark, R"(start: <[3]> "a" <[4]>)"});
  EXPECT_EQ(allowed(c), (std::set<int64_t>{kChannelOpen}));
  c.commit(kChannelOpen);
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('a')}));
  c.commit(byte_id('a'));
  EXPECT_EQ(allowed(c), (std::set<int64_t>{kChannelClose}));
}

TEST(Constraint, JsonObjectAllowsAnyObjectAndNothingElse) {
  Constraint c(vocabulary(), {GrammarKind::kJsonObject, ""});
  const auto first = allowed(c);
  EXPECT_EQ(first.count(byte_id('{')), 1);
  EXPECT_EQ(first.count(byte_id('[')), 0);
  EXPECT_EQ(first.count(byte_id('"')), 0);
  EXPECT_EQ(first.count(kEndOfTurn), 0);
  commit_text(c, R"({"k":[1,"a\"b",{}]})");
  EXPECT_TRUE(c.complete());
}

TEST(Constraint, JsonIsCompactUnlessTheSchemaAsksForWhitespace) {
  Constraint compact(vocabulary(), {GrammarKind::kJsonObject, ""});
  compact.commit(byte_id('{'));
  EXPECT_EQ(allowed(compact), (std::set<int64_t>{byte_id('"'), byte_id('}')}));
  Constraint flexible(vocabulary(),
                      schema(R"({"type": "object", "x-guidance": {"whitespace_flexible": true}})"));
  flexible.commit(byte_id('{'));
  EXPECT_EQ(allowed(flexible).count(byte_id(' ')), 1);
}

TEST(Constraint, RequiredPropertiesMustBeWrittenBeforeTheObjectCloses) {
  Constraint c(vocabulary(), schema(R"({"type": "object", "properties": {"n": {"type": "integer"}},
                                       "required": ["n"], "additionalProperties": false})"));
  c.commit(byte_id('{'));
  EXPECT_EQ(allowed(c).count(byte_id('}')), 0);
  commit_text(c, R"("n":)");
  const auto value = allowed(c);
  EXPECT_EQ(value.count(byte_id('7')), 1);
  EXPECT_EQ(value.count(byte_id('"')), 0);
  commit_text(c, "7}");
  EXPECT_TRUE(c.complete());
}

TEST(Constraint, MaskPutsMinusInfinityOutsideTheAllowedTokens) {
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"));
  const auto masked = c.mask(at::zeros({vocabulary()->size()}));
  const auto finite = at::isfinite(masked).nonzero().view({-1});
  EXPECT_EQ(
      std::vector<int64_t>(finite.data_ptr<int64_t>(), finite.data_ptr<int64_t>() + finite.numel()),
      (std::vector<int64_t>{byte_id('f'), byte_id('t'), kTrue}));
  // A model vocabulary padded past the tokenizer's: the padding is never allowed.
  const auto padded = c.mask(at::zeros({vocabulary()->size() + 7}));
  EXPECT_EQ(at::isfinite(padded).sum().item<int64_t>(), 3);
}

TEST(Constraint, CommittingATokenTheGrammarForbidsIsALogicError) {
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"));
  EXPECT_THROW(c.commit(byte_id('x')), std::logic_error);
}

TEST(Constraint, ThinkingBlockComesFirstAndTheGrammarStartsWhenItCloses) {
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"),
               ThinkingMarkers{kChannelOpen, kChannelClose});
  EXPECT_EQ(allowed(c), (std::set<int64_t>{kChannelOpen, byte_id('t'), byte_id('f'), kTrue}));
  c.commit(kChannelOpen);
  const auto thinking = allowed(c);
  EXPECT_EQ(thinking.size(), static_cast<size_t>(vocabulary()->size() - 2));
  EXPECT_EQ(thinking.count(kEndOfTurn) + thinking.count(kEos), 0);
  commit_text(c, "hmm {");
  c.commit(kChannelClose);
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('t'), byte_id('f'), kTrue}));
}

TEST(Constraint, ABlockThePromptOpenedIsThoughtInUntilItCloses) {
  // After a tool response with thinking on, the prompt ends inside the block.
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"),
               ThinkingMarkers{kChannelOpen, kChannelClose}, /*thinking_open=*/true);
  const auto thinking = allowed(c);
  EXPECT_EQ(thinking.size(), static_cast<size_t>(vocabulary()->size() - 2));
  EXPECT_EQ(thinking.count(kChannelClose), 1);
  commit_text(c, "rain {");
  c.commit(kChannelClose);
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('t'), byte_id('f'), kTrue}));
}

TEST(Constraint, WithoutThinkingTheGrammarStartsAtOnce) {
  Constraint c(vocabulary(), schema(R"({"type": "boolean"})"),
               ThinkingMarkers{kChannelOpen, kChannelClose});
  c.commit(byte_id('f'));
  EXPECT_EQ(allowed(c), (std::set<int64_t>{byte_id('a')}));
}

TEST(Constraint, GrammarsLlguidanceRefusesAreValueErrorsWithItsReason) {
  EXPECT_NE(error_of(schema("{not json")).find("line 1"), std::string::npos)
      << error_of(schema("{not json"));
  EXPECT_NE(error_of(schema(R"({"type": "frobnicate"})")).find("frobnicate"), std::string::npos)
      << error_of(schema(R"({"type": "frobnicate"})"));
  EXPECT_NE(error_of(schema(R"({"type": "array", "uniqueItems": true})")).find("uniqueItems"),
            std::string::npos);
  EXPECT_NE(error_of({GrammarKind::kRegex, "(unclosed"}), "no error");
  EXPECT_NE(error_of({GrammarKind::kLark, "start: undefined_rule"}).find("undefined_rule"),
            std::string::npos);
}

// A schema that compiles but admits no value (a $ref cycle with nothing between its steps) is
// refused when the constraint is made, without llguidance's dump of its state, not at the first
// step.
TEST(Constraint, AGrammarWithNoFirstTokenIsAValueErrorWhenMade) {
  for (const char* cycle : {R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})",
                            R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                               "b": {"$ref": "#/$defs/a"}}})"}) {
    const std::string error = error_of(schema(cycle));
    EXPECT_EQ(error.rfind("the grammar admits no first token (llguidance: ", 0), 0) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace torchtpu
