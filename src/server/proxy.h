// A local proxy in front of one of our servers (the seeds' laptop shim): serves the chat page and
// /mcp itself and forwards every other request, streams included, to the upstream. A client that
// disconnects closes the upstream request, so the decode there is cancelled. The upstream is a
// fixed URL or the last line a shell command prints (e.g. a gcloud query for a VM's address); when
// the upstream stops answering the command runs again and the request is retried once, if it is
// idempotent or never reached the upstream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace torchtpu::server {

struct ProxyOptions {
  std::string host = "127.0.0.1";
  int port = 8015;           // 0 picks a free port
  std::string upstream;      // http://host:port of the server
  std::string upstream_cmd;  // or a command (run by /bin/sh) whose last output line is that URL
  // The longest the command may run (then it is killed): a cloud CLI's lookup takes seconds, and
  // one that hangs would hold every request, /health included, that waits for the address.
  int upstream_cmd_timeout_s = 30;
  int upstream_timeout_s = 3600;  // the longest an upstream answer may pause
  // Larger request bodies get 413 here (serve's default; an upstream with a larger
  // --max-body-bytes needs this one raised too).
  int64_t max_body_bytes = 8 << 20;
  // Non-empty: the proxy's own key. Every request but the chat page and /health must carry
  // "Authorization: Bearer KEY", and that header is not passed on.
  std::string api_key;
  // Non-empty: sent upstream as "Authorization: Bearer KEY" in place of the client's header. Needs
  // api_key, or anyone who reaches the proxy would use this key.
  std::string upstream_api_key;
  // Called once the port is bound, with its number.
  std::function<void(int port)> on_listening;
};

// Serves until SIGINT or SIGTERM; returns the exit code. Prints one line
// "proxy on http://HOST:PORT for UPSTREAM" once it listens. Throws ValueError for options that
// name no upstream or give an upstream key without a key of the proxy's own, std::runtime_error if
// the address cannot be bound.
int run_proxy(const ProxyOptions& options);

}  // namespace torchtpu::server
