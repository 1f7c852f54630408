// OpenAI `stop` sequences applied to streamed text: text that could still be the start of a stop
// sequence is held back, and once one completes, the text before it is released and the rest, the
// sequence included, never reaches the client.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace torchtpu::server {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);

  // The text now safe to send. After a stop sequence completed, stopped() is true and every later
  // push returns nothing. `opaque` text (a special token's, such as <|tool_call>) passes whole
  // with what was held before it: no stop sequence matches inside it or across it.
  std::string push(std::string_view text, bool opaque = false);
  // The text held back at the end of the stream (no stop sequence completed).
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop sequence that completed (the earliest in the text), "" while none has.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace torchtpu::server
