#include "server/mcp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <list>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "build_info.h"
#include "common/base64.h"
#include "common/errors.h"
#include "common/json_type.h"
#include "server/connection.h"
#include "server/openai.h"

namespace torchtpu::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kLatestVersion = "2025-11-25";
const std::set<std::string> kVersions = {"2025-06-18", "2025-11-25"};

// JSON-RPC error codes.
constexpr int kParseError = -32700;
constexpr int kInvalidRequest = -32600;
constexpr int kMethodNotFound = -32601;
constexpr int kInvalidParams = -32602;
constexpr int kInternalError = -32603;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

ojson rpc_error(const ojson& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

struct RpcError : std::runtime_error {
  int code;
  RpcError(int code, const std::string& message) : std::runtime_error(message), code(code) {}
};

// A tool that could not do its work: reported to the model as a result with isError true.
struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

ojson text_result(const std::string& text, std::optional<ojson> structured = {}) {
  ojson result = {{"content", {{{"type", "text"}, {"text", text}}}}, {"isError", false}};
  if (structured) result["structuredContent"] = std::move(*structured);
  return result;
}

class ServerClient {
 public:
  explicit ServerClient(const McpTarget& target)
      : url_(origin_of(target.base_url)),
        base_(split_base_url(url_)),
        authorization_(target.authorization) {}

  const std::string& url() const { return url_; }
  // Where the server's routes sit: url_ cut for httplib::Client, the path put before each.
  const std::string& route_prefix() const { return base_.path; }

  httplib::Headers headers() const {
    httplib::Headers h;
    if (!authorization_.empty()) h.emplace("Authorization", authorization_);
    return h;
  }

  std::unique_ptr<httplib::Client> client(int read_timeout_s) const {
    auto c = std::make_unique<httplib::Client>(base_.origin);
    if (!c->is_valid()) throw ToolError("the server URL " + url_ + " is not an http:// URL");
    c->set_connection_timeout(5);
    c->set_read_timeout(read_timeout_s);
    return c;
  }

  httplib::Response get(const std::string& path, int read_timeout_s = 30) const {
    auto result = client(read_timeout_s)->Get(base_.path + path, headers());
    if (!result) throw unreachable(path, result.error());
    return *result;
  }

  ToolError unreachable(const std::string& path, httplib::Error error) const {
    return ToolError("cannot reach " + url_ + path + ": " + describe(error));
  }

  // The server's own error message for a failed request; `explain`, when given, rewrites it
  // from the message and the error's param (the request field it names).
  ToolError refused(const std::string& path, const httplib::Response& res,
                    const std::function<std::string(const std::string&, const std::string&)>&
                        explain = {}) const {
    std::string message = res.body;
    std::string param;
    try {
      const ojson error = ojson::parse(res.body).at("error");
      message = error.at("message").get<std::string>();
      if (error.contains("param") && error["param"].is_string()) {
        param = error["param"].get<std::string>();
      }
    } catch (const std::exception&) {
    }
    if (explain) message = explain(message, param);
    return ToolError(url_ + path + " answered HTTP " + std::to_string(res.status) + ": " + message);
  }

 private:
  std::string url_;
  BaseUrl base_;
  std::string authorization_;
};

// Media files for ask and stream ---------------------------------------------------------------

// One file an `images` or `audio` argument named, read.
struct MediaFile {
  MediaKind kind = MediaKind::kImage;
  std::string label;  // 'images[0]' (cat.png): how errors name it
  std::string mime;
  std::string bytes;
};

// `path` is `dir` or lies below it (both absolute and lexically normal, no trailing '/').
bool inside(const std::string& path, const std::string& dir) {
  if (dir == "/") return !path.empty() && path[0] == '/';
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads the file `path` names, as `files` allows. ToolError naming the argument and the path for
// a path that is refused, missing, unreadable, not a regular file, larger than its limit, or not
// of its kind.
MediaFile read_media_file(const McpFiles& files, MediaKind kind, const std::string& arg,
                          const std::string& path) {
  const bool image = kind == MediaKind::kImage;
  MediaFile file{kind, "'" + arg + "' (" + path + ")", "", ""};
  if (path.empty()) throw ToolError("'" + arg + "' is empty; name a file");
  // The system calls would read the path only up to the NUL: refused, not cut short.
  if (path.find('\0') != std::string::npos) {
    throw ToolError("'" + arg + "' holds a NUL character, which no file path has");
  }
  if (files.scope == McpFiles::Scope::kNone) {
    throw ToolError("'" + arg + "' names a file, and " + files.refusal);
  }
  const bool confined = files.scope == McpFiles::Scope::kDirectory;
  const std::string outside =
      file.label +
      " is outside --mcp-media-dir, the one directory this server's MCP tools read "
      "files from (relative paths are read from it)";
  const std::string linked_out =
      file.label +
      " leads out of --mcp-media-dir through a symbolic link; this server's MCP "
      "tools read only files inside it";
  const auto os_error = [&](int error) {
    if (error == ENOENT || error == ENOTDIR) {
      return ToolError(file.label + ": no such file" + (confined ? " in --mcp-media-dir" : ""));
    }
    if (error == ELOOP && confined) return ToolError(linked_out);
    return ToolError(file.label + " cannot be read: " + std::strerror(error));
  };
  std::string open_path = path;
  if (confined) {
    // Lexically first, so that a path outside is refused without a look at the file system (no
    // telling a remote caller which files exist there), then as the file system resolves it.
    const std::filesystem::path given(path);
    const std::string lexical = without_trailing_slash(
        (given.is_absolute() ? given : files.directory / given).lexically_normal().string());
    if (!inside(lexical, files.directory) &&
        !(given.is_absolute() && inside(lexical, files.given))) {
      throw ToolError(outside);
    }
    char resolved[PATH_MAX];
    if (!::realpath(lexical.c_str(), resolved)) throw os_error(errno);
    open_path = resolved;
    if (!inside(open_path, files.directory)) throw ToolError(linked_out);
  }
  Fd fd;
  // O_NONBLOCK: a FIFO is not waited on (fstat refuses it below). Confined, the resolved path has
  // no link left, so one that appears now is refused (O_NOFOLLOW on the last component, the
  // /proc check below for the others).
  fd.fd = ::open(open_path.c_str(),
                 O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (confined ? O_NOFOLLOW : 0));
  if (fd.fd < 0) throw os_error(errno);
  if (confined) {
    char opened[PATH_MAX];
    const std::string proc = "/proc/self/fd/" + std::to_string(fd.fd);
    const ssize_t n = ::readlink(proc.c_str(), opened, sizeof(opened) - 1);
    if (n > 0 && !inside(std::string(opened, static_cast<size_t>(n)), files.directory)) {
      throw ToolError(linked_out);
    }
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw os_error(errno);
  if (S_ISDIR(st.st_mode)) throw ToolError(file.label + " is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw ToolError(file.label + " is not a regular file");
  const int64_t limit = image ? files.max_image_bytes : files.max_audio_bytes;
  const std::string flag = image ? "--max-image-bytes" : "--max-audio-bytes";
  const auto too_large = [&](int64_t size) {
    return ToolError(file.label + " is " + std::to_string(size) + " bytes, more than " + flag +
                     " " + std::to_string(limit));
  };
  if (static_cast<int64_t>(st.st_size) > limit) throw too_large(st.st_size);
  // To the end, but never past the limit: a file that grew since fstat is refused too.
  file.bytes.reserve(static_cast<size_t>(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw os_error(errno);
    if (n == 0) break;
    file.bytes.append(chunk, static_cast<size_t>(n));
    if (static_cast<int64_t>(file.bytes.size()) > limit) {
      throw ToolError(file.label + " grew past " + flag + " " + std::to_string(limit) +
                      " bytes while it was read");
    }
  }
  file.mime = sniff_media_type(kind, file.bytes);
  if (file.mime.empty()) {
    throw ToolError(file.label +
                    (image ? " is not a PNG, JPEG or WebP image" : " is not a WAV or MP3 file"));
  }
  return file;
}

ojson tool_list(const McpFiles& files) {
  // What a path in `images` and `audio` may name, as this MCP server reads files.
  std::string where;
  switch (files.scope) {
    case McpFiles::Scope::kAny:
      where = "Paths on the machine of this MCP server, which runs as the caller's own process.";
      break;
    case McpFiles::Scope::kDirectory:
      where =
          "Paths of files inside the server's media directory (--mcp-media-dir); relative "
          "paths are read from it.";
      break;
    case McpFiles::Scope::kNone:
      where =
          "This MCP server is reached over HTTP and reads no files (its server was not "
          "started with --mcp-media-dir), so any path is refused.";
      break;
  }
  const ojson generation_args = {
      {"type", "object"},
      {"properties",
       {{"prompt", {{"type", "string"}, {"description", "The user message."}}},
        {"system", {{"type", "string"}, {"description", "An optional system prompt."}}},
        {"max_tokens",
         {{"type", "integer"},
          {"minimum", 1},
          {"default", 256},
          {"description", "The most tokens to generate."}}},
        {"temperature",
         {{"type", "number"}, {"minimum", 0}, {"description", "0 (the default) is greedy."}}},
        {"seed", {{"type", "integer"}, {"description", "Seed for sampling."}}},
        {"schema",
         {{"type", "object"},
          {"description",
           "A JSON Schema the answer must follow: the server enforces it while decoding "
           "(response_format json_schema), so the answer is JSON valid for it."}}},
        {"images",
         {{"type", "array"},
          {"items", {{"type", "string"}}},
          {"description",
           std::string("Image files (PNG, JPEG or WebP) the model sees before the prompt, in ") +
               "order. " + where}}},
        {"audio",
         {{"type", "array"},
          {"items", {{"type", "string"}}},
          {"description",
           std::string(
               "WAV or MP3 files the model hears after the images, before the prompt, in ") +
               "order. " + where}}}}},
      {"required", {"prompt"}},
      {"additionalProperties", false}};
  const ojson no_args = {{"type", "object"}, {"additionalProperties", false}};
  auto tool = [](const char* name, const char* title, const char* description, ojson schema,
                 bool read_only) {
    return ojson{{"name", name},
                 {"title", title},
                 {"description", description},
                 {"inputSchema", std::move(schema)},
                 {"annotations", {{"readOnlyHint", read_only}, {"openWorldHint", false}}}};
  };
  return ojson::array(
      {tool("ask", "Ask the model",
            "Sends one chat message to the model and returns its answer, with a footer: model, "
            "finish reason, prompt and completion tokens, prompt read time, decode rate, round "
            "trip. Image and audio files named in images and audio go into the message before the "
            "prompt (images, then audio, then the text).",
            generation_args, false),
       tool("stream", "Ask the model, streamed",
            "Like ask, but streams the answer: one progress notification per chunk.",
            generation_args, false),
       tool("engine_info", "Engine information",
            "The server's /v1/engine report: model, build, torch version, device, dtype, layout, "
            "storage, load and warm-up times.",
            no_args, true),
       tool("endpoint_status", "Endpoint status",
            "The server's URL, its /health answer and latency, and the upstream when it is a "
            "proxy.",
            no_args, true),
       tool("serving_metrics", "Serving metrics",
            "The server's Prometheus /metrics, parsed: requests, tokens, cancellations, queue "
            "depth, time to first token and decode rate histograms.",
            no_args, true)});
}

struct GenerationArgs {
  std::string prompt;
  std::string system;
  int64_t max_tokens = 256;
  std::optional<double> temperature;
  std::optional<int64_t> seed;
  std::optional<ojson> schema;
  std::vector<std::string> images;  // file paths, read by read_media
  std::vector<std::string> audio;
};

GenerationArgs parse_generation_args(const ojson& args) {
  GenerationArgs g;
  for (const auto& [key, value] : args.items()) {
    if (key == "prompt" || key == "system") {
      if (!value.is_string()) throw ToolError("'" + key + "' must be a string");
      (key == "prompt" ? g.prompt : g.system) = value.get<std::string>();
    } else if (key == "max_tokens" || key == "seed") {
      if (const auto overflow = int64_overflow(value, key); !overflow.empty()) {
        throw ToolError(overflow);
      }
      if (!value.is_number_integer()) throw ToolError("'" + key + "' must be an integer");
      if (key == "max_tokens") {
        g.max_tokens = value.get<int64_t>();
        if (g.max_tokens < 1) {
          throw ToolError("'max_tokens' must be at least 1, got " + std::to_string(g.max_tokens));
        }
      } else {
        g.seed = value.get<int64_t>();
      }
    } else if (key == "temperature") {
      if (!value.is_number() || value.get<double>() < 0) {
        throw ToolError("'temperature' must be a number >= 0");
      }
      g.temperature = value.get<double>();
    } else if (key == "schema") {
      if (!value.is_object()) throw ToolError("'schema' must be a JSON Schema object");
      g.schema = value;
    } else if (key == "images" || key == "audio") {
      if (!value.is_array()) {
        throw ToolError("'" + key + "' must be an array of file paths (strings), got " +
                        json_type_name(value));
      }
      auto& paths = key == "images" ? g.images : g.audio;
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string()) {
          throw ToolError("'" + key + "[" + std::to_string(i) + "]' must be a file path (a " +
                          "string), got " + json_type_name(value[i]));
        }
        paths.push_back(value[i].get<std::string>());
      }
    } else {
      throw ToolError("unknown argument '" + key +
                      "' (ask and stream take prompt, system, max_tokens, temperature, seed, "
                      "schema, images, audio)");
    }
  }
  if (g.prompt.empty()) throw ToolError("'prompt' is required and must not be empty");
  return g;
}

// The files of `images` and `audio`, read in that order (the order of their parts).
std::vector<MediaFile> read_media(const GenerationArgs& g, const McpFiles& files) {
  std::vector<MediaFile> media;
  if (g.images.empty() && g.audio.empty()) return media;
  const size_t count = g.images.size() + g.audio.size();
  if (files.scope != McpFiles::Scope::kNone && static_cast<int64_t>(count) > files.max_items) {
    throw ToolError("'images' and 'audio' name " + std::to_string(count) +
                    " files together, more than --max-media " + std::to_string(files.max_items));
  }
  for (size_t i = 0; i < g.images.size(); ++i) {
    media.push_back(read_media_file(files, MediaKind::kImage, "images[" + std::to_string(i) + "]",
                                    g.images[i]));
  }
  for (size_t i = 0; i < g.audio.size(); ++i) {
    media.push_back(
        read_media_file(files, MediaKind::kAudio, "audio[" + std::to_string(i) + "]", g.audio[i]));
  }
  return media;
}

// The user message's index in chat_body's messages.
size_t user_index(const GenerationArgs& g) { return g.system.empty() ? 0 : 1; }

// The server's error message with the request field it names (messages[U].content[K]...) told as
// the tool argument that became that part: 'images[0]' (cat.png) for an image with no vision
// encoder to read it, one over the server's limit, one its decoder cannot read.
std::string explain_media_error(const GenerationArgs& g, const std::vector<MediaFile>& media,
                                const std::string& message, const std::string& param) {
  const std::string prefix = "messages[" + std::to_string(user_index(g)) + "].content[";
  if (param.compare(0, prefix.size(), prefix) != 0) return message;
  const size_t close = param.find(']', prefix.size());
  if (close == std::string::npos) return message;
  size_t k = 0;
  try {
    k = std::stoul(param.substr(prefix.size(), close - prefix.size()));
  } catch (const std::exception&) {
    return message;
  }
  if (k >= media.size()) return message;
  std::string out = message;
  const std::string quoted = "'" + param + "'";
  for (size_t at = out.find(quoted); at != std::string::npos;
       at = out.find(quoted, at + media[k].label.size())) {
    out.replace(at, quoted.size(), media[k].label);
  }
  return out;
}

ojson chat_body(const GenerationArgs& g, const std::vector<MediaFile>& media, bool stream) {
  ojson messages = ojson::array();
  if (!g.system.empty()) messages.push_back({{"role", "system"}, {"content", g.system}});
  if (media.empty()) {
    messages.push_back({{"role", "user"}, {"content", g.prompt}});
  } else {
    // The order `generate --chat` uses: the images, the clips, then the text.
    ojson content = ojson::array();
    for (const MediaFile& m : media) {
      if (m.kind == MediaKind::kImage) {
        content.push_back(
            {{"type", "image_url"},
             {"image_url", {{"url", "data:" + m.mime + ";base64," + encode_base64(m.bytes)}}}});
      } else {
        content.push_back({{"type", "input_audio"},
                           {"input_audio",
                            {{"data", encode_base64(m.bytes)},
                             {"format", m.mime == "audio/mpeg" ? "mp3" : "wav"}}}});
      }
    }
    content.push_back({{"type", "text"}, {"text", g.prompt}});
    messages.push_back({{"role", "user"}, {"content", std::move(content)}});
  }
  ojson body = {{"messages", messages}, {"max_tokens", g.max_tokens}, {"stream", stream}};
  if (g.temperature) body["temperature"] = *g.temperature;
  if (g.seed) body["seed"] = *g.seed;
  if (g.schema) {
    body["response_format"] = {
        {"type", "json_schema"},
        {"json_schema", {{"name", "answer"}, {"schema", *g.schema}, {"strict", true}}}};
  }
  if (stream) body["stream_options"] = {{"include_usage", true}};
  return body;
}

// What ask and stream report: the answer and the footer the seeds' demo printed.
struct Answer {
  std::string text;
  std::string model;
  std::string finish;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  ojson timings = ojson::object();
  double round_trip_s = 0;

  ojson result() const {
    const auto number = [&](const char* key) {
      return timings.contains(key) && timings[key].is_number() ? timings[key].get<double>() : NAN;
    };
    const double read_s = number("read_s");
    const double rate = number("decode_tokens_per_second");
    std::string footer = model + " · finish `" + finish + "` · " + std::to_string(prompt_tokens) +
                         " prompt + " + std::to_string(completion_tokens) + " completion tokens";
    if (!std::isnan(read_s)) footer += " · prompt read " + fixed(read_s, 3) + " s";
    if (!std::isnan(rate)) footer += " · decode " + fixed(rate, 1) + " tok/s";
    footer += " · " + fixed(round_trip_s, 2) + " s round trip";
    ojson structured = {{"answer", text},
                        {"model", model},
                        {"finish_reason", finish},
                        {"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"timings", timings},
                        {"round_trip_s", round_trip_s}};
    return text_result(text + "\n---\n" + footer, std::move(structured));
  }

  void take_usage(const ojson& usage) {
    if (!usage.is_object()) return;
    prompt_tokens = usage.value("prompt_tokens", int64_t{0});
    completion_tokens = usage.value("completion_tokens", int64_t{0});
  }
};

// ask and stream: the answer of a streamed chat request. stream's progress_token and notify send
// each chunk on as a progress notification; ask gives none. The request stops at the next chunk
// once `cancelled` says so (a notifications/cancelled, or the client gone), and the server then
// cancels the decode as for any client that hangs up.
ojson answer(const ServerClient& server, const McpFiles& files, const ojson& args,
             const ojson& progress_token, const McpNotify& notify,
             const std::function<bool()>& cancelled) {
  const GenerationArgs g = parse_generation_args(args);
  const std::vector<MediaFile> media = read_media(g, files);
  const auto start = Clock::now();
  const std::string path = "/v1/chat/completions";
  Answer a;
  std::string buffer;
  std::string failure;
  int64_t chunks = 0;
  bool stopped = false;
  auto on_event = [&](const std::string& data) {
    if (cancelled && cancelled()) {
      stopped = true;
      return false;
    }
    if (data == "[DONE]") return true;
    const ojson event = ojson::parse(data);
    if (event.contains("error")) {
      failure = event["error"].value("message", dump(event["error"]));
      return false;
    }
    if (event.contains("model")) a.model = event["model"].get<std::string>();
    if (event.contains("usage")) a.take_usage(event["usage"]);
    if (!event.contains("choices") || event["choices"].empty()) return true;
    const ojson& choice = event["choices"][0];
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      a.finish = choice["finish_reason"].get<std::string>();
      a.timings = event.value("timings", ojson::object());
    }
    const ojson delta = choice.value("delta", ojson::object());
    if (delta.contains("content") && delta["content"].is_string()) {
      const std::string piece = delta["content"].get<std::string>();
      if (piece.empty()) return true;
      a.text += piece;
      ++chunks;
      if (!progress_token.is_null() && notify) {
        const ojson progress = {{"jsonrpc", "2.0"},
                                {"method", "notifications/progress"},
                                {"params",
                                 {{"progressToken", progress_token},
                                  {"progress", chunks},
                                  {"total", g.max_tokens},
                                  {"message", piece}}}};
        if (!notify(progress)) {
          stopped = true;
          return false;
        }
      }
    }
    return true;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = server.route_prefix() + path;
  req.headers = server.headers();
  req.headers.emplace("Accept", "text/event-stream");
  req.body = dump(chat_body(g, media, true));
  req.set_header("Content-Type", "application/json");
  int status = 0;
  std::string error_body;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, size);
      return true;
    }
    buffer.append(data, size);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string block = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (block.rfind("data: ", 0) != 0) continue;
      try {
        if (!on_event(block.substr(6))) return false;
      } catch (const std::exception& e) {
        failure = std::string("an unreadable stream event: ") + e.what();
        return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = server.client(3600)->send(req, res, error);
  if (stopped) {
    throw ToolError("the call was cancelled (or the MCP client went away); so was the decode");
  }
  if (!failure.empty()) throw ToolError(server.url() + path + ": " + failure);
  if (!sent) throw server.unreachable(path, error);
  if (status != 200) {
    res.body = error_body;
    throw server.refused(path, res, [&](const std::string& message, const std::string& param) {
      return explain_media_error(g, media, message, param);
    });
  }
  a.round_trip_s = seconds_since(start);
  return a.result();
}

ojson engine_info(const ServerClient& server) {
  const auto res = server.get("/v1/engine");
  if (res.status != 200) throw server.refused("/v1/engine", res);
  const ojson engine = ojson::parse(res.body);
  return text_result(engine.dump(2), engine);
}

ojson endpoint_status(const ServerClient& server) {
  const auto start = Clock::now();
  const auto health = server.get("/health", 10);
  const double latency_ms = seconds_since(start) * 1000;
  ojson structured = {{"url", server.url()},
                      {"health_status", health.status},
                      {"health", health.body},
                      {"latency_ms", latency_ms}};
  std::string text = (health.status == 200 ? "up: " : "not ready: ") + server.url() + "\n" +
                     "- /health: " + std::to_string(health.status) + " " + health.body + "\n" +
                     "- latency: " + fixed(latency_ms, 1) + " ms";
  // A proxy says where it forwards to.
  const auto proxy = server.get("/proxy/status", 10);
  if (proxy.status == 200) {
    try {
      ojson p = ojson::parse(proxy.body);
      text += "\n- proxy upstream: " + p.value("upstream", std::string("?")) + " (/health " +
              dump(p.value("upstream_health_status", ojson())) + ")";
      structured["proxy"] = std::move(p);
    } catch (const std::exception&) {
    }
  }
  return text_result(text, std::move(structured));
}

// Prometheus text format: one entry per sample, keyed by its name with labels as written.
ojson parse_prometheus(const std::string& text) {
  ojson samples = ojson::object();
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string value = line.substr(space + 1);
    char* parsed_end = nullptr;
    const double v = std::strtod(value.c_str(), &parsed_end);
    if (parsed_end == value.c_str()) continue;
    samples[line.substr(0, space)] = std::isfinite(v) ? ojson(v) : ojson(value);
  }
  return samples;
}

ojson serving_metrics(const ServerClient& server) {
  const auto res = server.get("/metrics");
  if (res.status != 200) throw server.refused("/metrics", res);
  const ojson samples = parse_prometheus(res.body);
  return text_result(samples.dump(2), ojson{{"url", server.url()}, {"samples", samples}});
}

ojson call_tool(const McpTarget& target, const ojson& params, const McpNotify& notify,
                const std::function<bool()>& cancelled) {
  if (!params.is_object() || !params.contains("name") || !params["name"].is_string()) {
    throw RpcError(kInvalidParams, "tools/call needs params.name, a string");
  }
  const std::string name = params["name"].get<std::string>();
  const ojson args = params.value("arguments", ojson::object());
  if (!args.is_object())
    throw RpcError(kInvalidParams, "tools/call params.arguments must be an object");
  ojson progress_token;
  if (params.contains("_meta") && params["_meta"].is_object()) {
    progress_token = params["_meta"].value("progressToken", ojson());
  }
  static const std::set<std::string> known = {"ask", "stream", "engine_info", "endpoint_status",
                                              "serving_metrics"};
  if (!known.count(name)) {
    throw RpcError(kInvalidParams, "unknown tool '" + name +
                                       "'; the tools are ask, stream, engine_info, "
                                       "endpoint_status, serving_metrics");
  }
  const ServerClient server(target);
  try {
    if (name != "ask" && name != "stream" && !args.empty()) {
      throw ToolError(name + " takes no arguments");
    }
    if (name == "ask") return answer(server, target.files, args, nullptr, {}, cancelled);
    if (name == "stream") {
      return answer(server, target.files, args, progress_token, notify, cancelled);
    }
    if (name == "engine_info") return engine_info(server);
    if (name == "endpoint_status") return endpoint_status(server);
    return serving_metrics(server);
  } catch (const ToolError& e) {
    ojson result = text_result(e.what());
    result["isError"] = true;
    return result;
  } catch (const nlohmann::json::exception& e) {
    ojson result =
        text_result(server.url() + " answered with unreadable JSON: " + json_error_text(e));
    result["isError"] = true;
    return result;
  }
}

ojson initialize_result(const ojson& params) {
  std::string version = kLatestVersion;
  if (params.is_object() && params.contains("protocolVersion") &&
      params["protocolVersion"].is_string() &&
      kVersions.count(params["protocolVersion"].get<std::string>())) {
    version = params["protocolVersion"].get<std::string>();
  }
  return {{"protocolVersion", version},
          {"capabilities", {{"tools", {{"listChanged", false}}}}},
          {"serverInfo",
           {{"name", "torchtpu-cpp"},
            {"title", "torchtpu-cpp (Gemma 4)"},
            {"version", TORCHTPU_VERSION}}},
          {"instructions",
           "Tools of a torchtpu-cpp server (Gemma 4 over ATen): ask or stream to query the model; "
           "engine_info, endpoint_status and serving_metrics to inspect the server."}};
}

}  // namespace

std::string origin_of(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.ends_with("/v1")) url.resize(url.size() - 3);
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.find("://") == std::string::npos) url = "http://" + url;
  return url;
}

McpFiles mcp_media_directory(const std::string& dir) {
  if (dir.empty()) throw ValueError("--mcp-media-dir must name a directory, got \"\"");
  char resolved[PATH_MAX];
  if (!::realpath(dir.c_str(), resolved)) {
    throw ValueError("--mcp-media-dir " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ValueError("--mcp-media-dir " + dir + " is not a directory");
  }
  McpFiles files;
  files.scope = McpFiles::Scope::kDirectory;
  files.directory = resolved;
  files.given = without_trailing_slash(std::filesystem::absolute(dir).lexically_normal().string());
  return files;
}

McpCalls::Call::Call(McpCalls* calls, std::string key) : calls_(calls), key_(std::move(key)) {
  if (!calls_) return;
  std::lock_guard lock(calls_->mutex_);
  flag_ = calls_->flags_[key_] = std::make_shared<std::atomic<bool>>(false);
}

McpCalls::Call::~Call() {
  if (!calls_) return;
  std::lock_guard lock(calls_->mutex_);
  if (const auto it = calls_->flags_.find(key_);
      it != calls_->flags_.end() && it->second == flag_) {
    calls_->flags_.erase(it);
  }
}

void McpCalls::cancel(const std::string& key) {
  std::lock_guard lock(mutex_);
  if (const auto it = flags_.find(key); it != flags_.end()) *it->second = true;
}

std::optional<ojson> handle_mcp_message(const McpTarget& target, const ojson& message,
                                        const McpNotify& notify, const McpCallContext& context) {
  if (!message.is_object()) {
    return rpc_error(nullptr, kInvalidRequest,
                     "a JSON-RPC message must be an object (batches are not supported)");
  }
  const ojson id = message.value("id", ojson());
  const bool is_request = message.contains("id") && message.contains("method");
  // Compared as JSON values: value("jsonrpc", "") would throw for a member that is no string.
  if (message.value("jsonrpc", ojson()) != "2.0" ||
      (message.contains("method") && !message["method"].is_string())) {
    return rpc_error(id, kInvalidRequest, "not a JSON-RPC 2.0 message");
  }
  if (!message.contains("method") && !message.contains("result") && !message.contains("error")) {
    return rpc_error(id, kInvalidRequest,
                     "a JSON-RPC message needs a method (a request or a notification), or a "
                     "result or an error (a response)");
  }
  if (is_request && !id.is_string() && !id.is_number_integer()) {
    return rpc_error(nullptr, kInvalidRequest,
                     std::string("an MCP request's id must be a string or an integer, got ") +
                         json_type_name(id));
  }
  // Notifications (initialized, cancelled) and responses need no answer.
  if (!is_request) {
    const ojson* params = message.contains("params") ? &message["params"] : nullptr;
    if (context.calls && message.value("method", ojson()) == "notifications/cancelled" && params &&
        params->is_object() && params->contains("requestId")) {
      context.calls->cancel(context.key((*params)["requestId"]));
    }
    return std::nullopt;
  }
  const std::string method = message["method"].get<std::string>();
  const ojson params = message.value("params", ojson::object());
  try {
    ojson result;
    if (method == "initialize") {
      result = initialize_result(params);
    } else if (method == "ping") {
      result = ojson::object();
    } else if (method == "tools/list") {
      result = {{"tools", tool_list(target.files)}};
    } else if (method == "tools/call") {
      const McpCalls::Call call(context.calls, context.key(id));
      result = call_tool(target, params, notify, [&] {
        return call.cancelled() || (context.client_gone && context.client_gone());
      });
    } else {
      throw RpcError(kMethodNotFound, "unknown method '" + method + "'");
    }
    return ojson{{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
  } catch (const RpcError& e) {
    return rpc_error(id, e.code, e.what());
  }
}

void serve_mcp_stdio(const McpTarget& target, std::istream& in, std::ostream& out) {
  std::mutex out_mutex;
  auto write = [&](const ojson& message) {
    std::lock_guard lock(out_mutex);
    out << dump(message) << '\n' << std::flush;
    return static_cast<bool>(out);
  };
  McpCalls calls;
  const McpCallContext context{&calls, "", {}};
  // The tool calls running beside the reader; each says when it is done, to be joined.
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers;
  auto join = [&](bool all) {
    for (auto it = workers.begin(); it != workers.end();) {
      if (all || *it->done) {
        it->thread.join();
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
  };
  std::string line;
  while (std::getline(in, line)) {
    join(/*all=*/false);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ojson message;
    try {
      message = parse_json(line);
    } catch (const nlohmann::json::exception& e) {
      // Not only parse_error: a number beyond double's range (1e999) is out_of_range.
      write(rpc_error(nullptr, kParseError, std::string("unreadable JSON: ") + json_error_text(e)));
      continue;
    } catch (const JsonTooDeep& e) {
      write(rpc_error(nullptr, kParseError, std::string("refused JSON: ") + e.what()));
      continue;
    }
    if (message.is_object() && message.contains("id") &&
        message.value("method", ojson()) == "tools/call") {
      auto done = std::make_shared<std::atomic<bool>>(false);
      std::thread thread([&, message = std::move(message), done] {
        try {
          if (auto answer = handle_mcp_message(target, message, write, context)) write(*answer);
        } catch (const std::exception& e) {
          write(rpc_error(message["id"], kInternalError, e.what()));
        }
        *done = true;
      });
      workers.push_back({std::move(thread), std::move(done)});
      continue;
    }
    if (auto answer = handle_mcp_message(target, message, write, context)) write(*answer);
  }
  // The input's end: the calls in flight still answer.
  join(/*all=*/true);
}

namespace {

// Browsers send Origin; only pages of this host or of localhost may call (DNS rebinding).
bool origin_allowed(const httplib::Request& req) {
  if (!req.has_header("Origin")) return true;
  const std::string origin = req.get_header_value("Origin");
  const std::string host = req.get_header_value("Host");
  if (!host.empty() && (origin == "http://" + host || origin == "https://" + host)) return true;
  for (const char* local : {"http://localhost", "http://127.0.0.1", "http://[::1]"}) {
    const std::string prefix = local;
    if (origin == prefix || origin.rfind(prefix + ":", 0) == 0) return true;
  }
  return false;
}

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void handle_mcp_post(const McpFiles& files, McpCalls& calls, const httplib::Request& req,
                     httplib::Response& res) {
  if (!origin_allowed(req)) {
    send_json(res, 403,
              rpc_error(nullptr, kInvalidRequest,
                        "Origin " + req.get_header_value("Origin") + " may not use this server"));
    return;
  }
  const std::string version = req.get_header_value("MCP-Protocol-Version");
  if (!version.empty() && !kVersions.count(version) && version != "2025-03-26") {
    send_json(res, 400,
              rpc_error(nullptr, kInvalidRequest,
                        "unsupported MCP-Protocol-Version " + version +
                            "; this server speaks 2025-06-18 and 2025-11-25"));
    return;
  }
  ojson message;
  try {
    message = parse_json(req.body);
  } catch (const nlohmann::json::exception& e) {
    send_json(
        res, 400,
        rpc_error(nullptr, kParseError, std::string("unreadable JSON: ") + json_error_text(e)));
    return;
  } catch (const JsonTooDeep& e) {
    send_json(res, 400, rpc_error(nullptr, kParseError, std::string("refused JSON: ") + e.what()));
    return;
  }
  const std::string host =
      req.local_addr.find(':') != std::string::npos ? "[" + req.local_addr + "]" : req.local_addr;
  McpTarget target{"http://" + host + ":" + std::to_string(req.local_port),
                   req.get_header_value("Authorization"), files};
  // A session is only a scope for request ids: its client's cancellations reach its own calls.
  if (message.is_object() && message.value("method", ojson()) == "initialize") {
    res.set_header("Mcp-Session-Id", new_completion_id("mcp-"));
  }
  const int fd = connection_socket();
  const McpCallContext context{&calls, req.get_header_value("Mcp-Session-Id"),
                               [fd] { return peer_closed(fd); }};
  const bool wants_progress =
      message.is_object() && message.value("method", ojson()) == "tools/call" &&
      message.contains("params") && message["params"].is_object() &&
      message["params"].contains("_meta") && message["params"]["_meta"].is_object() &&
      message["params"]["_meta"].contains("progressToken");
  const bool accepts_sse =
      req.get_header_value("Accept").find("text/event-stream") != std::string::npos;
  if (!(wants_progress && accepts_sse)) {
    auto answer = handle_mcp_message(target, message, {}, context);
    if (!answer) {
      res.status = 202;
      return;
    }
    send_json(res, answer->contains("error") && answer->value("id", ojson()).is_null() ? 400 : 200,
              *answer);
    return;
  }
  // Progress goes out as SSE events ahead of the response, which ends the stream.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [target, message = std::move(message), context](size_t, httplib::DataSink& sink) {
        auto event = [&sink](const ojson& j) {
          const std::string out = "event: message\ndata: " + dump(j) + "\n\n";
          return sink.is_writable() && sink.write(out.data(), out.size());
        };
        auto answer = handle_mcp_message(target, message, event, context);
        if (answer && !event(*answer)) return false;
        sink.done();
        return true;
      });
}

}  // namespace

void add_mcp_routes(httplib::Server& http,
                    const std::function<httplib::Server::Handler(httplib::Server::Handler)>& guard,
                    McpFiles files) {
  httplib::Server::Handler post = [files = std::move(files), calls = std::make_shared<McpCalls>()](
                                      const httplib::Request& req, httplib::Response& res) {
    handle_mcp_post(files, *calls, req, res);
  };
  handle_post(http, "/mcp", guard ? guard(post) : post);
  auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "POST");
    send_json(res, 405,
              rpc_error(nullptr, kInvalidRequest,
                        req.method + " /mcp is not supported: this server opens no stream of its "
                                     "own, and a session ends with its client; POST each "
                                     "message"));
  };
  http.Get("/mcp", not_allowed);
  http.Delete("/mcp", not_allowed);
}

}  // namespace torchtpu::server
