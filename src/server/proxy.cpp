#include "server/proxy.h"

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "common/ascii.h"
#include "common/errors.h"
#include "server/auth.h"
#include "server/connection.h"
#include "server/mcp.h"
#include "server/openai.h"
#include "server/web/web.h"

namespace torchtpu::server {
namespace {

using Clock = std::chrono::steady_clock;

// http://host:port with no trailing / or /v1.
std::string normalize_url(std::string url) {
  const auto first = url.find_first_not_of(" \t\r\n");
  const auto last = url.find_last_not_of(" \t\r\n");
  url = first == std::string::npos ? "" : url.substr(first, last - first + 1);
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.ends_with("/v1")) url.resize(url.size() - 3);
  if (!url.empty() && url.find("://") == std::string::npos) url = "http://" + url;
  return url;
}

// `text` as the upstream's origin (normalize_url), or empty unless it is http://HOST[:PORT][/PATH]
// with a host name or address, digits for the port and nothing a URL cannot hold: what
// --upstream and the upstream command's last line must be.
std::string upstream_origin(const std::string& text) {
  const std::string url = normalize_url(text);
  const std::string scheme = "http://";
  if (!url.starts_with(scheme)) return "";
  const auto in = [](const std::string& s, const char* allowed) {
    return !s.empty() && s.find_first_not_of(allowed) == std::string::npos;
  };
  const size_t slash = url.find('/', scheme.size());
  const std::string authority = url.substr(scheme.size(), slash - scheme.size());
  const std::string path = slash == std::string::npos ? "" : url.substr(slash);
  constexpr const char* kName = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_";
  // An IPv6 address is bracketed, so its colons are not the port's.
  const size_t colon = authority.find(':', authority.starts_with("[") ? authority.find(']') : 0);
  const std::string host = authority.substr(0, colon);
  const bool host_ok =
      host.starts_with("[")
          ? host.ends_with("]") && in(host.substr(1, host.size() - 2), "0123456789abcdefABCDEF:.")
          : in(host, kName);
  const bool port_ok = colon == std::string::npos || in(authority.substr(colon + 1), "0123456789");
  const bool path_ok =
      std::all_of(path.begin(), path.end(), [](unsigned char c) { return c > ' ' && c < 0x7f; });
  return host_ok && port_ok && path_ok ? url : "";
}

// What `command` (run by /bin/sh in a process group of its own) printed on stdout, and how it
// ended: the exit code, or the signal that ended it. Past `limit_s` its process group is killed
// and `what` says so. std::runtime_error when it cannot be started.
struct CommandRun {
  std::string output;
  std::string what;  // empty: it exited with status 0
};

CommandRun run_command(const std::string& command, int limit_s) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("cannot run " + command);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int failed =
      posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(out[1]);
  if (failed != 0) {
    ::close(out[0]);
    throw std::runtime_error("cannot run " + command + ": " + std::strerror(failed));
  }
  CommandRun run;
  const auto deadline = Clock::now() + std::chrono::seconds(limit_s);
  bool timed_out = false;
  char buffer[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{out[0], POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      timed_out = true;
      ::killpg(pid, SIGKILL);
      break;
    }
    const ssize_t n = ::read(out[0], buffer, sizeof(buffer));
    if (n > 0) {
      run.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    run.what = "ran past " + std::to_string(limit_s) + " s and was killed";
  } else if (WIFSIGNALED(status)) {
    run.what = "was killed by signal " + std::to_string(WTERMSIG(status));
  } else if (WEXITSTATUS(status) != 0) {
    run.what = "exited with status " + std::to_string(WEXITSTATUS(status));
  }
  return run;
}

// Where requests go: a fixed URL, or what the upstream command prints, looked up again when the
// upstream fails.
class Upstream {
 public:
  explicit Upstream(const ProxyOptions& options)
      : fixed_(normalize_url(options.upstream)),
        command_(options.upstream_cmd),
        command_limit_s_(options.upstream_cmd_timeout_s) {}

  // The current URL, found by the command on first use. Throws std::runtime_error when the
  // command fails or prints nothing.
  std::string current() {
    std::lock_guard lock(mutex_);
    if (url_.empty()) resolve_locked();
    return url_;
  }

  // `failed` did not answer: the command's new answer (or the same fixed URL). Requests that
  // failed together on one URL share one lookup.
  std::string replace(const std::string& failed) {
    std::lock_guard lock(mutex_);
    if (url_ == failed) resolve_locked();
    return url_;
  }

  ojson status() {
    std::lock_guard lock(mutex_);
    return {{"upstream", url_.empty() ? ojson(nullptr) : ojson(url_)},
            {"upstream_cmd", command_.empty() ? ojson(nullptr) : ojson(command_)},
            {"lookups", lookups_},
            {"last_lookup_error", last_error_.empty() ? ojson(nullptr) : ojson(last_error_)}};
  }

 private:
  void resolve_locked() {
    if (command_.empty()) {
      url_ = fixed_;
      return;
    }
    ++lookups_;
    CommandRun run;
    try {
      run = run_command(command_, command_limit_s_);
    } catch (const std::runtime_error& e) {
      last_error_ = std::string("the upstream command: ") + e.what();
      throw;
    }
    const std::string& output = run.output;
    std::string line;
    size_t start = 0;
    while (start < output.size()) {
      size_t end = output.find('\n', start);
      if (end == std::string::npos) end = output.size();
      const std::string text = output.substr(start, end - start);
      if (!normalize_url(text).empty()) line = text;  // the last line that is not blank
      start = end + 1;
    }
    const std::string url = upstream_origin(line);
    if (!run.what.empty() || url.empty()) {
      const std::string shown = line.size() > 200 ? line.substr(0, 200) + "…" : line;
      last_error_ = "the upstream command '" + command_ + "' " +
                    (!run.what.empty() ? run.what
                     : line.empty()    ? "printed no URL"
                                       : "printed " + dump(ojson(shown)) +
                                          " on its last line, not an http:// URL");
      throw std::runtime_error(last_error_);
    }
    last_error_.clear();
    if (url != url_) std::cerr << "torchtpu-cpp proxy: upstream is " << url << "\n";
    url_ = url;
  }

  std::string fixed_;
  std::string command_;
  int command_limit_s_;
  std::mutex mutex_;
  std::string url_;
  int64_t lookups_ = 0;
  std::string last_error_;
};

// One request to the upstream, run on its own thread so the HTTP thread can watch its client
// and relay the answer as it arrives.
struct Exchange {
  std::unique_ptr<httplib::Client> client;
  std::thread thread;
  std::atomic<bool> aborted{false};

  std::mutex mutex;
  std::condition_variable changed;
  bool has_headers = false;
  int status = 0;
  httplib::Headers headers;
  std::deque<std::string> chunks;
  bool finished = false;
  httplib::Error error = httplib::Error::Success;

  void abort() {
    aborted = true;
    client->stop();
  }
  // Whether the upstream's answer has ended; for a thread that does not hold the mutex.
  bool ended() {
    const std::lock_guard lock(mutex);
    return finished;
  }
  ~Exchange() {
    if (thread.joinable()) thread.join();
  }
};

const std::set<std::string> kHopHeaders = {
    "host",    "content-length", "connection",      "keep-alive",          "transfer-encoding",
    "te",      "upgrade",        "accept-encoding", "proxy-authorization", "proxy-connection",
    "trailer", "content-type"};

bool is_hop_header(const std::string& name) { return kHopHeaders.count(ascii_lower(name)) > 0; }

// What cpp-httplib adds to a request's headers itself: the connection's two ends, which are the
// proxy's to know, not the upstream's (and which a client may send too, in the same names).
const std::set<std::string> kAddressHeaders = {"remote_addr", "remote_port", "local_addr",
                                               "local_port"};

bool is_header(const std::string& name, const char* lower) { return ascii_lower(name) == lower; }

// httplib reads a multipart/form-data body into `files` and leaves `body` empty (an upload to
// /v1/audio/transcriptions): the form is written again, each part's name, filename, type and
// bytes, under a boundary none of them holds. Returns the Content-Type and the body.
std::pair<std::string, std::string> multipart_form(const httplib::Request& in) {
  static std::mt19937_64 random{std::random_device{}()};
  static std::mutex random_mutex;
  std::string boundary;
  auto taken = [&] {
    return std::any_of(in.files.begin(), in.files.end(), [&](const auto& part) {
      return part.second.content.find(boundary) != std::string::npos;
    });
  };
  do {
    std::lock_guard lock(random_mutex);
    char hex[33];
    std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(random()),
                  static_cast<unsigned long long>(random()));
    boundary = std::string("torchtpu-proxy-") + hex;
  } while (taken());
  std::string body;
  for (const auto& [name, part] : in.files) {
    body += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"";
    if (!part.filename.empty()) body += "; filename=\"" + part.filename + "\"";
    body += "\r\n";
    if (!part.content_type.empty()) body += "Content-Type: " + part.content_type + "\r\n";
    body += "\r\n" + part.content + "\r\n";
  }
  body += "--" + boundary + "--\r\n";
  return {"multipart/form-data; boundary=" + boundary, std::move(body)};
}

// `authorization`: the Authorization header to send upstream, or nullopt to pass the client's on.
// With one, the client's x-api-key (Anthropic clients' way to send the proxy's key) stays here too.
std::shared_ptr<Exchange> start_exchange(const std::string& url, const httplib::Request& in,
                                         int timeout_s,
                                         const std::optional<std::string>& authorization) {
  auto x = std::make_shared<Exchange>();
  x->client = std::make_unique<httplib::Client>(url);
  x->client->set_connection_timeout(5);
  x->client->set_read_timeout(timeout_s);
  x->client->set_write_timeout(60);
  auto req = std::make_shared<httplib::Request>();
  req->method = in.method;
  req->path = in.target.empty() ? in.path : in.target;
  for (const auto& [name, value] : in.headers) {
    // A page's Origin is the proxy's to judge (Proxy::page_allowed): the upstream would judge it
    // against its own address, which no page the proxy serves is on.
    if (is_hop_header(name) || kAddressHeaders.count(ascii_lower(name)) > 0 ||
        is_header(name, "origin") ||
        (authorization && (is_header(name, "authorization") || is_header(name, "x-api-key")))) {
      continue;
    }
    req->headers.emplace(name, value);
  }
  if (authorization && !authorization->empty())
    req->headers.emplace("Authorization", *authorization);
  if (in.is_multipart_form_data()) {
    auto [type, body] = multipart_form(in);
    req->body = std::move(body);
    req->headers.emplace("Content-Type", type);
  } else if (!in.body.empty() || in.method == "POST" || in.method == "PUT" ||
             in.method == "PATCH") {
    req->body = in.body;
    req->headers.emplace("Content-Type", in.get_header_value("Content-Type"));
  }
  std::weak_ptr<Exchange> weak = x;
  Exchange* raw = x.get();
  req->response_handler = [raw](const httplib::Response& res) {
    {
      std::lock_guard lock(raw->mutex);
      raw->has_headers = true;
      raw->status = res.status;
      raw->headers = res.headers;
    }
    raw->changed.notify_all();
    return !raw->aborted;
  };
  req->content_receiver = [raw](const char* data, size_t size, uint64_t, uint64_t) {
    {
      std::lock_guard lock(raw->mutex);
      raw->chunks.emplace_back(data, size);
    }
    raw->changed.notify_all();
    return !raw->aborted;
  };
  // The thread only touches the exchange, which outlives it (its destructor joins).
  x->thread = std::thread([raw, req] {
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    raw->client->send(*req, res, error);
    {
      std::lock_guard lock(raw->mutex);
      raw->finished = true;
      raw->error = error;
    }
    raw->changed.notify_all();
  });
  return x;
}

class Proxy {
 public:
  explicit Proxy(const ProxyOptions& options) : options_(options), upstream_(options) {}
  int run();

 private:
  void forward(const httplib::Request& req, httplib::Response& res);
  void status(httplib::Response& res);
  // False, with the 403 written, for what browser_refusal refuses.
  bool page_allowed(const httplib::Request& req, httplib::Response& res) const;
  // False, with the error written: page_allowed's 403, or 401 when the proxy has a key and the
  // request does not carry it.
  bool authorized(const httplib::Request& req, httplib::Response& res) const;
  // The Authorization header requests take upstream; nullopt: the client's own.
  std::optional<std::string> upstream_authorization() const;

  ProxyOptions options_;
  Upstream upstream_;
};

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& code, const std::string& type = "server_error") {
  res.status = status;
  res.set_content(
      dump({{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}}),
      "application/json");
}

bool Proxy::page_allowed(const httplib::Request& req, httplib::Response& res) const {
  const std::string refusal = browser_refusal(req, is_loopback(options_.host));
  if (refusal.empty()) return true;
  send_error(res, 403, refusal, "forbidden", "invalid_request_error");
  return false;
}

bool Proxy::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (!page_allowed(req, res)) return false;
  if (options_.api_key.empty()) return true;
  // OpenAI clients send the key as a bearer token, Anthropic clients as x-api-key.
  const std::string given = req.get_header_value("Authorization");
  const bool has_x_api_key = req.has_header("x-api-key");
  if (bearer_matches(given, options_.api_key) ||
      (has_x_api_key && key_matches(req.get_header_value("x-api-key"), options_.api_key))) {
    return true;
  }
  res.set_header("WWW-Authenticate", "Bearer");
  send_error(res, 401,
             given.empty() && !has_x_api_key
                 ? "missing API key for the proxy: send 'Authorization: Bearer <key>' or "
                   "'x-api-key: <key>'"
                 : "incorrect API key for the proxy",
             "invalid_api_key", "authentication_error");
  return false;
}

std::optional<std::string> Proxy::upstream_authorization() const {
  if (!options_.upstream_api_key.empty()) return "Bearer " + options_.upstream_api_key;
  // The client's header holds the proxy's own key, which is not the upstream's to see.
  if (!options_.api_key.empty()) return "";
  return std::nullopt;
}

void Proxy::forward(const httplib::Request& req, httplib::Response& res) {
  if (!(req.method == "GET" && req.path == "/health") && !authorized(req, res)) return;
  const int fd = connection_socket();
  const bool idempotent = req.method == "GET" || req.method == "HEAD" || req.method == "OPTIONS";
  std::shared_ptr<Exchange> x;
  std::string url;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      url = attempt == 0 ? upstream_.current() : upstream_.replace(url);
    } catch (const std::exception& e) {
      send_error(res, 502, e.what(), "upstream_unknown");
      return;
    }
    x = start_exchange(url, req, options_.upstream_timeout_s, upstream_authorization());
    std::unique_lock lock(x->mutex);
    while (!x->has_headers && !x->finished) {
      x->changed.wait_for(lock, std::chrono::milliseconds(50));
      if (!x->has_headers && !x->finished && peer_closed(fd)) {
        lock.unlock();
        x->abort();
        return;
      }
    }
    if (x->has_headers) break;
    // A request that never reached the upstream is safe to send again; one that may have is
    // only when it is idempotent.
    const bool unsent = x->error == httplib::Error::Connection;
    std::cerr << "torchtpu-cpp proxy: " << url << " did not answer " << req.method << " "
              << req.path << ": " << describe(x->error) << "\n";
    if (attempt == 0 && (unsent || idempotent)) continue;
    send_error(res, 502, "the upstream " + url + " did not answer: " + describe(x->error),
               "upstream_unreachable");
    return;
  }
  std::string content_type;
  {
    std::lock_guard lock(x->mutex);
    res.status = x->status;
    for (const auto& [name, value] : x->headers) {
      if (name == "Content-Type" || name == "content-type") content_type = value;
      // The proxy's own CORS headers name the pages it lets read its answers.
      if (!is_hop_header(name) && !ascii_lower(name).starts_with("access-control-")) {
        res.set_header(name, value);
      }
    }
  }
  // Streams (server-sent events, Ollama's newline-delimited JSON) go on as they come; anything
  // else is passed on whole.
  if (content_type.rfind("text/event-stream", 0) == 0 ||
      content_type.rfind("application/x-ndjson", 0) == 0) {
    res.set_chunked_content_provider(
        content_type,
        [x, fd](size_t, httplib::DataSink& sink) {
          std::unique_lock lock(x->mutex);
          while (x->chunks.empty() && !x->finished) {
            x->changed.wait_for(lock, std::chrono::milliseconds(50));
            if (x->chunks.empty() && !x->finished && peer_closed(fd)) {
              lock.unlock();
              x->abort();
              return false;
            }
          }
          std::string out;
          while (!x->chunks.empty()) {
            out += x->chunks.front();
            x->chunks.pop_front();
          }
          const bool finished = x->finished;
          const bool broken = finished && x->error != httplib::Error::Success;
          lock.unlock();
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            x->abort();
            return false;
          }
          // An upstream that broke off mid-stream (it crashed, the network went): the client's
          // connection is broken off too, with no final chunk, so that its client fails as it
          // would have against the upstream itself, rather than take the cut stream as whole.
          if (broken) return false;
          if (finished) sink.done();
          return true;
        },
        [x](bool) {
          if (!x->ended()) x->abort();
        });
    return;
  }
  std::string body;
  {
    std::unique_lock lock(x->mutex);
    while (!x->finished) {
      x->changed.wait_for(lock, std::chrono::milliseconds(50));
      if (!x->finished && peer_closed(fd)) {
        lock.unlock();
        x->abort();
        return;
      }
    }
    for (const auto& chunk : x->chunks) body += chunk;
    if (x->error != httplib::Error::Success) {
      send_error(res, 502,
                 "the upstream " + url + " broke off its answer: " + describe(x->error),
                 "upstream_broken");
      return;
    }
  }
  res.set_content(std::move(body),
                  content_type.empty() ? "application/octet-stream" : content_type);
}

void Proxy::status(httplib::Response& res) {
  ojson out = upstream_.status();
  out["proxy"] = "torchtpu-cpp proxy";
  std::string url;
  try {
    url = upstream_.current();
  } catch (const std::exception& e) {
    out["upstream_health_status"] = nullptr;
    out["upstream_error"] = e.what();
  }
  if (!url.empty()) {
    out["upstream"] = url;
    httplib::Client client(url);
    client.set_connection_timeout(3);
    client.set_read_timeout(5);
    const auto start = Clock::now();
    auto health = client.Get("/health");
    out["latency_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (health) {
      out["upstream_health_status"] = health->status;
      try {
        out["upstream_health"] = ojson::parse(health->body);
      } catch (const std::exception&) {
        out["upstream_health"] = health->body;
      }
    } else {
      out["upstream_health_status"] = nullptr;
      out["upstream_error"] = describe(health.error());
    }
  }
  res.set_content(dump(out), "application/json");
}

int Proxy::run() {
  // SIGINT and SIGTERM are taken by sigwait below, on this thread; every thread started from here
  // on inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  struct sigaction ignore {
  }, old_pipe{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_pipe);

  HttpServer http;
  http.leave_ranges_to_upstream();
  http.new_task_queue = [] { return new httplib::ThreadPool(64); };
  http.set_tcp_nodelay(true);
  http.set_keep_alive_timeout(2);
  // The proxy holds a body whole before it forwards it.
  http.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  // The pages the proxy serves, or lets call it, talk to the proxy: it answers their preflights
  // (the upstream would ask for a key no preflight carries) and names them in its answers.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!is_preflight(req)) return httplib::Server::HandlerResponse::Unhandled;
    if (page_allowed(req, res)) allow_preflight(req, res, "GET, POST, PUT, PATCH, DELETE");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    allow_origin(req, res, is_loopback(options_.host));
  });
  add_web_routes(http);
  // The tools call this proxy back with the request's Authorization header, so they pass here too.
  // They read no files: a path in ask's images or audio is refused (docs/API.md, "MCP tools").
  McpFiles no_files;
  no_files.refusal =
      "the proxy's MCP tools read no files; use the tools over stdio (`torchtpu-cpp mcp --url "
      "PROXY`), where they read the caller's own files, or the upstream server's /mcp if it was "
      "started with --mcp-media-dir";
  add_mcp_routes(
      http,
      [this](httplib::Server::Handler handler) {
        return [this, handler](const httplib::Request& req, httplib::Response& res) {
          if (authorized(req, res)) handler(req, res);
        };
      },
      std::move(no_files));
  http.Get("/proxy/status", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) status(res);
  });
  const auto forward = [this](const httplib::Request& req, httplib::Response& res) {
    this->forward(req, res);
  };
  const char* everything = R"(/.*)";
  http.Get(everything, forward);
  handle_post(http, everything, forward);
  http.Put(everything, forward);
  http.Patch(everything, forward);
  http.Delete(everything, forward);
  http.Options(everything, forward);
  // HttpServer's 415 (a compressed body, left unread) and a refused request still need their
  // words.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                 httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (const auto refusal = read_refusal()) {
      send_error(res, refusal->status, refusal->message, refusal->code, "invalid_request_error");
    } else if (res.status == 415) {
      send_error(res, 415, content_coding_refusal(req), "unsupported_content_encoding",
                 "invalid_request_error");
    } else {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  const int port = bind_listener(http, options_.host, options_.port);
  if (port < 0) {
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    sigaction(SIGPIPE, &old_pipe, nullptr);
    throw std::runtime_error("cannot listen on " + options_.host + ":" +
                             std::to_string(options_.port) +
                             " (address in use, not local, or not allowed)");
  }
  std::thread listener([&http] { http.listen_after_bind(); });
  if (options_.on_listening) options_.on_listening(port);
  std::cout << "proxy on http://" << options_.host << ":" << port << " for "
            << (options_.upstream_cmd.empty() ? normalize_url(options_.upstream)
                                              : "`" + options_.upstream_cmd + "`")
            << std::endl;
  int signal = 0;
  sigwait(&stop_signals, &signal);
  http.stop();
  listener.join();
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  return 0;
}

}  // namespace

int run_proxy(const ProxyOptions& options) {
  check_port(options.port);
  check_max_body_bytes(options.max_body_bytes);
  if (options.upstream.empty() == options.upstream_cmd.empty()) {
    throw ValueError("the proxy needs exactly one of --upstream URL and --upstream-cmd CMD");
  }
  if (!options.upstream_api_key.empty() && options.api_key.empty()) {
    throw ValueError(
        "--upstream-api-key needs --api-key: without a key of its own the proxy would hand the "
        "upstream's key to anyone who reaches it");
  }
  if (!options.upstream.empty() && upstream_origin(options.upstream).empty()) {
    throw ValueError("--upstream must be an http:// URL, got '" + options.upstream + "'");
  }
  Proxy proxy(options);
  return proxy.run();
}

}  // namespace torchtpu::server
