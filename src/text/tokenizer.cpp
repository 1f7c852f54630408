#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "common/errors.h"
#include "common/json_depth.h"
#include "common/json_type.h"

namespace torchtpu {

using nlohmann::json;

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

void replace_all(std::string& s, std::string_view pattern, std::string_view content) {
  if (pattern.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(pattern, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += content;
    pos = hit + pattern.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

std::optional<uint8_t> byte_fallback_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

namespace {

// Length in bytes of the UTF-8 character starting with byte `c` (1 for stray bytes).
size_t utf8_len(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

uint32_t decode_code_point(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t len = utf8_len(c);
  uint32_t cp = len == 1 ? c : (c & (0x7F >> len));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Unicode White_Space, which is what `\s` means in the Rust regex crate tokenizers uses.
bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// `\w` for single_word tokens: ASCII letters, digits and '_' exactly; every other non-space,
// non-ASCII character counts as a word character (the Unicode word class without its tables).
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !is_unicode_space(cp);
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>>;

}  // namespace

namespace text_detail {

struct AddedToken {
  int64_t id = 0;
  std::string content;  // as written in the file
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Byte trie over added-token patterns, searched leftmost-longest as tokenizers' Aho-Corasick
// automaton (daachorse, MatchKind::LeftmostLongest) does.
class TokenTrie {
 public:
  bool empty() const { return values_.size() <= 1; }
  void insert(std::string_view pattern, int64_t token_index) {
    int32_t node = 0;
    for (unsigned char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = children_.find(key);
      if (it == children_.end()) {
        const auto next = static_cast<int32_t>(values_.size());
        values_.push_back(-1);
        it = children_.emplace(key, next).first;
        if (node == 0) first_byte_[c] = true;
      }
      node = it->second;
    }
    values_[node] = token_index;
  }
  // The longest pattern that starts at `pos`: (end, token index), or end == npos if none.
  std::pair<size_t, int64_t> longest_at(std::string_view s, size_t pos) const {
    std::pair<size_t, int64_t> best{std::string_view::npos, -1};
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) return best;
    int32_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[i]);
      const auto it = children_.find(key);
      if (it == children_.end()) break;
      node = it->second;
      if (values_[node] >= 0) best = {i + 1, values_[node]};
    }
    return best;
  }

 private:
  std::vector<int64_t> values_{-1};
  std::unordered_map<uint64_t, int32_t> children_;
  std::array<bool, 256> first_byte_{};
};

struct SplitStep {
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  std::string pattern;
  Behavior behavior;
};

struct Merge {
  uint32_t rank;
  int32_t new_id;
};

struct TokenizerModel {
  std::string origin;

  // BPE model.
  StringMap vocab;
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> rank, merged id
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;

  // Added tokens and the two matchers of tokenizers' AddedVocabulary.
  std::vector<AddedToken> added;
  StringMap added_ids;
  TokenTrie raw_trie;         // tokens with normalized=false, matched on the input text
  TokenTrie normalized_trie;  // tokens with normalized=true, matched on normalized pieces

  // id -> decoded string (added tokens first, as tokenizers' decode does), special flags.
  std::vector<std::string> pieces;
  std::vector<uint8_t> known;
  std::vector<uint8_t> special;

  std::vector<std::pair<std::string, std::string>> normalizer;  // Replace steps
  std::vector<SplitStep> pre_tokenizer;
  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  std::vector<int64_t> prefix_ids;
  std::vector<int64_t> suffix_ids;

  // Encodings of short words, as tokenizers caches them (words under 256 bytes).
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("tokenizer " + origin + ": " + what);
  }
  std::vector<int32_t> bpe_word(std::string_view word) const;
  void bpe(std::string_view word, std::vector<int64_t>& out) const;
};

}  // namespace text_detail

namespace {

using text_detail::AddedToken;
using text_detail::SplitStep;
using text_detail::TokenizerModel;

constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheCapacity = 10000;

struct Segment {
  std::string text;
  int64_t id = -1;  // an added token, or -1 for text still to tokenize
};

// tokenizers' AddedVocabulary::find_matches: splits `s` around added-token matches, applying
// single_word / lstrip / rstrip. Empty pieces are dropped, as PreTokenizedString::split does.
void split_added(const TokenizerModel& m, const text_detail::TokenTrie& trie, std::string&& s,
                 std::vector<Segment>& out) {
  if (s.empty()) return;
  if (trie.empty()) {
    out.push_back({std::move(s), -1});
    return;
  }
  const std::string_view sv(s);
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < sv.size()) {
    const auto [end, index] = trie.longest_at(sv, pos);
    if (end == std::string_view::npos) {
      ++pos;
      continue;
    }
    const AddedToken& t = m.added[static_cast<size_t>(index)];
    size_t start = pos;
    size_t stop = end;
    pos = end;
    if (t.single_word) {
      bool start_space = true;
      if (start > 0) {
        size_t b = start - 1;
        while (b > 0 && (static_cast<unsigned char>(sv[b]) & 0xC0) == 0x80) --b;
        start_space = !is_word_char(decode_code_point(sv, b));
      }
      const bool stop_space = stop == sv.size() || !is_word_char(decode_code_point(sv, stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t b = new_start - 1;
        while (b > 0 && (static_cast<unsigned char>(sv[b]) & 0xC0) == 0x80) --b;
        if (!is_unicode_space(decode_code_point(sv, b))) break;
        new_start = b;
      }
      start = std::max(new_start, start_offset);
    }
    if (t.rstrip) {
      while (stop < sv.size()) {
        const uint32_t cp = decode_code_point(sv, stop);
        if (!is_unicode_space(cp)) break;
        stop += utf8_len(static_cast<unsigned char>(sv[stop]));
      }
    }
    if (start_offset < start)
      out.push_back({std::string(sv.substr(start_offset, start - start_offset)), -1});
    out.push_back({std::string(sv.substr(start, stop - start)), t.id});
    start_offset = stop;
  }
  if (start_offset < sv.size()) out.push_back({std::string(sv.substr(start_offset)), -1});
}

// Splits on a literal pattern with tokenizers' SplitDelimiterBehavior (NormalizedString::split).
void split_literal(const SplitStep& step, std::string_view s, std::vector<std::string>& out) {
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> matches;
  size_t prev = 0;
  if (!step.pattern.empty()) {
    size_t hit;
    while ((hit = s.find(step.pattern, prev)) != std::string_view::npos) {
      if (prev < hit) matches.push_back({prev, hit, false});
      matches.push_back({hit, hit + step.pattern.size(), true});
      prev = hit + step.pattern.size();
    }
  }
  if (prev < s.size()) matches.push_back({prev, s.size(), false});

  using B = SplitStep::Behavior;
  std::vector<Span> splits;  // is_match here means "remove"
  bool previous_match = false;
  switch (step.behavior) {
    case B::kIsolated:
      for (auto sp : matches) splits.push_back({sp.begin, sp.end, false});
      break;
    case B::kRemoved: splits = matches; break;
    case B::kContiguous:
      for (auto sp : matches) {
        if (sp.is_match == previous_match && !splits.empty()) {
          splits.back().end = sp.end;
        } else {
          splits.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.is_match;
      }
      break;
    case B::kMergedWithPrevious:
      for (auto sp : matches) {
        if (sp.is_match && !previous_match && !splits.empty()) {
          splits.back().end = sp.end;
        } else {
          splits.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.is_match;
      }
      break;
    case B::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const auto& sp : splits) {
    if (!sp.is_match && sp.end > sp.begin) out.emplace_back(s.substr(sp.begin, sp.end - sp.begin));
  }
}

std::string byte_token(unsigned char b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

}  // namespace

namespace text_detail {

// tokenizers' BPE::merge_word followed by Word::merge_all: characters (or their byte-fallback
// tokens, or unk) become symbols, then the lowest-ranked adjacent pair is merged repeatedly,
// the leftmost one first among equal ranks.
std::vector<int32_t> TokenizerModel::bpe_word(std::string_view w) const {
  struct Symbol {
    int32_t c;
    int32_t prev;
    int32_t next;
    int32_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t c, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({c, n - 1, -1, len});
  };
  std::optional<std::pair<int32_t, int32_t>> unk;  // pending (id, byte length)
  std::string buffer;
  for (size_t i = 0; i < w.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(w[i])), w.size() - i);
    std::string_view ch = w.substr(i, len);
    const bool is_first = i == 0;
    i += len;
    const bool is_last = i == w.size();
    std::string_view s = ch;
    if ((!is_first && continuing_subword_prefix) || (is_last && end_of_word_suffix)) {
      buffer.clear();
      if (!is_first && continuing_subword_prefix) buffer += *continuing_subword_prefix;
      buffer += ch;
      if (is_last && end_of_word_suffix) buffer += *end_of_word_suffix;
      s = buffer;
    }
    const auto byte_len = static_cast<int32_t>(len);
    if (auto it = vocab.find(s); it != vocab.end()) {
      if (unk) {
        add(unk->first, unk->second);
        unk.reset();
      }
      add(static_cast<int32_t>(it->second), byte_len);
      continue;
    }
    if (byte_fallback) {
      std::vector<int32_t> ids;
      for (unsigned char b : s) {
        auto bt = vocab.find(byte_token(b));
        if (bt == vocab.end()) break;
        ids.push_back(static_cast<int32_t>(bt->second));
      }
      if (ids.size() == s.size()) {
        for (int32_t id : ids) add(id, 1);
        continue;
      }
    }
    if (unk_id) {
      if (unk && fuse_unk) {
        unk->second += byte_len;
      } else {
        if (unk) add(unk->first, unk->second);
        unk = std::make_pair(*unk_id, byte_len);
      }
    }
  }
  if (unk) add(unk->first, unk->second);

  auto merge_of = [this](int32_t a, int32_t b) -> const Merge* {
    const auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                                static_cast<uint32_t>(b));
    return it == merges.end() ? nullptr : &it->second;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = merge_of(symbols[i].c, symbols[i + 1].c)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (left.len == 0 || left.next == -1) continue;
    const Symbol right = symbols[static_cast<size_t>(left.next)];
    // An entry is stale when the pair at its position no longer merges into the same token.
    const Merge* current = merge_of(left.c, right.c);
    if (current == nullptr || current->new_id != top.new_id) continue;
    const int32_t right_pos = left.next;
    left.c = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[static_cast<size_t>(right_pos)].len = 0;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = merge_of(symbols[static_cast<size_t>(left.prev)].c, left.c)) {
        queue.push({m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* m = merge_of(left.c, symbols[static_cast<size_t>(left.next)].c)) {
        queue.push({m->rank, top.pos, m->new_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids.push_back(s.c);
  }
  return ids;
}

void TokenizerModel::bpe(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = bpe_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace text_detail

namespace {

// Reads tokenizer.json in one pass. model.vocab and model.merges, nearly all of the file, go
// straight into the model's tables; everything else becomes a DOM. Building a DOM of the whole
// file first took most of the load time.
class TokenizerReader {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  TokenizerReader(TokenizerModel& m, json& dom) : m_(m), dom_(dom) {}

  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;  // the first problem in vocab or merges

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(number_integer_t v) { return integer(v); }
  bool number_unsigned(number_unsigned_t v) {
    return integer(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
  }
  bool number_float(number_float_t v, const string_t& s) { return value(v, &s); }
  bool string(string_t& v) {
    if (section_ == Section::kMerges) {
      if (section_depth_ == 1) {
        const size_t space = v.find(' ');
        if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
          return fail("model.merges[" + std::to_string(merges.size()) + "] \"" + v +
                      "\" is not two tokens separated by one space");
        }
        merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      if (section_depth_ == 2 && pair_size_ < 2) {
        (pair_size_ == 0 ? merges.back().first : merges.back().second) = std::move(v);
        ++pair_size_;
        return true;
      }
      return fail("model.merges[" + std::to_string(merges.size() - 1) + "] is not [a, b]");
    }
    return value(std::move(v));
  }
  bool binary(binary_t&) { return fail("binary data"); }
  bool start_object(std::size_t n) {
    if (section_ != Section::kNone) {
      return fail(section_ == Section::kVocab ? "model.vocab values must be ids"
                                              : "model.merges entries must be strings or pairs");
    }
    if (path_.size() >= kMaxJsonDepth) return too_deep();
    if (path_.size() == 2 && key_ == "vocab" && path_[1] == "model") {
      section_ = Section::kVocab;
      m_.vocab.reserve(1 << 18);
    }
    path_.push_back(key_);
    return dom_parser_.start_object(n);
  }
  bool key(string_t& k) {
    if (section_ == Section::kVocab) {
      piece_ = std::move(k);
      return true;
    }
    key_ = k;
    return dom_parser_.key(k);
  }
  bool end_object() {
    if (section_ == Section::kVocab) section_ = Section::kNone;
    path_.pop_back();
    return dom_parser_.end_object();
  }
  bool start_array(std::size_t n) {
    if (section_ == Section::kMerges) {
      if (section_depth_ != 1) return fail("model.merges entries must be strings or pairs");
      ++section_depth_;
      merges.emplace_back();
      pair_size_ = 0;
      return true;
    }
    if (section_ == Section::kVocab) return fail("model.vocab values must be ids");
    if (path_.size() >= kMaxJsonDepth) return too_deep();
    if (path_.size() == 2 && key_ == "merges" && path_[1] == "model") {
      section_ = Section::kMerges;
      section_depth_ = 1;
    }
    path_.push_back(key_);
    return dom_parser_.start_array(n);
  }
  bool end_array() {
    if (section_ == Section::kMerges) {
      if (section_depth_ == 2) {
        --section_depth_;
        if (pair_size_ != 2) {
          return fail("model.merges[" + std::to_string(merges.size() - 1) + "] is not [a, b]");
        }
        return true;
      }
      section_ = Section::kNone;
    }
    path_.pop_back();
    return dom_parser_.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (error.empty()) error = std::string("not valid JSON: ") + json_error_text(e);
    return false;
  }

 private:
  enum class Section { kNone, kVocab, kMerges };
  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }
  bool too_deep() {
    return fail("arrays and objects nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  bool integer(int64_t v) {
    if (section_ == Section::kVocab) {
      if (v < 0 || v > INT32_MAX) return fail("model.vocab[\"" + piece_ + "\"] is not a valid id");
      m_.vocab.emplace(std::move(piece_), v);
      return true;
    }
    return value(v);
  }
  template <typename T>
  bool value(T&& v, const string_t* float_text = nullptr) {
    if (section_ == Section::kVocab) return fail("model.vocab[\"" + piece_ + "\"] is not an id");
    if (section_ == Section::kMerges) return fail("model.merges entries must be strings or pairs");
    if constexpr (std::is_same_v<std::decay_t<T>, number_float_t>) {
      return dom_parser_.number_float(v, *float_text);
    } else if constexpr (std::is_same_v<std::decay_t<T>, int64_t>) {
      return dom_parser_.number_integer(v);
    } else if constexpr (std::is_same_v<std::decay_t<T>, bool>) {
      return dom_parser_.boolean(v);
    } else if constexpr (std::is_same_v<std::decay_t<T>, std::nullptr_t>) {
      return dom_parser_.null();
    } else {
      return dom_parser_.string(v);
    }
  }

  TokenizerModel& m_;
  json& dom_;
  nlohmann::detail::json_sax_dom_parser<json> dom_parser_{dom_, false};
  std::vector<std::string> path_;
  std::string key_;
  std::string piece_;
  Section section_ = Section::kNone;
  int section_depth_ = 0;
  size_t pair_size_ = 0;
};

std::string pattern_string(const TokenizerModel& m, const json& pattern, const std::string& where) {
  if (!pattern.is_object()) m.fail(where + ".pattern must be an object");
  if (pattern.contains("Regex")) {
    m.fail(where + ".pattern: Regex patterns are not supported (only String)");
  }
  if (!pattern.contains("String") || !pattern["String"].is_string()) {
    m.fail(where + ".pattern must be {\"String\": ...}");
  }
  return pattern["String"].get<std::string>();
}

std::string type_of(const TokenizerModel& m, const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    m.fail(where + " has no \"type\"");
  }
  return j["type"].get<std::string>();
}

void load_normalizer(TokenizerModel& m, const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = type_of(m, j, where);
  if (type == "Sequence") {
    const json& list = j.value("normalizers", json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      load_normalizer(m, list[i], where + ".normalizers[" + std::to_string(i) + "]");
    }
  } else if (type == "Replace") {
    m.normalizer.emplace_back(pattern_string(m, j.value("pattern", json()), where),
                              j.value("content", std::string()));
  } else {
    m.fail(where + ": normalizer type \"" + type + "\" is not supported (Replace, Sequence)");
  }
}

void load_pre_tokenizer(TokenizerModel& m, const json& j, const std::string& where) {
  if (j.is_null()) return;
  const std::string type = type_of(m, j, where);
  if (type == "Sequence") {
    const json& list = j.value("pretokenizers", json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      load_pre_tokenizer(m, list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
    }
    return;
  }
  if (type != "Split") {
    m.fail(where + ": pre_tokenizer type \"" + type + "\" is not supported (Split, Sequence)");
  }
  if (j.value("invert", false)) m.fail(where + ": Split with invert=true is not supported");
  using B = SplitStep::Behavior;
  static const std::unordered_map<std::string, B> kBehaviors = {
      {"Removed", B::kRemoved},
      {"Isolated", B::kIsolated},
      {"MergedWithPrevious", B::kMergedWithPrevious},
      {"MergedWithNext", B::kMergedWithNext},
      {"Contiguous", B::kContiguous}};
  const std::string behavior = j.value("behavior", std::string());
  const auto it = kBehaviors.find(behavior);
  if (it == kBehaviors.end()) m.fail(where + ": unknown Split behavior \"" + behavior + "\"");
  m.pre_tokenizer.push_back({pattern_string(m, j.value("pattern", json()), where), it->second});
}

void load_decoder(TokenizerModel& m, const json& j, const std::string& where) {
  const std::string type = type_of(m, j, where);
  DecoderStep step{};
  if (type == "Sequence") {
    const json& list = j.value("decoders", json::array());
    for (size_t i = 0; i < list.size(); ++i) {
      load_decoder(m, list[i], where + ".decoders[" + std::to_string(i) + "]");
    }
    return;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    step.pattern = pattern_string(m, j.value("pattern", json()), where);
    step.content = j.value("content", std::string());
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    step.content = j.value("content", std::string(" "));
    if (step.content.empty() ||
        utf8_len(static_cast<unsigned char>(step.content[0])) != step.content.size()) {
      m.fail(where + ": Strip content must be one character");
    }
    step.start = j.value("start", int64_t{0});
    step.stop = j.value("stop", int64_t{0});
  } else {
    m.fail(where + ": decoder type \"" + type +
           "\" is not supported (Replace, ByteFallback, Fuse, Strip, Sequence)");
  }
  m.decoder.push_back(std::move(step));
}

// An id as tokenizers reads it (u32): an integer, never a float, which get<int64_t> would convert
// with undefined behaviour when out of range (found by tests/fuzz/config_fuzz).
int64_t id_of(const TokenizerModel& m, const json& v, const std::string& where) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
      v.get<uint64_t>() > UINT32_MAX) {
    m.fail(where + " is not a valid id: " + v.dump());
  }
  return v.get<int64_t>();
}

const json& special_ids(TokenizerModel& m, const json& specials, const std::string& name) {
  if (!specials.contains(name))
    m.fail("post_processor: special token \"" + name + "\" not defined");
  // contains() before every lookup: a const operator[] with a missing key reads out of bounds.
  const json& token = specials[name];
  if (!token.is_object() || !token.contains("ids") || !token["ids"].is_array()) {
    m.fail("post_processor: special token \"" + name + "\" has no ids");
  }
  return token["ids"];
}

void load_post_processor(TokenizerModel& m, const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(m, j, "post_processor");
  if (type != "TemplateProcessing") {
    m.fail("post_processor type \"" + type + "\" is not supported (TemplateProcessing)");
  }
  const json specials = j.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& item : j.value("single", json::array())) {
    if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", "");
      for (const json& id : special_ids(m, specials, name)) {
        (seen_sequence ? m.suffix_ids : m.prefix_ids)
            .push_back(id_of(m, id, "post_processor: special token \"" + name + "\" id"));
      }
    } else if (item.contains("Sequence")) {
      if (seen_sequence) m.fail("post_processor.single names the sequence twice");
      seen_sequence = true;
    } else {
      m.fail("post_processor.single has an item that is neither SpecialToken nor Sequence");
    }
  }
  if (!seen_sequence) m.fail("post_processor.single does not contain the sequence");
}

void load_model(TokenizerModel& m, const json& j,
                const std::vector<std::pair<std::string, std::string>>& merges) {
  if (!j.is_object()) m.fail("\"model\" is missing");
  const std::string type = j.value("type", std::string("BPE"));
  if (type != "BPE") m.fail("model type \"" + type + "\" is not supported (BPE)");
  if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() > 0.0) {
    m.fail("model.dropout is not supported (encoding would not be deterministic)");
  }
  if (!j.contains("vocab") || !j["vocab"].is_object()) m.fail("model.vocab must be an object");
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    const std::string unk = j["unk_token"].get<std::string>();
    const auto it = m.vocab.find(unk);
    if (it == m.vocab.end()) m.fail("model.unk_token \"" + unk + "\" is not in the vocabulary");
    m.unk_id = static_cast<int32_t>(it->second);
  }
  m.fuse_unk = j.value("fuse_unk", false);
  m.byte_fallback = j.value("byte_fallback", false);
  m.ignore_merges = j.value("ignore_merges", false);
  for (auto [key, slot] : {std::pair{"continuing_subword_prefix", &m.continuing_subword_prefix},
                           std::pair{"end_of_word_suffix", &m.end_of_word_suffix}}) {
    if (j.contains(key) && !j[key].is_null()) *slot = j[key].get<std::string>();
  }

  m.merges.reserve(merges.size());
  const size_t prefix_len = m.continuing_subword_prefix ? m.continuing_subword_prefix->size() : 0;
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = m.vocab.find(a);
    const auto ib = m.vocab.find(b);
    if (ia == m.vocab.end() || ib == m.vocab.end() || b.size() < prefix_len) {
      m.fail("model.merges[" + std::to_string(rank) + "] uses a token not in the vocabulary");
    }
    merged.assign(a).append(b, prefix_len, std::string::npos);
    const auto im = m.vocab.find(merged);
    if (im == m.vocab.end()) {
      m.fail("model.merges[" + std::to_string(rank) + "] makes \"" + merged +
             "\", which is not in the vocabulary");
    }
    // A repeated pair keeps its last rank, as tokenizers' map collection does.
    m.merges[(static_cast<uint64_t>(ia->second) << 32) | static_cast<uint64_t>(ib->second)] = {
        static_cast<uint32_t>(rank), static_cast<int32_t>(im->second)};
  }
}

std::string normalize(const TokenizerModel& m, std::string s) {
  for (const auto& [pattern, content] : m.normalizer) replace_all(s, pattern, content);
  return s;
}

// tokenizers' AddedVocabulary::add_tokens as the deserializer calls it: an added token keeps the
// model's id for its content, otherwise takes the next id after the vocabulary.
void load_added_tokens(TokenizerModel& m, const json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) m.fail("added_tokens must be a list");
  int64_t model_size = static_cast<int64_t>(m.vocab.size());
  int64_t max_added = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("content") || !e["content"].is_string()) {
      m.fail(where + " has no content");
    }
    AddedToken t;
    t.content = e["content"].get<std::string>();
    if (t.content.empty()) continue;
    t.special = e.value("special", false);
    t.lstrip = e.value("lstrip", false);
    t.rstrip = e.value("rstrip", false);
    t.single_word = e.value("single_word", false);
    t.normalized = e.value("normalized", !t.special);
    if (auto it = m.added_ids.find(t.content); it != m.added_ids.end()) {
      t.id = it->second;
    } else if (auto v = m.vocab.find(t.content); v != m.vocab.end()) {
      t.id = v->second;
    } else {
      t.id = (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
    }
    if (e.contains("id")) {
      const int64_t id = id_of(m, e["id"], where + ".id");
      if (id != t.id) {
        m.fail(where + " \"" + t.content + "\" has id " + std::to_string(id) +
               " but the vocabulary gives it id " + std::to_string(t.id));
      }
    }
    max_added = std::max(max_added, t.id);
    m.added_ids[t.content] = t.id;
    m.added.push_back(std::move(t));
  }
}

void build_tables(TokenizerModel& m) {
  int64_t size = 0;
  for (const auto& [piece, id] : m.vocab) size = std::max(size, id + 1);
  for (const AddedToken& t : m.added) size = std::max(size, t.id + 1);
  m.pieces.assign(static_cast<size_t>(size), std::string());
  m.known.assign(static_cast<size_t>(size), 0);
  m.special.assign(static_cast<size_t>(size), 0);
  for (const auto& [piece, id] : m.vocab) {
    m.pieces[static_cast<size_t>(id)] = piece;
    m.known[static_cast<size_t>(id)] = 1;
  }
  std::unordered_set<std::string> special_contents;
  for (const AddedToken& t : m.added) {
    if (t.special) special_contents.insert(t.content);
  }
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& t = m.added[i];
    const auto id = static_cast<size_t>(t.id);
    // Decoding uses the normalized form of a normalized token (tokenizers' normalized_cache).
    const std::string shown = t.normalized ? normalize(m, t.content) : t.content;
    m.pieces[id] = shown;
    m.known[id] = 1;
    (t.normalized ? m.normalized_trie : m.raw_trie).insert(shown, static_cast<int64_t>(i));
  }
  // tokenizers skips by content, so any id whose string is a special token's content counts.
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    if (m.known[id] && special_contents.count(m.pieces[id])) m.special[id] = 1;
  }
  for (const auto* ids : {&m.prefix_ids, &m.suffix_ids}) {
    for (int64_t id : *ids) {
      if (id >= size || !m.known[static_cast<size_t>(id)]) {
        m.fail("post_processor uses id " + std::to_string(id) + ", which is not in the vocabulary");
      }
    }
  }
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<text_detail::TokenizerModel> model)
    : model_(std::move(model)) {}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw NotFoundError("tokenizer file " + path +
                        " is a directory: give the tokenizer.json in it");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError("tokenizer file " + path + " cannot be opened");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json_string(buffer.str(), path);
}

Tokenizer Tokenizer::from_json_string(std::string_view json_text, const std::string& origin) {
  auto m = std::make_shared<TokenizerModel>();
  m->origin = origin;
  json j;
  TokenizerReader reader(*m, j);
  if (!json::sax_parse(json_text, &reader) || !reader.error.empty()) {
    m->fail(reader.error.empty() ? "not valid JSON" : reader.error);
  }
  if (!j.is_object()) m->fail("top level must be an object");
  try {
    load_model(*m, j.value("model", json()), reader.merges);
    load_normalizer(*m, j.value("normalizer", json()), "normalizer");
    load_pre_tokenizer(*m, j.value("pre_tokenizer", json()), "pre_tokenizer");
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      m->has_decoder = true;
      load_decoder(*m, j["decoder"], "decoder");
    }
    load_post_processor(*m, j.value("post_processor", json()));
    load_added_tokens(*m, j.value("added_tokens", json()));
    build_tables(*m);
  } catch (const json::exception& e) {
    m->fail(std::string("unexpected JSON structure: ") + json_error_text(e));
  }
  return Tokenizer(std::move(m));
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerModel& m = *model_;
  if (!is_valid_utf8(text)) throw ValueError("encode: the text is not valid UTF-8");
  std::vector<Segment> raw;
  split_added(m, m.raw_trie, std::string(text), raw);
  std::vector<Segment> segments;
  for (Segment& seg : raw) {
    if (seg.id >= 0) {
      segments.push_back(std::move(seg));
    } else {
      split_added(m, m.normalized_trie, normalize(m, std::move(seg.text)), segments);
    }
  }
  std::vector<int64_t> ids(m.prefix_ids);
  if (!add_special_tokens) ids.clear();
  ids.reserve(ids.size() + text.size() / 3);
  std::vector<std::string> words;
  std::vector<std::string> next;
  for (Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    words.clear();
    words.push_back(std::move(seg.text));
    for (const SplitStep& step : m.pre_tokenizer) {
      next.clear();
      for (const std::string& w : words) split_literal(step, w, next);
      words.swap(next);
    }
    for (const std::string& w : words) m.bpe(w, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

namespace {

void decode_chain(const std::vector<DecoderStep>& steps, std::vector<std::string>& tokens) {
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) replace_all(t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          if (is_valid_utf8(bytes)) {
            out.push_back(bytes);
          } else {
            for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
          }
          bytes.clear();
        };
        for (std::string& t : tokens) {
          if (auto b = byte_fallback_value(t)) {
            bytes.push_back(static_cast<char>(*b));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(out);
        break;
      }
      case DecoderStep::Kind::kFuse: {
        std::string joined;
        for (const std::string& t : tokens) joined += t;
        tokens.assign(1, std::move(joined));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) strip(step, t);
        break;
    }
  }
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const TokenizerModel& m = *model_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    const std::string& piece = id_to_token(id);
    if (skip_special_tokens && m.special[static_cast<size_t>(id)]) continue;
    tokens.push_back(piece);
  }
  std::string text;
  if (!m.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  decode_chain(m.decoder, tokens);
  for (const std::string& t : tokens) text += t;
  return text;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(model_->pieces.size()); }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = model_->added_ids.find(token); it != model_->added_ids.end()) return it->second;
  if (auto it = model_->vocab.find(token); it != model_->vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::id_to_token(int64_t id) const {
  const TokenizerModel& m = *model_;
  if (id < 0 || id >= vocab_size() || !m.known[static_cast<size_t>(id)]) {
    throw ValueError("token id " + std::to_string(id) + " is not in the vocabulary of " + m.origin +
                     " (size " + std::to_string(vocab_size()) + ")");
  }
  return m.pieces[static_cast<size_t>(id)];
}

std::string Tokenizer::token_bytes(int64_t id) const {
  std::string piece = id_to_token(id);
  if (is_special(id)) return piece;
  if (auto byte = byte_fallback_value(piece)) return std::string(1, static_cast<char>(*byte));
  // Fuse and Strip act on the joined text, not on one token.
  for (const auto& step : decoder_steps()) {
    if (step.kind == DecoderStep::Kind::kReplace) replace_all(piece, step.pattern, step.content);
  }
  return piece;
}

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && model_->special[static_cast<size_t>(id)];
}

const std::vector<int64_t>& Tokenizer::prefix_special_ids() const { return model_->prefix_ids; }
const std::vector<DecoderStep>& Tokenizer::decoder_steps() const { return model_->decoder; }
bool Tokenizer::has_decoder() const { return model_->has_decoder; }

void strip(const DecoderStep& step, std::string& token) {
  const std::string& c = step.content;
  size_t begin = 0;
  for (int64_t k = 0; k < step.start && token.compare(begin, c.size(), c) == 0; ++k) {
    begin += c.size();
  }
  size_t end = token.size();
  for (int64_t k = 0;
       k < step.stop && end >= begin + c.size() && token.compare(end - c.size(), c.size(), c) == 0;
       ++k) {
    end -= c.size();
  }
  token = token.substr(begin, end - begin);
}

Tokenizer model_tokenizer(const std::string& path, int64_t vocab) {
  auto tokenizer = Tokenizer::from_file(path);
  if (tokenizer.vocab_size() > vocab) {
    throw FormatError(path + " has " + std::to_string(tokenizer.vocab_size()) +
                      " token ids but the model's vocab_size is " + std::to_string(vocab) +
                      ": text would give ids the model has no embedding for (a tokenizer of "
                      "another model?)");
  }
  return tokenizer;
}

}  // namespace torchtpu
