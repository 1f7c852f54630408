// Streaming decode: ids go in one at a time and text comes out as soon as it is final, so that
// the pieces concatenated equal Tokenizer::decode of all the ids and every piece is valid UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace torchtpu {

class Detokenizer {
 public:
  // show_special_tokens=false drops special tokens as decode(skip_special_tokens=true) does.
  // FormatError if the tokenizer's decoder chain cannot be streamed (ByteFallback after Fuse).
  Detokenizer(const Tokenizer& tok, bool show_special_tokens);

  // The text that `id` completes; empty while it is still undetermined. A run of byte-fallback
  // tokens is held until the run ends, because tokenizers turns the whole run into U+FFFD
  // characters when any byte of it is invalid. ValueError for an id outside the vocabulary.
  std::string push(int64_t id);
  // Whatever is held back; invalid trailing bytes become U+FFFD as in decode(). The
  // detokenizer starts afresh afterwards.
  std::string finish();

 private:
  struct Stage {
    DecoderStep step;
    bool after_fuse = false;
    std::string bytes;        // ByteFallback: the pending run of byte tokens
    std::string tail;         // after Fuse: text held back until the next one decides it
    int64_t start_seen = 0;   // Strip after Fuse: leading characters examined so far
    bool start_done = false;  // Strip after Fuse: leading strip finished
  };
  std::vector<std::string> feed(Stage& stage, std::vector<std::string> in);
  std::vector<std::string> flush(Stage& stage);
  std::string run(size_t first_stage, std::vector<std::string> tokens);
  void reset();

  Tokenizer tok_;
  bool show_special_tokens_;
  bool first_token_ = true;
  std::vector<Stage> stages_;
};

}  // namespace torchtpu
