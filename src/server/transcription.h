// OpenAI's speech to text (POST /v1/audio/transcriptions and /v1/audio/translations), which vLLM
// serves for audio language models: one uploaded clip becomes a chat request holding it after
// vLLM's fixed instruction ("Transcribe this audio into English:"), run on the chat path with
// thinking off, and the answer comes back as {"text"}, as plain text, or streamed as
// transcript.text.delta events. No HTTP here: the server hands over the form's parts.
#pragma once

#include <map>
#include <string>

#include "server/wire.h"

namespace torchtpu::server {

// One part of a multipart/form-data body: its value (a file's bytes) and, for a file, its name.
struct FormPart {
  std::string content;
  std::string filename;
};
using FormParts = std::multimap<std::string, FormPart>;

struct TranscriptionRequest {
  GenerationRequest generation;
  bool text = false;  // response_format "text": the answer alone, as text/plain
};

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
