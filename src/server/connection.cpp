#include "server/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/errors.h"

namespace torchtpu::server {
namespace {

// The numeric address and port of `addr`, as cpp-httplib writes them into a request.
bool numeric_address(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char name[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, name, sizeof(name), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  ip = name;
  port = std::atoi(service);
  return true;
}

using Clock = std::chrono::steady_clock;

thread_local std::optional<ReadRefusal> t_refusal;
thread_local bool t_head_parsed = false;
thread_local bool t_end_after_answer = false;
thread_local int t_socket = -1;  // the connection this thread is answering, -1 between them

// Whether the connection of the request answered on this thread ends with the answer: after a
// head that could not be read (refused here, malformed, a request line too long) or a body left
// unread or refused, nothing tells where the next request would start.
bool ends_after_answer() { return !t_head_parsed || t_end_after_answer || t_refusal; }

// How long a connection whose head could not be read is read and dropped after its answer.
constexpr std::chrono::seconds kLingerAfterUnreadHead{2};

// Whether `events` come on `fd` within `timeout` (a negative timeout: at once or not at all).
bool wait_for(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    const int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// "20 s", or "600 ms" where the time is not whole seconds.
std::string duration_words(std::chrono::milliseconds time) {
  return time.count() % 1000 == 0 ? std::to_string(time.count() / 1000) + " s"
                                  : std::to_string(time.count()) + " ms";
}

// `get` is getpeername or getsockname.
void address_of(int (*get)(int, sockaddr*, socklen_t*), int fd, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (get(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) numeric_address(addr, len, ip, port);
}

// A connection's bytes, as httplib's SocketStream gives them, with each request bounded
// (HttpServer). httplib reads a head a byte at a time, the request line first, then header lines
// up to an empty one ("\r\n"); the body in larger reads, from when a handler asks for it.
class BoundedStream final : public httplib::Stream {
 public:
  // `body_max`: the server's payload limit.
  BoundedStream(int fd, RequestLimits limits, size_t body_max,
                std::chrono::milliseconds read_timeout, std::chrono::milliseconds write_timeout)
      : fd_(fd),
        limits_(limits),
        body_max_(body_max),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout) {}

  // Waits up to `idle` for the next request's first byte, and starts reading its head.
  bool next_request(std::chrono::milliseconds idle) {
    t_refusal.reset();
    t_head_parsed = false;
    t_end_after_answer = false;
    if (off_ == size_ && !wait_for(fd_, POLLIN, idle)) return false;
    in_head_ = true;
    head_bytes_ = 0;
    lines_ = 0;
    line_bytes_ = 0;
    ending_ = 0;
    head_deadline_ = Clock::now() + limits_.head_time;
    body_start_.reset();
    body_bytes_ = 0;
    return true;
  }

  // Called once the library has parsed the head, before anything is routed: a request whose
  // body's length is unclear, or larger than the payload limit, is refused unread. Without
  // `apply_ranges` (HttpServer::leave_ranges_to_upstream) a Range is only passed on.
  void head_parsed(httplib::Request& req, bool apply_ranges) {
    t_head_parsed = true;
    t_refusal = head_refusal(req);
    // RFC 9110 (14.2) defines Range for GET alone: the library would cut any answer to it, a
    // chat completion's JSON included (a 206 of its first bytes). And it lets a server ignore a
    // Range of several parts, which the library would build whole in memory, overlapping parts
    // included: 2,700 parts of `0-` in one 8 KiB header line made the chat page's 25 KB script
    // a 68 MB answer, for anyone who reaches the port. One part is served; several get the whole
    // answer once.
    if ((req.method != "GET" && req.method != "HEAD") || req.ranges.size() > 1) {
      req.ranges.clear();
      req.headers.erase("Range");
    }
    if (!apply_ranges) req.ranges.clear();
  }

  bool is_readable() const override { return off_ < size_ || wait_for(fd_, POLLIN, read_timeout_); }
  // A peer that closed its sending side (socat, `nc -N`, Go's CloseWrite) still reads the answer:
  // only a connection reset or closed both ways (POLLERR, POLLHUP) ends the writing. A client gone
  // altogether is found at the first write after its close, which draws the reset.
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    const auto deadline = Clock::now() + write_timeout_;
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      if (n > 0) return (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
      if (n == 0 || errno != EINTR) return false;
    }
  }

  ssize_t read(char* ptr, size_t size) override {
    if (t_refusal) return cut_off(ptr, size);
    const bool in_body = !in_head_;
    if (in_body && !body_start_) body_start_ = Clock::now();
    if (off_ == size_) {
      // The wait ends at the read timeout or the deadline, whichever is first; an end at the
      // deadline refuses the request.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline() - Clock::now());
      const bool deadline_first = left <= read_timeout_;
      if (!wait_for(fd_, POLLIN, deadline_first ? left : read_timeout_)) {
        if (deadline_first) {
          t_refusal = ReadRefusal{408, "request_timeout", too_slow()};
          return cut_off(ptr, size);
        }
        return -1;
      }
      // A body read as large as the buffer goes straight to the caller, as httplib's own stream
      // reads it; only the head, a byte at a time, needs the buffer.
      const bool direct = !in_head_ && size >= sizeof(buffer_);
      ssize_t n = 0;
      do {
        n = ::recv(fd_, direct ? ptr : buffer_, direct ? size : sizeof(buffer_), 0);
      } while (n < 0 && errno == EINTR);
      if (n > 0 && direct) return counted(n);
      if (n <= 0) return n;
      off_ = 0;
      size_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, size_ - off_);
    if (in_head_) {
      for (size_t i = 0; i < n; ++i) {
        if (++head_bytes_ > limits_.head_bytes) {
          t_refusal = ReadRefusal{431, "request_header_fields_too_large",
                                  "the request's head (its request line and headers) is larger "
                                  "than " +
                                      std::to_string(limits_.head_bytes) + " bytes"};
          return cut_off(ptr, size);
        }
        const char byte = buffer_[off_ + i];
        if (byte != '\n') {
          // The library reads a header line of at most this many bytes, and calls a longer one
          // a malformed request (a 400); the request line has its own bound (414).
          if (++line_bytes_ > CPPHTTPLIB_HEADER_MAX_LENGTH && lines_ > 0) {
            t_refusal = ReadRefusal{431, "request_header_fields_too_large",
                                    "a header line of the request is longer than " +
                                        std::to_string(CPPHTTPLIB_HEADER_MAX_LENGTH) + " bytes"};
            return cut_off(ptr, size);
          }
          last_ = byte;
        } else if (lines_ > 0 && line_bytes_ == 1 && last_ == '\r') {
          in_head_ = false;
          n = i + 1;
          break;
        } else {
          ++lines_;
          line_bytes_ = 0;
        }
      }
    }
    std::memcpy(ptr, buffer_ + off_, n);
    off_ += n;
    return in_body ? counted(static_cast<ssize_t>(n)) : static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n = 0;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(getpeername, fd_, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(getsockname, fd_, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // When the bytes being read must have come: the head's deadline, or the body's, which moves
  // on with every byte it brings.
  Clock::time_point deadline() const {
    if (in_head_) return head_deadline_;
    const auto paid = std::chrono::milliseconds(static_cast<int64_t>(body_bytes_) * 1000 /
                                                limits_.body_min_bytes_per_s);
    return *body_start_ + limits_.body_grace + paid;
  }

  // `n` bytes of the body given to the library, or a refusal once the body passes the payload
  // limit: cpp-httplib 0.11 bounds only a body with a Content-Length, and kept a chunked one of
  // any size (its chunks' framing counts here too).
  ssize_t counted(ssize_t n) {
    body_bytes_ += static_cast<size_t>(n);
    if (body_bytes_ <= body_max_) return n;
    t_refusal = too_large();
    return -1;
  }

  // Why a parsed head is refused, if it is. First its body's framing, when it cannot be trusted
  // (RFC 9112, 6.1 and 6.3): a length that is not one or two that disagree, a coding the library
  // does not read (it would wait for a body that never ends), or a length beside a coding. Two
  // parties reading such a request differently is how requests are smuggled past a front proxy.
  // Then an expectation the server does not meet, and a body over the limit.
  std::optional<ReadRefusal> head_refusal(const httplib::Request& req) const {
    const auto malformed = [](const std::string& message) {
      return ReadRefusal{400, "malformed_request", message};
    };
    const auto lengths = req.headers.equal_range("Content-Length");
    std::optional<uint64_t> length;
    for (auto it = lengths.first; it != lengths.second; ++it) {
      const std::string& text = it->second;
      uint64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      const bool digits =
          !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) return malformed("the request's Content-Length '" + text + "' is not a length");
      if (error == std::errc::result_out_of_range) return too_large();
      if (length && *length != value) {
        return malformed("the request has two Content-Length headers that disagree (" +
                         std::to_string(*length) + " and " + text + ")");
      }
      length = value;
    }
    if (req.has_header("Transfer-Encoding")) {
      const std::string coding = ascii_lower(req.get_header_value("Transfer-Encoding"));
      if (coding != "chunked") {
        return ReadRefusal{501, "unsupported_transfer_encoding",
                           "the request body is sent with Transfer-Encoding '" +
                               req.get_header_value("Transfer-Encoding") +
                               "': this server reads 'chunked' alone"};
      }
      if (length) {
        return malformed("the request has both Content-Length and Transfer-Encoding: send one");
      }
    }
    // RFC 9110, 10.1.1: an expectation other than 100-continue is not met (the library would
    // read the body the client holds back until it, and then the read, timed out).
    if (req.has_header("Expect") && ascii_lower(req.get_header_value("Expect")) != "100-continue") {
      return ReadRefusal{417, "expectation_failed",
                         "the request expects '" + req.get_header_value("Expect") +
                             "': this server meets only 100-continue"};
    }
    if (length && *length > body_max_) return too_large();
    return std::nullopt;
  }

  ReadRefusal too_large() const {
    return {413, "request_too_large",
            "the request body is larger than the server's limit of " + std::to_string(body_max_) +
                " bytes"};
  }

  std::string too_slow() const {
    if (in_head_) {
      return "the request's head (its request line and headers) did not arrive within " +
             duration_words(limits_.head_time);
    }
    return "the request's body came slower than " + std::to_string(limits_.body_min_bytes_per_s) +
           " bytes a second after its first " + duration_words(limits_.body_grace) + " (" +
           std::to_string(body_bytes_) + " bytes had come)";
  }

  // What a refused head reads from here on: nothing, but for a request line cut off, which gets
  // its line end, so that the library finishes reading it and answers (its header lines then
  // fail to come): it answers nothing for a request line it never finished.
  ssize_t cut_off(char* ptr, size_t size) {
    if (lines_ > 0 || ending_ == 2 || size == 0) return -1;
    *ptr = "\r\n"[ending_++];
    return 1;
  }

  int fd_;
  RequestLimits limits_;
  size_t body_max_;
  std::chrono::milliseconds read_timeout_, write_timeout_;
  char buffer_[4096];
  size_t off_ = 0, size_ = 0;
  bool in_head_ = false;
  size_t head_bytes_ = 0, lines_ = 0, line_bytes_ = 0;
  char last_ = 0;
  int ending_ = 0;
  Clock::time_point head_deadline_;
  // From the first read of the body on: when it started, and the bytes it brought.
  std::optional<Clock::time_point> body_start_;
  size_t body_bytes_ = 0;
};

}  // namespace

std::optional<ReadRefusal> read_refusal() { return t_refusal; }

void end_connection_after_answer() { t_end_after_answer = true; }

HttpServer::HttpServer(RequestLimits limits) : limits_(limits) {
  set_pre_routing_handler(nullptr);
  set_post_routing_handler(nullptr);
  // A client that waits for "100 Continue" before it sends the body gets the refusal instead.
  set_expect_100_continue_handler([](const httplib::Request&, httplib::Response& res) {
    if (t_refusal) res.status = t_refusal->status;
    return t_refusal ? t_refusal->status : 100;
  });
}

HttpServer& HttpServer::set_pre_routing_handler(HandlerWithResponse handler) {
  pre_routing_ = std::move(handler);
  httplib::Server::set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        // A request refused while its head was read reaches no route: the error handler words
        // the refusal (read_refusal()).
        if (t_refusal) {
          res.status = t_refusal->status;
          return HandlerResponse::Handled;
        }
        // The library inflates a gzip or deflate body with no bound on what it inflates to (the
        // payload limit counts the bytes sent: 400 KB of gzip took a server past 15 GB), on every
        // route and method, one it has no route for included. So a body with any Content-Encoding
        // but identity is left unread with status 415, before any route, as vLLM and
        // llama-server decode none either; the error handler words it (content_coding_refusal).
        if (has_content_coding(req)) {
          res.status = 415;
          end_connection_after_answer();
          return HandlerResponse::Handled;
        }
        return pre_routing_ ? pre_routing_(req, res) : HandlerResponse::Unhandled;
      });
  return *this;
}

HttpServer& HttpServer::set_post_routing_handler(Handler handler) {
  post_routing_ = std::move(handler);
  httplib::Server::set_post_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        // The library keeps an HTTP/1.0 connection only when asked in these words; else it closes
        // it after the answer, though the answer said Keep-Alive.
        const bool http10 = req.version == "HTTP/1.0";
        if (http10 && res.is_chunked_content_provider_) {
          // HTTP/1.0 has no chunked coding (RFC 9112, 6.1): a stream goes out as it is made,
          // and the connection's end is the stream's.
          res.is_chunked_content_provider_ = false;
          res.headers.erase("Transfer-Encoding");
          t_end_after_answer = true;
        }
        if (ends_after_answer() || (http10 && req.get_header_value("Connection") != "Keep-Alive")) {
          res.headers.erase("Keep-Alive");
          res.headers.erase("Connection");
          res.set_header("Connection", "close");
        }
        if (post_routing_) post_routing_(req, res);
      });
  return *this;
}

HttpServer& HttpServer::leave_ranges_to_upstream() {
  apply_ranges_ = false;
  return *this;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  using std::chrono::milliseconds, std::chrono::seconds, std::chrono::microseconds;
  const auto timeout = [](time_t s, time_t us) {
    return std::chrono::duration_cast<milliseconds>(seconds(s) + microseconds(us));
  };
  BoundedStream stream(sock, limits_, payload_max_length_,
                       timeout(read_timeout_sec_, read_timeout_usec_),
                       timeout(write_timeout_sec_, write_timeout_usec_));
  bool ok = false;
  t_socket = sock;
  for (size_t left = keep_alive_max_count_; svr_sock_ != INVALID_SOCKET && left > 0 &&
                                            stream.next_request(seconds(keep_alive_timeout_sec_));
       --left) {
    bool closed = false;
    // The library calls this once it has read and parsed the request's head, before routing.
    ok = process_request(stream, left == 1, closed, [this, &stream](httplib::Request& req) {
      stream.head_parsed(req, apply_ranges_);
    });
    if (!ok || closed) break;
    if (ends_after_answer()) {
      // Closing with the client's bytes unread would reset it, and a reset can drop the answer
      // before the client reads it, so this side is ended first and what still comes is read
      // and dropped until the client closes too, for a few seconds at most.
      ::shutdown(sock, SHUT_WR);
      const auto until = Clock::now() + kLingerAfterUnreadHead;
      char drop[4096];
      while (wait_for(sock, POLLIN, std::chrono::ceil<milliseconds>(until - Clock::now())) &&
             ::recv(sock, drop, sizeof(drop), 0) > 0) {
      }
      break;
    }
  }
  t_socket = -1;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

int connection_socket() { return t_socket; }

BaseUrl split_base_url(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (slash == std::string::npos) return {url, ""};
  std::string path = url.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  return {url.substr(0, slash), path};
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void check_port(int port) {
  if (port < 0 || port > 65535) {
    throw ValueError("--port must be between 0 (any free port) and 65535, got " +
                     std::to_string(port));
  }
}

void check_max_body_bytes(int64_t bytes) {
  if (bytes < 1024) {
    throw ValueError("--max-body-bytes must be at least 1024, got " + std::to_string(bytes) +
                     ": below that even a short request's body is refused");
  }
}

int bind_listener(httplib::Server& http, const std::string& host, int port) {
  // httplib hands every socket it creates for the listener to the socket options, the last one
  // being the one bound. Its default sets SO_REUSEPORT, which lets a second server bind a port
  // that one already listens on (the kernel then shares the connections between them); only
  // SO_REUSEADDR is set, so a port in use is refused and a restart may still bind a port whose old
  // connections linger in TIME_WAIT.
  int listening = -1;
  http.set_socket_options([&listening](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listening = sock;
  });
  int bound = -1;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    bound = port;
  }
  http.set_socket_options(httplib::default_socket_options);
  if (bound <= 0 || ::listen(listening, kListenBacklog) != 0) return -1;
  return bound;
}

}  // namespace torchtpu::server
