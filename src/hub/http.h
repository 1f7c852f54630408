// A small HTTP client over libcurl for the Hub: GET with redirects followed here rather than by
// curl, so that the Authorization header is dropped as soon as a redirect leaves the origin the
// request started on (the Hub sends large files to a CDN with a signed URL). It speaks http and
// https only: a URL, or a redirect, to any other scheme (file, gopher, ftp...) is a
// TransportError before anything is sent.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

typedef void CURL;

namespace torchtpu::hub {

// The final reply of a request, after redirects. Header names are lower-case.
struct HttpResponse {
  long status = 0;
  std::string url;  // where the reply came from
  std::map<std::string, std::string> headers;
  std::string body;  // the whole body, except a 2xx body handed to a stream's sink
  std::string header(const std::string& name) const;
};

// The connection could not be made, or broke before the reply was complete. `received` counts
// the body bytes of the final reply that reached the sink.
struct TransportError : std::runtime_error {
  TransportError(const std::string& message, int64_t received)
      : std::runtime_error(message), received(received) {}
  int64_t received;
};

// "scheme://host:port" with the host lower-cased and the default port made explicit.
std::string url_origin(const std::string& url);
// `location` from a redirect, absolute or relative to `base`, as an absolute URL.
std::string resolve_url(const std::string& base, const std::string& location);
// Percent-encodes all but RFC 3986 unreserved characters ('/' kept when keep_slash), as Python's
// urllib.parse.quote(s, safe="/" or "").
std::string url_quote(const std::string& s, bool keep_slash);

class HttpClient {
 public:
  // `token`, when not empty, is sent as "Authorization: Bearer <token>" to the origin of each
  // request's first URL and never past a redirect to another origin.
  HttpClient(std::string user_agent, std::string token);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET with the whole body in the response (API calls).
  HttpResponse get(const std::string& url);

  // GET from byte `offset` on (a Range request when offset > 0). For a 2xx reply, `on_start`
  // sees the status and headers before the first body byte and `sink` then gets the body as it
  // arrives; other replies keep their body in the response. An exception from either callback
  // stops the transfer and is rethrown. Throws TransportError when the transfer breaks.
  using Sink = std::function<void(const char* data, size_t n)>;
  using OnStart = std::function<void(const HttpResponse& reply)>;
  HttpResponse stream(const std::string& url, int64_t offset, const OnStart& on_start,
                      const Sink& sink);

  // Every later request, redirects included, ends by `deadline`: past it the transfer stops with
  // a TransportError, whether or not bytes are arriving (without one only a stall ends it).
  void set_deadline(std::chrono::steady_clock::time_point deadline) { deadline_ = deadline; }

 private:
  HttpResponse request(const std::string& url, int64_t offset, const OnStart* on_start,
                       const Sink* sink);

  std::string user_agent_;
  std::string token_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  CURL* curl_ = nullptr;
};

}  // namespace torchtpu::hub
