// OpenAI's speech to text (POST /v1/audio/transcriptions and /v1/audio/translations), which vLLM
// serves for audio language models: one uploaded clip becomes a chat request holding it after
// vLLM's fixed instruction ("Transcribe this audio into English:"), run on the chat path with
// thinking off, and the answer comes back as {"text"}, as plain text, or streamed as
// transcript.text.delta events. A clip longer than a prompt holds (30 s) is cut into pieces at
// quiet moments, each transcribed as a request of its own (side by side in the batch), and the
// transcript is theirs in order. No HTTP here: the server hands over the form's parts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "server/wire.h"

namespace torchtpu::server {

// One part of a multipart/form-data body: its value (a file's bytes) and, for a file, its name.
struct FormPart {
  std::string content;
  std::string filename;
};
using FormParts = std::multimap<std::string, FormPart>;

// The longest clip transcribed, in pieces of at most kPieceSeconds.
constexpr double kMaxClipSeconds = 600;
constexpr double kPieceSeconds = 30;

struct TranscriptionRequest {
  std::vector<GenerationRequest> pieces;  // one per piece of the clip, in order
  bool text = false;                      // response_format "text": the text alone, text/plain
  bool stream = false;
};

// The clip as pieces a prompt holds: itself when it lasts at most kPieceSeconds, else 16-bit PCM
// WAV files at its rate, each ending at the quietest 100 ms of its last 10 s (and leaving at
// least 1 s after it). ValueError for bytes that are no WAV or MP3 clip, or one longer than
// kMaxClipSeconds.
std::vector<std::string> split_clip(const std::string& bytes);

// `translate`: /v1/audio/translations (into English; no `language`). ApiError 400 naming the
// form field for anything missing, malformed or unsupported (segment timestamps, subtitles).
TranscriptionRequest parse_transcription_request(const FormParts& form, bool translate);

// An error about a chat field the form's fields became, renamed to the form field ("file" for
// the clip's part); others as they are.
ApiError as_transcription_error(const ApiError& error);

// One transcript, whole ({"text", "usage"}) or as server-sent events.
class TranscriptionRenderer : public Renderer {
 public:
  explicit TranscriptionRenderer(bool stream) : stream_(stream) {}
  std::string start() override { return ""; }
  std::string add(const OutputDelta& delta) override;
  std::string finish(const GenerationOutcome& outcome) override;
  std::string error(const ApiError& error) override;
  ojson body() const override { return body_; }

 private:
  bool stream_;
  std::string text_;
  ojson body_;
};

}  // namespace torchtpu::server
