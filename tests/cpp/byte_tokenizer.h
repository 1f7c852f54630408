// A small Gemma-shaped tokenizer for grammar tests: a few special tokens, the 256 byte-fallback
// tokens (so any text can be spelled byte by byte, and masks written down by id), "true" and
// "\u2581a" as multi-byte pieces, and optionally more special tokens after them.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace torchtpu {

constexpr int64_t kEos = 1;
constexpr int64_t kEndOfTurn = 2;
constexpr int64_t kChannelOpen = 3;
constexpr int64_t kChannelClose = 4;
constexpr int64_t kFirstByte = 5;  // <0x00> .. <0xFF> at 5 .. 260
constexpr int64_t kTrue = 261;     // "true"
constexpr int64_t kSpaceA = 262;   // "\u2581a", text " a"
constexpr int64_t kFirstExtraSpecial = 263;

inline int64_t byte_id(char c) { return kFirstByte + static_cast<unsigned char>(c); }

// `extra_specials` get the ids kFirstExtraSpecial, kFirstExtraSpecial + 1, ...
inline Tokenizer byte_tokenizer(const std::vector<std::string>& extra_specials = {}) {
  using nlohmann::json;
  std::vector<std::string> specials = {"<pad>", "<eos>", "<turn|>", "<|channel>", "<channel|>"};
  json vocab = json::object();
  for (size_t i = 0; i < specials.size(); ++i) vocab[specials[i]] = i;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = kFirstByte + b;
  }
  vocab["true"] = kTrue;
  vocab["\u2581a"] = kSpaceA;
  for (size_t i = 0; i < extra_specials.size(); ++i) {
    vocab[extra_specials[i]] = kFirstExtraSpecial + static_cast<int64_t>(i);
    specials.push_back(extra_specials[i]);
  }
  json added = json::array();
  for (const auto& special : specials) {
    added.push_back({{"id", vocab[special]},
                     {"content", special},
                     {"special", true},
                     {"normalized", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false}});
  }
  const json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}}};
  return Tokenizer::from_json_string(j.dump(), "byte_tokenizer");
}

}  // namespace torchtpu
