// libFuzzer harness: the Gemma 4 tokenizer on arbitrary input. The first byte chooses the
// direction: encode the rest as text (any bytes, invalid UTF-8 included; invalid text must be a
// ValueError, valid text must encode into ids that decode back to it), or decode the rest as ids
// (an id outside the vocabulary must be a ValueError, and the text must be valid UTF-8).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/errors.h"
#include "fuzz_tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torchtpu::fuzz::tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const torchtpu::Tokenizer& tok = torchtpu::fuzz::tokenizer();
  const uint8_t mode = data[0];
  ++data, --size;
  if (mode & 1) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
      const std::vector<int64_t> ids = tok.encode(text, (mode & 2) != 0);
      if (!torchtpu::is_valid_utf8(text)) std::abort();
      for (int64_t id : ids) {
        if (id < 0 || id >= tok.vocab_size()) std::abort();
      }
      // Gemma's tokenizer loses nothing but the difference between " " and "\u2581" (its
      // normalizer writes spaces as U+2581): decoding other text gives it back.
      if ((mode & 2) == 0 && text.find("\xE2\x96\x81") == std::string_view::npos &&
          tok.decode(ids) != text) {
        std::abort();
      }
    } catch (const torchtpu::ValueError&) {
      if (torchtpu::is_valid_utf8(text)) std::abort();
    }
  } else {
    try {
      const std::string text = tok.decode(torchtpu::fuzz::ids_of(data, size), (mode & 2) != 0);
      if (!torchtpu::is_valid_utf8(text)) std::abort();
    } catch (const torchtpu::ValueError&) {
    }
  }
  return 0;
}
