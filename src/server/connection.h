// Whether the client of a request is still there. cpp-httplib 0.11 (Debian 12) gives handlers no
// handle on the connection, so the socket is found by its addresses: the open socket whose local
// and peer address and port are the request's. A TCP connection's four values are unique among live
// sockets, and the socket stays open until the handler and its content provider return, so the
// descriptor found remains this connection's for as long as the request is served.
//
// And the listening socket's accept queue: see bind_listener.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/ascii.h"

namespace torchtpu::server {

// The descriptor of the connection whose request this thread is answering, in a handler of an
// HttpServer (a streamed answer's content provider included): it stays open until that returns.
// -1 on any other thread. The handler runs on the thread that reads and writes the connection, so
// nothing needs looking up, and a descriptor another thread is closing is never touched.
int connection_socket();

// True once the peer has closed or reset the connection (poll + recv(MSG_PEEK), as newer
// cpp-httplib does for Request::is_connection_closed). Never blocks; false for fd < 0.
bool peer_closed(int fd);

// The accept queue bind_listener asks for (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 1024;

// What went wrong with a request this process made (to an upstream, a server), in words:
// "connection refused or unreachable" rather than httplib's enum name "Connection".
inline std::string describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "connection refused or unreachable";
    case httplib::Error::ConnectionTimeout: return "no connection within the timeout";
    case httplib::Error::Read: return "the connection closed or timed out while reading";
    case httplib::Error::Write: return "the connection closed while writing";
    case httplib::Error::Canceled: return "cancelled";
    case httplib::Error::SSLConnection:
      return "the TLS handshake failed (an https:// URL for a server that speaks http://?)";
    case httplib::Error::SSLLoadingCerts: return "the system's CA certificates could not be loaded";
    case httplib::Error::SSLServerVerification:
      return "the server's TLS certificate could not be verified";
    case httplib::Error::ExceedRedirectCount: return "too many redirects";
    default: return httplib::to_string(error);
  }
}

// A server's base URL as httplib::Client takes it: scheme, host and port (`origin`), and the
// path its routes sit under (`path`, "" or "/..." without a trailing slash: a server behind a
// reverse proxy at https://host/llm), which every request's path is put after.
struct BaseUrl {
  std::string origin;
  std::string path;
};
BaseUrl split_base_url(const std::string& url);

// Called by a handler of an HttpServer that answers without reading a body the request has (a
// 415, a 413): where the next request on the connection starts is then unknown, so the answer
// ends the connection, as after a head that could not be read.
void end_connection_after_answer();

// Whether the request's body comes with a Content-Encoding other than identity, which HttpServer
// refuses with 415 unread.
inline bool has_content_coding(const httplib::Request& req) {
  const std::string coding = ascii_lower(req.get_header_value("Content-Encoding"));
  return !coding.empty() && coding != "identity";
}

// What HttpServer's 415 says, naming the coding sent.
inline std::string content_coding_refusal(const httplib::Request& req) {
  return "the request body is sent with Content-Encoding '" +
         req.get_header_value("Content-Encoding") +
         "': this server reads request bodies uncompressed only";
}

// Registers `handler` for POST requests to `pattern`, as http.Post does but for this:
// cpp-httplib 0.11 reads the body of a POST with neither Content-Length nor Transfer-Encoding
// until the connection closes, where RFC 9112 (6.3) says it has none, so `curl -X POST URL` (the
// calls llama.cpp and vLLM document for /slots, /sleep, /wake_up) waited out the read timeout for
// a 400. Here the body is read only when the request says it has one: whole, or a form's parts
// into `files` as the library reads them. A body the library refuses (past the payload limit, cut
// short) leaves its status, 413 or 400, for the error handler.
inline void handle_post(httplib::Server& http, const std::string& pattern,
                        httplib::Server::Handler handler) {
  http.Post(pattern,
            [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& read) {
              httplib::Request whole = req;
              if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
                bool ok = false;
                if (req.is_multipart_form_data()) {
                  auto part = whole.files.end();
                  ok = read(
                      [&](const httplib::MultipartFormData& file) {
                        part = whole.files.emplace(file.name, file);
                        return true;
                      },
                      [&](const char* data, size_t size) {
                        part->second.content.append(data, size);
                        return true;
                      });
                } else {
                  ok = read([&](const char* data, size_t size) {
                    whole.body.append(data, size);
                    return true;
                  });
                }
                if (!ok) return;
              }
              handler(whole, res);
            });
}

// A request's bounds (see HttpServer). Its head: its bytes, the request line and header lines with
// their line ends, and the time from its first byte to its last. Its body: once the first
// `body_grace` of reading it have passed, it must have come at `body_min_bytes_per_s` on average
// (Apache's mod_reqtimeout: body=20,MinRate=500), so a body of any size may take as long as its
// bytes need, and no sender holds a thread much longer than that.
struct RequestLimits {
  size_t head_bytes = 64 * 1024;
  std::chrono::milliseconds head_time{20'000};
  std::chrono::milliseconds body_grace{20'000};
  int64_t body_min_bytes_per_s = 500;
};

// Why the request being answered on this thread was refused while it was read, if it was: what
// an error handler of an HttpServer answers instead of the status the library gives (400, or 414
// for a request line cut off past its limit).
struct ReadRefusal {
  // 431: a head too large; 413: a body too large; 408: too slow; 400: a body's framing unclear;
  // 501: a transfer coding other than chunked; 417: an expectation other than 100-continue
  int status;
  // request_header_fields_too_large, request_too_large, request_timeout, malformed_request,
  // unsupported_transfer_encoding, expectation_failed
  std::string code;
  std::string message;
};
std::optional<ReadRefusal> read_refusal();

// cpp-httplib 0.11 reads a request with no bound on its head's size or on the time a request
// takes: a line is buffered whole before its length is checked (a request line or header line of
// gigabytes is kept in memory), header lines are not counted, and a client sending a byte every
// few seconds holds an HTTP thread for as long as it likes (each read waits 5 s at most, nothing
// bounds them all), in the head or in the body. An HttpServer reads every connection through a
// stream that bounds the head and the body's pace by `limits`: past them, read_refusal() names
// why and the library is left to answer through the error handler. The payload limit bounds the
// body's size, chunked or not (the library bounds only a Content-Length, and reads all of a body
// larger than it before answering 413: here it is refused unread). One stream serves a
// connection's requests in turn, so bytes of a pipelined request read with the one before are
// kept for it; after a request that could not be read (refused, malformed, a request line too
// long), or a body left unread, the connection is closed with the answer. A body sent with a
// Content-Encoding other than identity is refused with 415 before any route, unread.
//
// An answer that ends its connection says so (`Connection: close`, without the `Keep-Alive` the
// library adds to every answer of a connection it means to keep), so that a client does not send
// its next request on a connection about to close.
class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(RequestLimits limits = {});

  // Hides the library's: `handler` sees only requests that were refused neither as they were read
  // nor for their body's content coding.
  HttpServer& set_pre_routing_handler(HandlerWithResponse handler);
  // Hides the library's: `handler` runs after the headers of an answer that ends its connection
  // are set, as the library's runs after its own headers.
  HttpServer& set_post_routing_handler(Handler handler);
  // A proxy's: a request's Range goes on to the upstream, whose answer (a 206 of the part asked
  // for) is passed on as it comes; the library would cut that part again.
  HttpServer& leave_ranges_to_upstream();

 private:
  bool process_and_close_socket(socket_t sock) override;

  RequestLimits limits_;
  bool apply_ranges_ = true;
  HandlerWithResponse pre_routing_;
  Handler post_routing_;
};

// ValueError unless `port` is a TCP port or 0 (a larger one would wrap to another port).
void check_port(int port);

// ValueError unless `bytes`, a server's largest request body, holds a short request.
void check_max_body_bytes(int64_t bytes);

// Binds `http` to host:port (port 0: any free port) as bind_to_port / bind_to_any_port do, and
// returns the port, or -1 if it cannot bind (a port another server listens on included).
// cpp-httplib 0.11 listens with a backlog of 5, fixed in Debian's compiled library: a burst of
// more new connections than the listener thread accepts at once overflows the kernel's queue, the
// handshake's last packet is dropped, and the client waits out a retransmit (a second or more).
// A client that gives up within that time never reaches the server, so its request is neither
// answered nor counted (the soak's lost cancel under load). The listening socket is therefore put
// to listen() once more with kListenBacklog, which Linux takes as the new queue length.
int bind_listener(httplib::Server& http, const std::string& host, int port);

}  // namespace torchtpu::server
