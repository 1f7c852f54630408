#include "server/transcription.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "common/base64.h"
#include "common/errors.h"
#include "media/audio.h"
#include "media/kinds.h"

namespace torchtpu::server {
namespace {

// ISO-639-1 codes a client may give as `language`, with the English name the instruction says
// (vLLM's way for Gemma 3n: "Transcribe this audio into French:").
constexpr std::array<std::pair<const char*, const char*>, 58> kLanguages = {{
    {"af", "Afrikaans"},  {"ar", "Arabic"},     {"bg", "Bulgarian"},  {"bn", "Bengali"},
    {"ca", "Catalan"},    {"cs", "Czech"},      {"cy", "Welsh"},      {"da", "Danish"},
    {"de", "German"},     {"el", "Greek"},      {"en", "English"},    {"es", "Spanish"},
    {"et", "Estonian"},   {"fa", "Persian"},    {"fi", "Finnish"},    {"fr", "French"},
    {"gl", "Galician"},   {"gu", "Gujarati"},   {"he", "Hebrew"},     {"hi", "Hindi"},
    {"hr", "Croatian"},   {"hu", "Hungarian"},  {"hy", "Armenian"},   {"id", "Indonesian"},
    {"is", "Icelandic"},  {"it", "Italian"},    {"ja", "Japanese"},   {"ka", "Georgian"},
    {"kk", "Kazakh"},     {"kn", "Kannada"},    {"ko", "Korean"},     {"lt", "Lithuanian"},
    {"lv", "Latvian"},    {"mk", "Macedonian"}, {"ml", "Malayalam"},  {"mr", "Marathi"},
    {"ms", "Malay"},      {"nl", "Dutch"},      {"no", "Norwegian"},  {"pa", "Punjabi"},
    {"pl", "Polish"},     {"pt", "Portuguese"}, {"ro", "Romanian"},   {"ru", "Russian"},
    {"sk", "Slovak"},     {"sl", "Slovenian"},  {"sr", "Serbian"},    {"sv", "Swedish"},
    {"sw", "Swahili"},    {"ta", "Tamil"},      {"te", "Telugu"},     {"th", "Thai"},
    {"tl", "Tagalog"},    {"tr", "Turkish"},    {"uk", "Ukrainian"},  {"ur", "Urdu"},
    {"vi", "Vietnamese"}, {"zh", "Chinese"},
}};

// The one value of a form field; none when absent. 400 when it is given twice.
const FormPart* single(const FormParts& form, const std::string& name) {
  const auto [first, last] = form.equal_range(name);
  if (first == last) return nullptr;
  if (std::next(first) != last) {
    throw invalid(name, "is given more than once");
  }
  return &first->second;
}

double number(const FormPart& part, const std::string& name) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(part.content, &end);
  } catch (const std::logic_error&) {
    end = 0;
  }
  if (end == 0 || end != part.content.size() || !std::isfinite(value)) {
    throw ApiError(400, "'" + name + "' must be a number, got \"" + part.content + "\"",
                   "invalid_request_error", name, "invalid_type");
  }
  return value;
}

int64_t whole_number(const FormPart& part, const std::string& name) {
  const double value = number(part, name);
  if (value != std::floor(value) || std::abs(value) > 1e15) {
    throw ApiError(400, "'" + name + "' must be an integer, got \"" + part.content + "\"",
                   "invalid_request_error", name, "invalid_type");
  }
  return static_cast<int64_t>(value);
}

// "wav" or "mp3", from the file's first bytes (the formats the audio path reads).
std::string audio_format(const FormPart& file) {
  const std::string_view type = sniff_media_type(MediaKind::kAudio, file.content);
  if (type == "audio/wav") return "wav";
  if (type == "audio/mpeg") return "mp3";
  throw ApiError(400,
                 "'file'" + (file.filename.empty() ? "" : " (" + file.filename + ")") +
                     " is neither a WAV nor an MP3 file, the formats this server reads",
                 "invalid_request_error", "file", "invalid_audio");
}

// Mono 16-bit PCM WAV bytes of samples [0, n) in [-1, 1] at `rate`.
std::string pcm16_wav(const float* samples, int64_t n, int64_t rate) {
  std::string out;
  auto u32 = [&](uint32_t v) {
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>(v >> (8 * b) & 0xFF));
  };
  auto u16 = [&](uint16_t v) {
    for (int b = 0; b < 2; ++b) out.push_back(static_cast<char>(v >> (8 * b) & 0xFF));
  };
  const auto data = static_cast<uint32_t>(n * 2);
  out += "RIFF";
  u32(36 + data);
  out += "WAVEfmt ";
  u32(16);
  u16(1);  // PCM
  u16(1);  // mono
  u32(static_cast<uint32_t>(rate));
  u32(static_cast<uint32_t>(rate * 2));
  u16(2);
  u16(16);
  out += "data";
  u32(data);
  // 2^15 per unit, as decode_wav reads 16-bit samples: a 16-bit clip's pieces hold its samples.
  for (int64_t i = 0; i < n; ++i) {
    const long level = std::clamp(std::lround(samples[i] * 32768.0f), -32768L, 32767L);
    u16(static_cast<uint16_t>(static_cast<int16_t>(level)));
  }
  return out;
}

}  // namespace

std::vector<std::string> split_clip(const std::string& bytes) {
  const Waveform clip = decode_audio(bytes, kMaxClipSeconds);
  const int64_t rate = clip.sample_rate;
  const auto samples = clip.samples.contiguous();
  const int64_t n = samples.numel();
  // 10 ms short of the limit: resampled to the extractor's rate, a piece stays within it.
  const int64_t piece = static_cast<int64_t>(kPieceSeconds * rate) - rate / 100;
  if (n <= piece) return {bytes};
  const float* x = samples.data_ptr<float>();
  const int64_t window = std::max<int64_t>(1, rate / 10);
  std::vector<std::string> out;
  int64_t start = 0;
  while (n - start > piece) {
    const int64_t last = std::min(start + piece, n - rate);  // at least 1 s left after the cut
    int64_t cut = last;
    double quietest = std::numeric_limits<double>::infinity();
    for (int64_t at = std::max(start + rate, last - 10 * rate); at + window <= last;
         at += window / 2 + 1) {
      double energy = 0;
      for (int64_t i = at; i < at + window; ++i) energy += static_cast<double>(x[i]) * x[i];
      if (energy < quietest) {
        quietest = energy;
        cut = at + window / 2;
      }
    }
    out.push_back(pcm16_wav(x + start, cut - start, rate));
    start = cut;
  }
  out.push_back(pcm16_wav(x + start, n - start, rate));
  return out;
}

TranscriptionRequest parse_transcription_request(const FormParts& form, bool translate) {
  const FormPart* file = single(form, "file");
  if (!file) throw missing("file");
  ojson chat = {{"messages", ojson::array()},
                // Thinking is off: a thought before the transcript is not the transcript.
                {"chat_template_kwargs", {{"enable_thinking", false}}}};
  if (const FormPart* model = single(form, "model")) chat["model"] = model->content;

  std::string instruction = translate ? "Translate this audio" : "Transcribe this audio";
  if (translate) {
    instruction += " into English";  // OpenAI's translations are into English
  } else if (const FormPart* language = single(form, "language")) {
    const auto named = std::find_if(kLanguages.begin(), kLanguages.end(),
                                    [&](const auto& l) { return language->content == l.first; });
    if (named == kLanguages.end()) {
      std::string codes;
      for (const auto& [code, name] : kLanguages) {
        codes += (codes.empty() ? "" : ", ") + std::string(code);
      }
      throw unsupported("language", "must be an ISO-639-1 code this server names (" + codes +
                                        "), got \"" + language->content + "\"");
    }
    instruction += " into " + std::string(named->second);
  }
  // OpenAI's `prompt` guides the style or carries the text before the clip: a system turn.
  if (const FormPart* prompt = single(form, "prompt"); prompt && !prompt->content.empty()) {
    chat["messages"].push_back({{"role", "system"}, {"content", prompt->content}});
  }
  TranscriptionRequest out;
  const FormPart* format = single(form, "response_format");
  const std::string response_format = format ? format->content : "json";
  if (response_format == "srt" || response_format == "vtt" ||
      response_format == "verbose_json" || response_format == "diarized_json") {
    throw unsupported("response_format",
                      "\"" + response_format + "\" needs segment timestamps, which this model "
                      "does not give: use \"json\" or \"text\"");
  }
  if (response_format != "json" && response_format != "text") {
    throw invalid("response_format", "must be \"json\" or \"text\", got \"" + response_format +
                                         "\"");
  }
  out.text = response_format == "text";
  for (const char* name : {"timestamp_granularities[]", "timestamp_granularities"}) {
    if (form.count(name)) {
      throw unsupported(name, "needs segment or word timestamps, which this model does not give");
    }
  }
  if (const FormPart* stream = single(form, "stream")) {
    if (stream->content != "true" && stream->content != "false") {
      throw ApiError(400, "'stream' must be true or false, got \"" + stream->content + "\"",
                     "invalid_request_error", "stream", "invalid_type");
    }
    chat["stream"] = stream->content == "true";
  }
  if (const FormPart* temperature = single(form, "temperature")) {
    chat["temperature"] = number(*temperature, "temperature");
  }
  // vLLM's extensions: a cap on the transcript's tokens.
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (const FormPart* cap = single(form, name)) chat[name] = whole_number(*cap, name);
  }
  // Decoded last, once every field is known good.
  const std::string clip_format = audio_format(*file);
  std::vector<std::string> pieces;
  try {
    pieces = split_clip(file->content);
  } catch (const ValueError& e) {
    throw ApiError(400, "'file' is not a readable WAV or MP3 file: " + std::string(e.what()),
                   "invalid_request_error", "file", "invalid_audio");
  }
  const ojson turns = chat["messages"];  // the system turn, if any

  for (const auto& piece : pieces) {
    chat["messages"] = turns;
    chat["messages"].push_back(
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", instruction + ":"}},
           {{"type", "input_audio"},
            {"input_audio",
             {{"data", encode_base64(piece)},
              {"format", pieces.size() == 1 ? clip_format : "wav"}}}}}}});
    try {
      out.pieces.push_back(parse_chat_request(chat));
    } catch (const ApiError& e) {
      throw as_transcription_error(e);
    }
  }
  out.stream = out.pieces.front().stream;
  return out;
}

ApiError as_transcription_error(const ApiError& error) {
  // The clip is the last part of the last message: the user turn, after a system turn or not.
  return renamed(error, {{"messages[0].content[1].input_audio.data", "file"},
                         {"messages[1].content[1].input_audio.data", "file"},
                         {"messages[0].content[1].input_audio", "file"},
                         {"messages[1].content[1].input_audio", "file"}});
}

std::string TranscriptionRenderer::add(const OutputDelta& delta) {
  if (delta.content.empty()) return "";
  text_ += delta.content;
  if (!stream_) return "";
  return sse_event("transcript.text.delta",
                   {{"type", "transcript.text.delta"}, {"delta", delta.content}});
}

std::string TranscriptionRenderer::finish(const GenerationOutcome& outcome) {
  const ojson usage = {{"type", "tokens"},
                       {"input_tokens", outcome.prompt_tokens},
                       {"output_tokens", outcome.completion_tokens},
                       {"total_tokens", outcome.prompt_tokens + outcome.completion_tokens}};
  body_ = {{"text", text_}, {"usage", usage}};
  if (!stream_) return "";
  return sse_event("transcript.text.done",
                   {{"type", "transcript.text.done"}, {"text", text_}, {"usage", usage}});
}

std::string TranscriptionRenderer::error(const ApiError& error) {
  return sse_event("error", error_body(error));
}

}  // namespace torchtpu::server
