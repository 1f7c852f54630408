#include "grammar/constraint.h"

#include <llguidance.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "common/errors.h"
#include "text/output_parser.h"

namespace torchtpu {
namespace {

// What toktrie (llguidance's vocabulary) reads as "the rest of this token is a special name".
constexpr char kSpecialMarker = '\xFF';

// The bytes token `id` stands for in output text; empty for an id the tokenizer does not define.
// A special token's bytes follow kSpecialMarker.
std::string token_bytes(const Tokenizer& tokenizer, int64_t id) {
  try {
    const std::string bytes = tokenizer.token_bytes(id);
    return tokenizer.is_special(id) ? kSpecialMarker + bytes : bytes;
  } catch (const ValueError&) {
    return {};
  }
}

// llguidance's tokenize callback: tokenizes grammar literals the way the model's prompts are.
// It must not throw across the C boundary; text our tokenizer refuses (invalid UTF-8) yields
// no tokens, which llguidance treats as "no canonical tokenization" for that text.
size_t tokenize(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                uint32_t* output_tokens, size_t output_tokens_len) noexcept {
  try {
    const auto& tokenizer = *static_cast<const Tokenizer*>(user_data);
    const auto ids =
        tokenizer.encode(std::string_view(reinterpret_cast<const char*>(bytes), bytes_len));
    for (size_t i = 0; i < std::min(ids.size(), output_tokens_len); ++i) {
      output_tokens[i] = static_cast<uint32_t>(ids[i]);
    }
    return ids.size();
  } catch (...) {
    return 0;
  }
}

const char* kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kLark: return "lark";
  }
  return "json_object";
}

// What llguidance compiles for `grammar`: JSON is written compact (no whitespace between tokens)
// unless the schema's own "x-guidance" options say otherwise. Flexible whitespace lets a model
// pad without end (runs of blank tokens, which Gemma's vocabulary has many of), and no JSON
// reader needs it.
std::pair<const char*, std::string> compiled(const Grammar& grammar) {
  if (grammar.kind != GrammarKind::kJsonSchema && grammar.kind != GrammarKind::kJsonObject) {
    return {kind_name(grammar.kind), grammar.source};
  }
  nlohmann::ordered_json schema = nlohmann::ordered_json::object({{"type", "object"}});
  if (grammar.kind == GrammarKind::kJsonSchema) {
    schema = nlohmann::ordered_json::parse(grammar.source, nullptr, /*allow_exceptions=*/false);
    // Not an object (or not JSON): llguidance reports what is wrong with it.
    if (!schema.is_object()) return {"json_schema", grammar.source};
  }
  if (!schema.contains("x-guidance")) schema["x-guidance"] = {{"whitespace_flexible", false}};
  return {"json_schema", schema.dump()};
}

LlgConstraintInit constraint_init(const GrammarVocabulary& vocabulary) {
  LlgConstraintInit init{};
  llg_constraint_init_set_defaults(&init, vocabulary.handle());
  init.log_stderr_level = 0;  // problems reach the caller as exceptions, not on the server's stderr
  return init;
}

}  // namespace

std::optional<ThinkingMarkers> thinking_markers(const Tokenizer& tokenizer) {
  const auto open = tokenizer.token_to_id(kChannelOpen);
  const auto close = tokenizer.token_to_id(kChannelClose);
  if (!open || !close) return std::nullopt;
  return ThinkingMarkers{*open, *close};
}

std::vector<int64_t> grammar_end_ids(const Tokenizer& tokenizer, std::vector<int64_t> eos_ids) {
  if (const auto turn_end = tokenizer.token_to_id("<turn|>")) {
    std::erase(eos_ids, *turn_end);
    eos_ids.insert(eos_ids.begin(), *turn_end);
  }
  return eos_ids;
}

GrammarVocabulary::GrammarVocabulary(const Tokenizer& tokenizer, std::vector<int64_t> end_ids)
    : tokenizer_(tokenizer), size_(tokenizer.vocab_size()), end_ids_(std::move(end_ids)) {
  if (end_ids_.empty()) throw ValueError("constrained decoding needs at least one end token");
  for (int64_t id : end_ids_) {
    if (id < 0 || id >= size_) {
      throw ValueError("end token " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(size_) + ")");
    }
  }
  std::vector<uint32_t> lens(size_);
  std::string bytes;
  for (int64_t id = 0; id < size_; ++id) {
    const std::string b = token_bytes(tokenizer_, id);
    lens[id] = static_cast<uint32_t>(b.size());
    bytes += b;
  }
  LlgTokenizerInitV2 init{};
  init.struct_size = sizeof(init);
  init.vocab_size = static_cast<uint32_t>(size_);
  init.tok_eos = static_cast<uint32_t>(end_ids_.front());
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  init.tokenize_assumes_string = true;
  init.tokenize_fn = tokenize;
  init.tokenize_user_data = &tokenizer_;
  char error[1024] = {};
  handle_ = llg_new_tokenizer_v2(&init, error, sizeof(error));
  if (!handle_) throw FormatError(std::string("llguidance refused the vocabulary: ") + error);
}

GrammarVocabulary::~GrammarVocabulary() { llg_free_tokenizer(handle_); }

void check_grammar(const GrammarVocabulary& vocabulary, const Grammar& grammar) {
  LlgConstraintInit init = constraint_init(vocabulary);
  const auto [kind, source] = compiled(grammar);
  char message[2048] = {};
  const int32_t rc = llg_validate_grammar(&init, kind, source.c_str(), message, sizeof(message));
  // 1 is a warning: llguidance would compile the grammar but not enforce all of it (a keyword
  // it ignores). Enforcing less than the client asked is refused like an error.
  if (rc != 0) throw ValueError(message);
}

Constraint::Constraint(std::shared_ptr<const GrammarVocabulary> vocabulary, const Grammar& grammar,
                       std::optional<ThinkingMarkers> thinking, bool thinking_open)
    : vocabulary_(std::move(vocabulary)), thinking_(thinking) {
  check_grammar(*vocabulary_, grammar);
  LlgConstraintInit init = constraint_init(*vocabulary_);
  const auto [kind, source] = compiled(grammar);
  matcher_ = llg_new_matcher(&init, kind, source.c_str());
  if (const char* error = llg_matcher_get_error(matcher_)) {
    const std::string message = error;
    llg_free_matcher(matcher_);
    throw ValueError(message);
  }
  words_.assign(llg_matcher_get_mask_byte_size(matcher_) / sizeof(uint32_t), 0);
  // A grammar can compile and still admit no first token (a $ref cycle that holds no value):
  // refused here, as the caller's error, rather than failing the first step.
  if (llg_matcher_compute_mask_into(matcher_, words_.data(), words_.size() * sizeof(uint32_t)) !=
      0) {
    std::string message = llg_matcher_get_error(matcher_);
    message = message.substr(0, message.find('\n'));  // without llguidance's dump of its state
    llg_free_matcher(matcher_);
    throw ValueError("the grammar admits no first token (llguidance: " + message + ")");
  }
  mask_current_ = true;
  if (thinking_) phase_ = thinking_open ? Phase::kThinking : Phase::kMayThink;
}

Constraint::~Constraint() { llg_free_matcher(matcher_); }

void Constraint::compute_grammar_mask() {
  if (mask_current_) return;
  if (llg_matcher_compute_mask_into(matcher_, words_.data(), words_.size() * sizeof(uint32_t)) !=
      0) {
    throw std::logic_error(std::string("llguidance: ") + llg_matcher_get_error(matcher_));
  }
  mask_current_ = true;
}

const std::vector<uint32_t>& Constraint::allowed() {
  auto set = [&](int64_t id, bool on) {
    const uint32_t bit = 1u << (id % 32);
    words_[id / 32] = on ? (words_[id / 32] | bit) : (words_[id / 32] & ~bit);
  };
  switch (phase_) {
    case Phase::kMayThink:
      compute_grammar_mask();
      set(thinking_->open, true);
      mask_current_ = false;
      break;
    case Phase::kThinking:
      // Free text, but the output may not end before the thinking block closes: an answer that
      // ends with "stop" is always one the grammar accepted.
      std::fill(words_.begin(), words_.end(), ~0u);
      for (int64_t id = vocabulary_->size(); id < static_cast<int64_t>(words_.size()) * 32; ++id) {
        set(id, false);
      }
      for (int64_t id : vocabulary_->end_ids()) set(id, false);
      mask_current_ = false;
      break;
    case Phase::kGrammar: compute_grammar_mask(); break;
  }
  return words_;
}

void Constraint::forbid(const at::Tensor& forbidden) {
  static_assert(std::endian::native == std::endian::little,
                "the mask's words are read as bytes: bit b of byte k is token 8k+b");
  TORCH_CHECK(forbidden.device().is_cpu() && forbidden.scalar_type() == at::kBool &&
                  forbidden.dim() == 1 && forbidden.is_contiguous(),
              "Constraint::forbid fills a contiguous host bool [vocab], got ", forbidden.options(),
              " of sizes ", forbidden.sizes());
  // forbidden_bytes[v][b]: whether bit b of the mask byte v is clear.
  static const auto forbidden_bytes = [] {
    std::array<std::array<uint8_t, 8>, 256> table{};
    for (int v = 0; v < 256; ++v) {
      for (int b = 0; b < 8; ++b) table[v][b] = ((v >> b) & 1) == 0;
    }
    return table;
  }();
  const auto& words = allowed();
  const int64_t vocab = forbidden.size(0);
  // Unpacked by table (ATen's bitwise unpacking costs ~20x more on the CPU); token ids past the
  // grammar's vocabulary (a padded model vocabulary) are forbidden.
  const int64_t known = std::min<int64_t>(vocab, static_cast<int64_t>(words.size()) * 32);
  const auto* packed = reinterpret_cast<const uint8_t*>(words.data());
  auto* out = reinterpret_cast<uint8_t*>(forbidden.data_ptr<bool>());
  for (int64_t id = 0; id < known; id += 8) {
    std::memcpy(out + id, forbidden_bytes[packed[id / 8]].data(), std::min<int64_t>(8, known - id));
  }
  std::fill(out + known, out + vocab, uint8_t{1});
}

at::Tensor Constraint::mask(const at::Tensor& logits) {
  auto forbidden = at::empty({logits.size(-1)}, at::kBool);
  forbid(forbidden);
  return logits.masked_fill(forbidden.to(logits.device()), -std::numeric_limits<float>::infinity());
}

void Constraint::commit(int64_t token) {
  switch (phase_) {
    case Phase::kMayThink:
      if (token == thinking_->open) {
        phase_ = Phase::kThinking;
        return;
      }
      phase_ = Phase::kGrammar;
      break;
    case Phase::kThinking:
      if (token == thinking_->close) phase_ = Phase::kGrammar;
      return;
    case Phase::kGrammar: break;
  }
  mask_current_ = false;
  if (llg_matcher_consume_token(matcher_, static_cast<uint32_t>(token)) != 0) {
    throw std::logic_error("llguidance: token " + std::to_string(token) +
                           " is not allowed here: " + llg_matcher_get_error(matcher_));
  }
}

bool Constraint::complete() const {
  return phase_ == Phase::kGrammar && llg_matcher_is_stopped(matcher_);
}

}  // namespace torchtpu
