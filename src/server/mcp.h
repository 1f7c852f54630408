// A Model Context Protocol (MCP) tool server in front of one of our OpenAI-compatible servers:
// tools `ask`, `stream`, `engine_info`, `endpoint_status` and `serving_metrics`, each an HTTP
// client of the server's base URL, so the same tools serve Streamable HTTP at /mcp (on the server
// and the proxy) and stdio (`torchtpu-cpp mcp --url URL`). Protocol revisions 2025-06-18 and
// 2025-11-25. ask and stream take image and WAV files by path (`images`, `audio`), read by the
// MCP server's own process as McpFiles allows and sent on as data: URL / input_audio parts.
// Nothing here needs libtorch: the mcp fuzz harness compiles mcp.cpp with the server's other
// sources that need none.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "media/kinds.h"

namespace torchtpu::server {

using ojson = nlohmann::ordered_json;

// Which files ask and stream may read for their `images` and `audio` arguments. A path names a
// file on the machine that runs the MCP server, which is the caller's own machine only over stdio.
struct McpFiles {
  enum class Scope {
    kNone,       // every path refused before the file system is touched (/mcp by default)
    kAny,        // any file the process can read (stdio: the user's own process)
    kDirectory,  // only regular files whose realpath lies inside `directory` (--mcp-media-dir)
  };
  Scope scope = Scope::kNone;
  std::string directory;  // kDirectory: the directory's realpath (mcp_media_directory)
  std::string given;      // kDirectory: the directory as named, absolute and lexically normal
  // Checked before a file is read: more files, or a larger one, is refused.
  int64_t max_items = kMaxMediaItems;          // --max-media
  int64_t max_image_bytes = int64_t{8} << 20;  // --max-image-bytes
  int64_t max_audio_bytes = int64_t{8} << 20;  // --max-audio-bytes
  // kNone: what the refusal tells the caller to do instead.
  std::string refusal =
      "this MCP server is reached over HTTP and reads no files unless `torchtpu-cpp serve` was "
      "started with --mcp-media-dir DIR (then only files inside DIR); over stdio "
      "(`torchtpu-cpp mcp`) the tools read the caller's own files";
};

// McpFiles of Scope::kDirectory for `dir`: ValueError naming --mcp-media-dir when it does not
// exist or is not a directory.
McpFiles mcp_media_directory(const std::string& dir);

// The server the tools call.
struct McpTarget {
  std::string base_url;       // http://host:port; a trailing /v1 or / is ignored
  std::string authorization;  // the Authorization header to send; empty for none
  McpFiles files;             // what `images` and `audio` may name; default: nothing
};

// A server's URL as scheme://host:port: a trailing / or /v1 dropped, http:// added without a
// scheme. The MCP tools and `torchtpu-cpp launch` reach the server there.
std::string origin_of(std::string url);

// Sends one JSON-RPC notification to the client; false once the client is gone.
using McpNotify = std::function<bool(const ojson& notification)>;

// The tool calls in flight on one transport, by key (McpCallContext::key): a
// notifications/cancelled that names one stops it at its next streamed chunk.
class McpCalls {
 public:
  // A call in flight, known to its McpCalls (none: a call nothing cancels) while it lives.
  class Call {
   public:
    Call(McpCalls* calls, std::string key);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    bool cancelled() const { return flag_ && *flag_; }

   private:
    McpCalls* calls_;
    std::string key_;
    std::shared_ptr<std::atomic<bool>> flag_;
  };

  void cancel(const std::string& key);

 private:
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> flags_;
};

// Where a message came from, for its tool calls' cancellation.
struct McpCallContext {
  McpCalls* calls = nullptr;  // none: notifications/cancelled stops nothing
  // Whose request ids these are (an HTTP session id; empty for stdio or no session): one
  // client's notifications/cancelled stops only its own calls.
  std::string scope;
  std::function<bool()> client_gone;  // true once the answer has nobody to go to; may be empty
  std::string key(const ojson& id) const { return scope + "\n" + id.dump(); }
};

// Answers one JSON-RPC message: the response to a request, nullopt for a notification or a
// response. A tools/call carrying params._meta.progressToken gets notifications/progress through
// `notify` while it runs (the `stream` tool sends one per streamed chunk, with the chunk's text).
// A tools/call of ask or stream stops when notifications/cancelled names it through `context`, or
// when context.client_gone says so, and the server cancels its decode. Tool failures are results
// with isError true; malformed requests, unknown methods and unknown tools are JSON-RPC errors.
std::optional<ojson> handle_mcp_message(const McpTarget& target, const ojson& message,
                                        const McpNotify& notify,
                                        const McpCallContext& context = {});

// MCP over stdio: one JSON message per line read from `in`, answers and notifications written to
// `out` one per line. Tool calls run on threads of their own while the next lines are read, so
// that a notifications/cancelled reaches them. Returns when `in` ends, once the calls in flight
// have answered.
void serve_mcp_stdio(const McpTarget& target, std::istream& in, std::ostream& out);

// Streamable HTTP at /mcp: POST carries one JSON-RPC message and is answered with JSON, or with an
// SSE stream when the call reports progress; GET and DELETE get 405 (no server-initiated stream;
// a session ends with its client). initialize's answer carries an Mcp-Session-Id, which scopes
// the ids a notifications/cancelled names; a call also stops when its POST's connection closes. The
// tools call the server that received the request, at the address it was received on, with the
// request's Authorization header. `guard` wraps the POST handler (the server's authentication);
// empty for none. `files`: what the tools may read (default: nothing).
void add_mcp_routes(
    httplib::Server& http,
    const std::function<httplib::Server::Handler(httplib::Server::Handler)>& guard = {},
    McpFiles files = {});

}  // namespace torchtpu::server
