// A Hugging Face tokenizer.json read natively: the BPE model (merges, byte fallback, unk), the
// added tokens matched before BPE, the normalizer, pre-tokenizer, decoder and the BOS of the
// post-processor. Encoding and decoding reproduce the `tokenizers` library exactly for the
// component types listed below; any other type in the file is a FormatError naming it.
//
// Supported: normalizer Replace (string pattern) or a Sequence of them, or null; pre_tokenizer
// Split (string pattern, any behavior, invert false) or a Sequence of them, or null; model BPE;
// decoder Replace (string pattern), ByteFallback, Fuse, Strip, or a Sequence of them;
// post_processor TemplateProcessing (single sequence) or null.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchtpu {

namespace text_detail {
struct TokenizerModel;
}

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);
// The byte a "<0xNN>" token stands for, as tokenizers' ByteFallback decoder reads it.
std::optional<uint8_t> byte_fallback_value(std::string_view token);
// Every occurrence of `pattern` in `s` replaced, left to right (tokenizers' Replace).
void replace_all(std::string& s, std::string_view pattern, std::string_view content);

// One step of the decoder chain. tokenizers applies the steps in order to the list of token
// strings and joins the result; Fuse joins them early, so later steps see one string.
struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip };
  Kind kind;
  std::string pattern;  // kReplace: replaced by `content`
  std::string content;  // kReplace: replacement; kStrip: the one character stripped
  int64_t start = 0;    // kStrip: at most this many leading `content` characters removed
  int64_t stop = 0;     // kStrip: at most this many trailing ones
};

// Applies a kStrip step to one token string, as tokenizers' Strip decoder does.
void strip(const DecoderStep& step, std::string& token);

class Tokenizer {
 public:
  // Reads and validates tokenizer.json. FormatError (naming the file and the field) on anything
  // malformed or unsupported; NotFoundError if the file does not exist.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Same, from the JSON text; `origin` names the source in error messages.
  static Tokenizer from_json_string(std::string_view json_text, const std::string& origin);

  // Token ids of `text` (valid UTF-8, else ValueError). With add_special_tokens the
  // post-processor's template is applied (for Gemma: a leading <bos>). Chat-template output
  // already starts with <bos>, so prompts are encoded with add_special_tokens=false.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Text of `ids` as tokenizers' decode() gives it. ValueError for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // One past the largest id of the model vocabulary and the added tokens (HF's len(tokenizer)).
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token's string (added-token content or model piece). ValueError if the id is unknown.
  const std::string& id_to_token(int64_t id) const;
  // The bytes the token stands for in output text: a byte-fallback piece's byte ("<0xF0>" ->
  // "\xF0"), a piece through the decoder's Replace steps ("▁" -> " "), an added token's content.
  // Unlike decode({id}), a byte that is not a whole UTF-8 character stays itself, so a run of
  // tokens' bytes joined is their text. ValueError if the id is unknown.
  std::string token_bytes(int64_t id) const;
  // True for added tokens marked "special" (skipped by decode(skip_special_tokens=true)).
  bool is_special(int64_t id) const;
  // Ids the post-processor puts before the text when add_special_tokens is true.
  const std::vector<int64_t>& prefix_special_ids() const;

  // The decoder chain; empty with `has_decoder()` false means tokens are joined with spaces.
  const std::vector<DecoderStep>& decoder_steps() const;
  bool has_decoder() const;

 private:
  explicit Tokenizer(std::shared_ptr<text_detail::TokenizerModel> model);
  // Shared and immutable apart from the internally synchronised word cache, so copies are cheap
  // and one tokenizer may be used from several threads.
  std::shared_ptr<text_detail::TokenizerModel> model_;
};

// The tokenizer at `path` (a checkpoint's tokenizer.json) for a model of `vocab` embeddings
// (config.json's vocab_size): Tokenizer::from_file's errors, and FormatError when it gives ids
// past them, which a text prompt would hold and the model could not read. Read so where a
// checkpoint's tokenizer meets its model, so the mismatch is named instead of the first prompt's
// out-of-range id.
Tokenizer model_tokenizer(const std::string& path, int64_t vocab);

}  // namespace torchtpu
