// libFuzzer harness: the streaming detokenizer on arbitrary id sequences. Its contract is the
// oracle: every piece is valid UTF-8 and the pieces together equal Tokenizer::decode of the same
// ids (skip_special_tokens when special tokens are hidden); an id outside the vocabulary is a
// ValueError from both.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/errors.h"
#include "fuzz_tokenizer.h"
#include "text/detokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torchtpu::fuzz::tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const torchtpu::Tokenizer& tok = torchtpu::fuzz::tokenizer();
  const bool show_special = data[0] & 1;
  std::vector<int64_t> ids = torchtpu::fuzz::ids_of(data + 1, size - 1);
  // Keep most ids inside the vocabulary so that long valid streams are the common case.
  if ((data[0] & 2) == 0) {
    for (int64_t& id : ids) id %= tok.vocab_size();
  }
  std::string expected;
  bool expected_error = false;
  try {
    expected = tok.decode(ids, !show_special);
  } catch (const torchtpu::ValueError&) {
    expected_error = true;
  }
  torchtpu::Detokenizer detok(tok, show_special);
  std::string streamed;
  try {
    for (int64_t id : ids) {
      const std::string piece = detok.push(id);
      if (!torchtpu::is_valid_utf8(piece)) std::abort();
      streamed += piece;
    }
    const std::string rest = detok.finish();
    if (!torchtpu::is_valid_utf8(rest)) std::abort();
    streamed += rest;
  } catch (const torchtpu::ValueError&) {
    if (!expected_error) std::abort();
    return 0;
  }
  if (expected_error || streamed != expected) std::abort();
  return 0;
}
