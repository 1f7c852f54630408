#include "text/detokenizer.h"

#include "common/errors.h"

namespace torchtpu {

namespace {

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";

// Largest cut <= `cut` that does not fall inside a UTF-8 character of `s`.
size_t char_boundary(const std::string& s, size_t cut, size_t floor) {
  while (cut > floor && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return cut;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

}  // namespace

Detokenizer::Detokenizer(const Tokenizer& tok, bool show_special_tokens)
    : tok_(tok), show_special_tokens_(show_special_tokens) {
  bool fused = false;
  for (const DecoderStep& step : tok.decoder_steps()) {
    if (fused && step.kind == DecoderStep::Kind::kByteFallback) {
      throw FormatError("tokenizer decoder: ByteFallback after Fuse cannot be streamed");
    }
    stages_.push_back(Stage{step, fused});
    if (step.kind == DecoderStep::Kind::kFuse) fused = true;
  }
}

void Detokenizer::reset() {
  first_token_ = true;
  for (Stage& s : stages_) s = Stage{s.step, s.after_fuse};
}

std::vector<std::string> Detokenizer::feed(Stage& stage, std::vector<std::string> in) {
  const DecoderStep& step = stage.step;
  using Kind = DecoderStep::Kind;
  if (!stage.after_fuse) {
    // Before Fuse every token is decoded on its own, except runs of byte tokens.
    switch (step.kind) {
      case Kind::kReplace:
        for (std::string& t : in) replace_all(t, step.pattern, step.content);
        return in;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        for (std::string& t : in) {
          if (auto b = byte_fallback_value(t)) {
            stage.bytes.push_back(static_cast<char>(*b));
          } else {
            for (std::string& f : flush(stage)) out.push_back(std::move(f));
            out.push_back(std::move(t));
          }
        }
        return out;
      }
      case Kind::kFuse: return in;
      case Kind::kStrip:
        for (std::string& t : in) strip(step, t);
        return in;
    }
  }
  // After Fuse the pieces are consecutive parts of one string.
  std::string text = stage.tail + joined(in);
  stage.tail.clear();
  switch (step.kind) {
    case Kind::kReplace: {
      std::string out;
      size_t pos = 0;
      size_t hit;
      while (!step.pattern.empty() && (hit = text.find(step.pattern, pos)) != std::string::npos) {
        out.append(text, pos, hit - pos);
        out += step.content;
        pos = hit + step.pattern.size();
      }
      // Hold back what could still be the start of the pattern.
      const size_t keep =
          step.pattern.empty() ? 0 : std::min(step.pattern.size() - 1, text.size() - pos);
      const size_t cut = char_boundary(text, text.size() - keep, pos);
      out.append(text, pos, cut - pos);
      stage.tail = text.substr(cut);
      return {out};
    }
    case Kind::kStrip: {
      size_t begin = 0;
      while (!stage.start_done && begin < text.size()) {
        if (stage.start_seen >= step.start ||
            text.compare(begin, step.content.size(), step.content) != 0) {
          stage.start_done = true;
          break;
        }
        ++stage.start_seen;
        begin += step.content.size();
      }
      if (!stage.start_done && stage.start_seen >= step.start) stage.start_done = true;
      // Hold back the trailing `content` characters that the end of the stream may strip.
      size_t end = text.size();
      for (int64_t k = 0;
           k < step.stop && end >= begin + step.content.size() &&
           text.compare(end - step.content.size(), step.content.size(), step.content) == 0;
           ++k) {
        end -= step.content.size();
      }
      stage.tail = text.substr(end);
      return {text.substr(begin, end - begin)};
    }
    case Kind::kFuse: return {text};
    case Kind::kByteFallback: break;
  }
  return {text};
}

std::vector<std::string> Detokenizer::flush(Stage& stage) {
  std::vector<std::string> out;
  if (!stage.bytes.empty()) {
    if (is_valid_utf8(stage.bytes)) {
      out.push_back(stage.bytes);
    } else {
      for (size_t i = 0; i < stage.bytes.size(); ++i) out.emplace_back(kReplacementChar);
    }
    stage.bytes.clear();
  }
  if (stage.after_fuse && stage.step.kind == DecoderStep::Kind::kReplace && !stage.tail.empty()) {
    out.push_back(stage.tail);  // shorter than the pattern: no match left in it
  }
  stage.tail.clear();  // Strip: the trailing characters the end of the string removes
  return out;
}

std::string Detokenizer::run(size_t first_stage, std::vector<std::string> tokens) {
  for (size_t i = first_stage; i < stages_.size(); ++i)
    tokens = feed(stages_[i], std::move(tokens));
  return joined(tokens);
}

std::string Detokenizer::push(int64_t id) {
  const std::string& piece = tok_.id_to_token(id);
  if (!show_special_tokens_ && tok_.is_special(id)) return {};
  if (!tok_.has_decoder()) {
    // tokenizers joins the tokens with spaces when there is no decoder.
    std::string out = first_token_ ? piece : " " + piece;
    first_token_ = false;
    return out;
  }
  return run(0, {piece});
}

std::string Detokenizer::finish() {
  std::string out;
  for (size_t i = 0; i < stages_.size(); ++i) out += run(i + 1, flush(stages_[i]));
  reset();
  return out;
}

}  // namespace torchtpu
