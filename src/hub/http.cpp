#include "hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <memory>
#include <mutex>

#include "common/ascii.h"

namespace torchtpu::hub {
namespace {

constexpr int kMaxRedirects = 10;
constexpr size_t kMaxKeptBody = 1 << 20;  // of an error reply; enough for any message the Hub sends
constexpr long kConnectTimeoutS = 10;
// A transfer that moves less than a byte per second for this long counts as broken.
constexpr long kStallTimeoutS = 30;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool is_redirect(long status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

struct CurlUrl {
  CURLU* h = curl_url();
  ~CurlUrl() { curl_url_cleanup(h); }
  std::string get(CURLUPart part, unsigned flags = 0) const {
    char* out = nullptr;
    if (curl_url_get(h, part, &out, flags) != CURLUE_OK) return "";
    std::string s(out);
    curl_free(out);
    return s;
  }
};

// Per-hop state shared with curl's callbacks. Exceptions cannot cross curl's C frames, so a
// callback parks one here and returns the value that aborts the transfer.
struct Transfer {
  HttpResponse reply;
  const HttpClient::OnStart* on_start = nullptr;
  const HttpClient::Sink* sink = nullptr;
  bool started = false;
  int64_t delivered = 0;
  std::exception_ptr error;

  bool streams_body() const { return sink != nullptr && reply.status / 100 == 2; }
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a status line starts the headers of a (new) reply
    t->reply.headers.clear();
    size_t sp = line.find(' ');
    t->reply.status = sp == std::string::npos ? 0 : std::atol(line.c_str() + sp + 1);
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    t->reply.headers[ascii_lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  if (!t->streams_body()) {
    t->reply.body.append(
        data, std::min(bytes, kMaxKeptBody - std::min(kMaxKeptBody, t->reply.body.size())));
    return bytes;
  }
  try {
    if (!t->started) {
      t->started = true;
      if (t->on_start != nullptr && *t->on_start) (*t->on_start)(t->reply);
    }
    (*t->sink)(data, bytes);
    t->delivered += static_cast<int64_t>(bytes);
  } catch (...) {
    t->error = std::current_exception();
    return 0;
  }
  return bytes;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

std::string HttpResponse::header(const std::string& name) const {
  auto it = headers.find(ascii_lower(name));
  return it == headers.end() ? "" : it->second;
}

std::string url_origin(const std::string& url) {
  CurlUrl u;
  if (curl_url_set(u.h, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return "";
  return ascii_lower(u.get(CURLUPART_SCHEME)) + "://" + ascii_lower(u.get(CURLUPART_HOST)) + ":" +
         u.get(CURLUPART_PORT, CURLU_DEFAULT_PORT);
}

std::string resolve_url(const std::string& base, const std::string& location) {
  CurlUrl u;
  if (curl_url_set(u.h, CURLUPART_URL, base.c_str(), 0) != CURLUE_OK ||
      curl_url_set(u.h, CURLUPART_URL, location.c_str(), 0) != CURLUE_OK) {
    return "";
  }
  return u.get(CURLUPART_URL);
}

std::string url_quote(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

HttpClient::HttpClient(std::string user_agent, std::string token)
    : user_agent_(std::move(user_agent)), token_(std::move(token)) {
  global_init();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw std::runtime_error("libcurl could not create a handle");
}

HttpClient::~HttpClient() { curl_easy_cleanup(curl_); }

HttpResponse HttpClient::get(const std::string& url) { return request(url, 0, nullptr, nullptr); }

HttpResponse HttpClient::stream(const std::string& url, int64_t offset, const OnStart& on_start,
                                const Sink& sink) {
  return request(url, offset, &on_start, &sink);
}

HttpResponse HttpClient::request(const std::string& first_url, int64_t offset,
                                 const OnStart* on_start, const Sink* sink) {
  const std::string origin = url_origin(first_url);
  bool send_token = !token_.empty();
  std::string url = first_url;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    if (!url.starts_with("http://") && !url.starts_with("https://")) {
      throw TransportError(
          url + " is not an http(s) URL" + (hop > 0 ? " (a redirect from " + first_url + ")" : ""),
          0);
    }
    if (url_origin(url) != origin) send_token = false;

    curl_easy_reset(curl_);  // keeps the connection cache
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(nullptr,
                                                                        curl_slist_free_all);
    auto add_header = [&](const std::string& h) {
      headers.reset(curl_slist_append(headers.release(), h.c_str()));
    };
    if (send_token) add_header("Authorization: Bearer " + token_);
    if (offset > 0) add_header("Range: bytes=" + std::to_string(offset) + "-");
    if (sink == nullptr) add_header("Accept: application/json");

    Transfer t;
    t.on_start = on_start;
    t.sink = sink;
    char curl_error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(curl_, CURLOPT_USERAGENT, user_agent_.c_str());
    curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT, kConnectTimeoutS);
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_TIME, kStallTimeoutS);
    curl_easy_setopt(curl_, CURLOPT_PROTOCOLS_STR, "http,https");
    if (deadline_) {
      // Rounded up, so that a transfer curl ends for its time ends past the deadline.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
                            *deadline_ - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) throw TransportError("the deadline passed before " + url + " was asked", 0);
      curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    }
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &t);
    // API replies may be compressed; file bodies must arrive as the bytes the hash covers.
    if (sink == nullptr) curl_easy_setopt(curl_, CURLOPT_ACCEPT_ENCODING, "");

    t.reply.url = url;  // on_start sees which hop answered
    CURLcode rc = curl_easy_perform(curl_);
    if (t.error) std::rethrow_exception(t.error);
    if (rc != CURLE_OK) {
      std::string why = curl_error[0] != 0 ? curl_error : curl_easy_strerror(rc);
      throw TransportError(why + " (" + url + ")", t.delivered);
    }
    if (is_redirect(t.reply.status) && !t.reply.header("location").empty()) {
      std::string next = resolve_url(url, t.reply.header("location"));
      if (next.empty()) {
        throw TransportError(
            "unusable redirect to '" + t.reply.header("location") + "' from " + url, 0);
      }
      url = next;
      continue;
    }
    if (t.streams_body() && !t.started && on_start != nullptr && *on_start) (*on_start)(t.reply);
    return std::move(t.reply);
  }
  throw TransportError(
      "more than " + std::to_string(kMaxRedirects) + " redirects from " + first_url, 0);
}

}  // namespace torchtpu::hub
