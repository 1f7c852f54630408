#include "text/output_parser.h"

#include <algorithm>

#include "common/errors.h"
#include "common/json_depth.h"

namespace torchtpu {

// Arguments keep the order the model wrote their keys in (nlohmann::json would sort them).
using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kChannelName = "thought\n";
constexpr std::string_view kCallOpen = "<|tool_call>";
constexpr std::string_view kCallClose = "<tool_call|>";
constexpr std::string_view kQuote = "<|\"|>";

// How a parse of a call body ended: a value, input that a longer body could still complete, or
// input that no continuation can make valid.
enum class Status { kOk, kIncomplete, kError };

struct ParseResult {
  Status status = Status::kOk;
  std::string message;
};

// Recursive-descent reader of the format_argument syntax.
class CallReader {
 public:
  explicit CallReader(std::string_view s) : s_(s) {}

  ParseResult read_call(ToolCall& call) {
    skip_space();
    if (!take("call:"))
      return fail_or_incomplete("call:", "the call does not start with \"call:\"");
    const size_t brace = s_.find('{', pos_);
    if (brace == std::string_view::npos) return incomplete();
    call.name = trim(s_.substr(pos_, brace - pos_));
    if (call.name.empty()) return error("the call has no function name");
    pos_ = brace;
    if (auto r = read_object(call.arguments); r.status != Status::kOk) return r;
    skip_space();
    if (pos_ != s_.size()) {
      return error("unexpected text after the arguments: \"" + std::string(s_.substr(pos_)) + "\"");
    }
    return {};
  }

 private:
  static std::string trim(std::string_view v) {
    const size_t b = v.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return {};
    const size_t e = v.find_last_not_of(" \t\r\n");
    return std::string(v.substr(b, e - b + 1));
  }
  static ParseResult incomplete() { return {Status::kIncomplete, "the call ends too early"}; }
  static ParseResult error(std::string message) { return {Status::kError, std::move(message)}; }

  // `expected` at the current position: consumed; a prefix of it at the end: incomplete.
  ParseResult fail_or_incomplete(std::string_view expected, std::string message) const {
    const std::string_view rest = s_.substr(pos_);
    if (rest.size() < expected.size() && expected.substr(0, rest.size()) == rest) {
      return incomplete();
    }
    return error(std::move(message));
  }
  bool take(std::string_view token) {
    if (s_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  void skip_space() {
    while (pos_ < s_.size() &&
           std::string_view(" \t\r\n").find(s_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
  }

  // A string runs to the first delimiter that is followed (after blanks) by what may follow a
  // value or key, so a delimiter inside the text followed by other characters stays text.
  ParseResult read_quoted(std::string& out) {
    size_t search = pos_;
    while (true) {
      const size_t hit = s_.find(kQuote, search);
      if (hit == std::string_view::npos) return incomplete();
      size_t after = hit + kQuote.size();
      while (after < s_.size() &&
             std::string_view(" \t\r\n").find(s_[after]) != std::string_view::npos) {
        ++after;
      }
      if (after == s_.size() ||
          std::string_view(",}]:").find(s_[after]) != std::string_view::npos) {
        out = std::string(s_.substr(pos_, hit - pos_));
        pos_ = hit + kQuote.size();
        return {};
      }
      search = hit + 1;
    }
  }

  ParseResult read_key(std::string& key) {
    skip_space();
    if (take(kQuote)) return read_quoted(key);
    const size_t colon = s_.find_first_of(":{}[],", pos_);
    if (colon == std::string_view::npos) return incomplete();
    if (s_[colon] != ':')
      return error("expected \"key:\" at \"" + std::string(s_.substr(pos_)) + "\"");
    key = trim(s_.substr(pos_, colon - pos_));
    if (key.empty()) return error("an argument has an empty key");
    pos_ = colon;
    return {};
  }

  ParseResult read_object(json& out) {
    out = json::object();
    ++pos_;  // '{'
    skip_space();
    if (pos_ == s_.size()) return incomplete();
    if (take("}")) return {};
    while (true) {
      std::string key;
      if (auto r = read_key(key); r.status != Status::kOk) return r;
      skip_space();
      if (pos_ == s_.size()) return incomplete();
      if (!take(":")) return error("expected ':' after key \"" + key + "\"");
      json value;
      if (auto r = read_value(value); r.status != Status::kOk) return r;
      out[key] = std::move(value);
      skip_space();
      if (pos_ == s_.size()) return incomplete();
      if (take("}")) return {};
      if (!take(",")) return error("expected ',' or '}' after the value of \"" + key + "\"");
    }
  }

  ParseResult read_array(json& out) {
    out = json::array();
    ++pos_;  // '['
    skip_space();
    if (pos_ == s_.size()) return incomplete();
    if (take("]")) return {};
    while (true) {
      json value;
      if (auto r = read_value(value); r.status != Status::kOk) return r;
      out.push_back(std::move(value));
      skip_space();
      if (pos_ == s_.size()) return incomplete();
      if (take("]")) return {};
      if (!take(",")) return error("expected ',' or ']' in a list");
    }
  }

  ParseResult read_value(json& out) {
    skip_space();
    if (pos_ == s_.size()) return incomplete();
    if (s_[pos_] == '{' || s_[pos_] == '[') {
      // Each level is a few stack frames here and in everything that walks the arguments later;
      // output nested a hundred thousand deep would overflow the stack of the engine's thread.
      if (depth_ == kMaxJsonDepth) {
        return error("the arguments nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      ++depth_;
      const ParseResult r = s_[pos_] == '{' ? read_object(out) : read_array(out);
      --depth_;
      return r;
    }
    if (take(kQuote)) {
      std::string text;
      auto r = read_quoted(text);
      out = std::move(text);
      return r;
    }
    // Numbers, true, false and null are written bare; anything else bare is kept as text.
    const size_t end = s_.find_first_of(",}]", pos_);
    if (end == std::string_view::npos) return incomplete();
    const std::string token = trim(s_.substr(pos_, end - pos_));
    if (token.empty()) return error("an argument has no value");
    pos_ = end;
    out = json::parse(token, nullptr, /*allow_exceptions=*/false);
    if (out.is_discarded() || out.is_structured() || out.is_string()) out = token;
    return {};
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;  // arrays and objects open inside the arguments object
};

ParseResult read_call(std::string_view body, ToolCall& call) {
  return CallReader(body).read_call(call);
}

// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
size_t partial_marker_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t longest = 0;
  for (std::string_view m : markers) {
    for (size_t k = std::min(s.size(), m.size() - 1); k > longest; --k) {
      if (s.substr(s.size() - k) == m.substr(0, k)) {
        longest = k;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

ToolCall parse_tool_call(std::string_view body) {
  ToolCall call;
  const ParseResult r = read_call(body, call);
  if (r.status != Status::kOk) {
    throw ValueError("tool call \"" + std::string(body) + "\": " + r.message);
  }
  return call;
}

void OutputParser::step(OutputDelta& out) {
  while (true) {
    switch (mode_) {
      case Mode::kContent: {
        const size_t channel = pending_.find(kChannelOpen);
        const size_t call = pending_.find(kCallOpen);
        const size_t hit = std::min(channel, call);
        if (hit == std::string::npos) {
          const size_t keep = partial_marker_suffix(pending_, {kChannelOpen, kCallOpen});
          out.content.append(pending_, 0, pending_.size() - keep);
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        out.content.append(pending_, 0, hit);
        const bool is_call = hit == call;
        pending_.erase(0, hit + (is_call ? kCallOpen : kChannelOpen).size());
        mode_ = is_call ? Mode::kCall : Mode::kChannelHeader;
        call_search_ = 0;
        break;
      }
      case Mode::kChannelHeader:
        if (pending_.starts_with(kChannelName)) {
          pending_.erase(0, kChannelName.size());
        } else if (kChannelName.starts_with(pending_)) {
          return;  // not enough text yet to tell
        }
        mode_ = Mode::kReasoning;
        break;
      case Mode::kReasoning: {
        const size_t hit = pending_.find(kChannelClose);
        if (hit == std::string::npos) {
          const size_t keep = partial_marker_suffix(pending_, {"\n<channel|>", kChannelClose});
          out.reasoning.append(pending_, 0, pending_.size() - keep);
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        // The template writes "\n<channel|>" after the reasoning; that newline is not part of it.
        const size_t end = (hit > 0 && pending_[hit - 1] == '\n') ? hit - 1 : hit;
        out.reasoning.append(pending_, 0, end);
        pending_.erase(0, hit + kChannelClose.size());
        mode_ = Mode::kContent;
        break;
      }
      case Mode::kCall: {
        const size_t hit = pending_.find(kCallClose, call_search_);
        if (hit == std::string::npos) {
          call_search_ =
              pending_.size() >= kCallClose.size() ? pending_.size() - kCallClose.size() + 1 : 0;
          return;
        }
        ToolCall call;
        const ParseResult r = read_call(std::string_view(pending_).substr(0, hit), call);
        if (r.status == Status::kIncomplete) {
          // The marker is inside a string or an open bracket: it is argument text.
          call_search_ = hit + 1;
          break;
        }
        std::string text =
            std::string(kCallOpen) + pending_.substr(0, hit) + std::string(kCallClose);
        if (r.status == Status::kOk) {
          call.text = std::move(text);
          out.tool_calls.push_back(std::move(call));
        } else {
          raw_unparsed_ += text;
        }
        pending_.erase(0, hit + kCallClose.size());
        mode_ = Mode::kContent;
        break;
      }
    }
  }
}

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta out;
  pending_ += text;
  step(out);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  step(out);
  switch (mode_) {
    case Mode::kContent: out.content += pending_; break;
    case Mode::kChannelHeader:
    case Mode::kReasoning: out.reasoning += pending_; break;
    case Mode::kCall:
      cut_off_call_ = true;
      raw_unparsed_ += std::string(kCallOpen) + pending_;
      break;
  }
  pending_.clear();
  mode_ = Mode::kContent;
  call_search_ = 0;
  return out;
}

}  // namespace torchtpu
