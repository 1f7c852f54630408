// Constrained decoding: the tokens a grammar allows next, computed by llguidance (a maintained
// Rust library, through its C interface) over the model's own vocabulary. A GrammarVocabulary is
// built once per tokenizer; each constrained request owns a Constraint that the decode loop steps:
// mask the logits, sample, commit the sampled token. Nothing here knows about HTTP or the engine.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "text/tokenizer.h"

struct LlgTokenizer;
struct LlgMatcher;

namespace torchtpu {

// Gemma 4's thinking block (<|channel> ... <channel|>). A constraint given these markers lets the
// output open with a thinking block and applies the grammar from the token after it closes.
struct ThinkingMarkers {
  int64_t open = -1;
  int64_t close = -1;
};

// The thinking block's markers (<|channel>, <channel|>) in `tokenizer`; none if it lacks either.
std::optional<ThinkingMarkers> thinking_markers(const Tokenizer& tokenizer);

// The tokens that end a constrained output, as GrammarVocabulary takes them: the checkpoint's eos
// ids with the tokenizer's end of turn first, the token llguidance offers once a grammar is
// complete.
std::vector<int64_t> grammar_end_ids(const Tokenizer& tokenizer, std::vector<int64_t> eos_ids);

// Every token's bytes as llguidance needs them (model pieces with "▁" read as a space and byte
// fallbacks as their byte; special tokens as 0xFF + their name, so text never matches them), and
// the tokens that end the output. Immutable and shareable.
class GrammarVocabulary {
 public:
  // `end_ids`: the tokens that end the output. The first (end of turn) is the only token allowed
  // once the grammar is complete, and where it could end; none of them is allowed inside a
  // thinking block. ValueError if one is outside the vocabulary.
  GrammarVocabulary(const Tokenizer& tokenizer, std::vector<int64_t> end_ids);
  ~GrammarVocabulary();
  GrammarVocabulary(const GrammarVocabulary&) = delete;
  GrammarVocabulary& operator=(const GrammarVocabulary&) = delete;

  int64_t size() const { return size_; }
  const std::vector<int64_t>& end_ids() const { return end_ids_; }
  const LlgTokenizer* handle() const { return handle_; }

 private:
  Tokenizer tokenizer_;  // llguidance tokenizes grammar literals through it
  int64_t size_ = 0;
  std::vector<int64_t> end_ids_;
  LlgTokenizer* handle_ = nullptr;
};

// ValueError carrying llguidance's message if it cannot compile `grammar` (an unsupported schema
// keyword, a malformed regex or Lark rule). Cheaper than building a Constraint.
void check_grammar(const GrammarVocabulary& vocabulary, const Grammar& grammar);

// One request's position in its grammar. Used by one thread at a time.
class Constraint {
 public:
  // ValueError as check_grammar for a grammar llguidance rejects. With `thinking_open` (and
  // markers) the prompt has opened the thinking block already: the output starts inside it.
  Constraint(std::shared_ptr<const GrammarVocabulary> vocabulary, const Grammar& grammar,
             std::optional<ThinkingMarkers> thinking = std::nullopt, bool thinking_open = false);
  ~Constraint();
  Constraint(const Constraint&) = delete;
  Constraint& operator=(const Constraint&) = delete;

  // The tokens allowed next, one bit each: bit (id % 32) of word (id / 32). Only end tokens once
  // the grammar is complete; inside a thinking block everything but the end tokens.
  const std::vector<uint32_t>& allowed();
  // Fills `forbidden`, a host bool [vocab], with true at every token not allowed next (the
  // sampler masks those logits). Ids past the grammar's vocabulary (a padded model vocabulary)
  // are never allowed.
  void forbid(const at::Tensor& forbidden);
  // `logits` [vocab] with -inf at every token forbid() marks: one masked_fill on the logits'
  // device (for callers masking one sequence's logits themselves).
  at::Tensor mask(const at::Tensor& logits);
  // Advances past `token`, which allowed() must have contained: std::logic_error otherwise.
  void commit(int64_t token);
  // True once the grammar can take no more text: the only token allowed is an end token.
  bool complete() const;
  // The tokens that end the output (GrammarVocabulary's): a sequence must stop at each, since the
  // grammar takes none of them as text.
  const std::vector<int64_t>& end_ids() const { return vocabulary_->end_ids(); }

 private:
  enum class Phase { kMayThink, kThinking, kGrammar };
  void compute_grammar_mask();

  std::shared_ptr<const GrammarVocabulary> vocabulary_;
  std::optional<ThinkingMarkers> thinking_;
  Phase phase_ = Phase::kGrammar;
  LlgMatcher* matcher_ = nullptr;
  std::vector<uint32_t> words_;
  // words_ is the grammar's mask for the matcher's state as it stands, as the constructor leaves
  // it: the first step reuses it rather than asking llguidance again.
  bool mask_current_ = false;
};

}  // namespace torchtpu
