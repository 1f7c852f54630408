// A Model Context Protocol (MCP) tool server in front of one of our OpenAI-compatible servers:
// tools `ask`, `stream`, `engine_info`, `endpoint_status` and `serving_metrics`, each an HTTP
// client of the server's base URL, so the same tools serve Streamable HTTP at /mcp (on the server
// and the proxy) and stdio (`torchtpu-cpp mcp --url URL`). Protocol revisions 2025-06-18 and
// 2025-11-25.
#pragma once

#include <httplib.h>

#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace torchtpu::server {

using ojson = nlohmann::ordered_json;

// The server the tools call.
struct McpTarget {
  std::string base_url;       // http://host:port; a trailing /v1 or / is ignored
  std::string authorization;  // the Authorization header to send; empty for none
};

// Sends one JSON-RPC notification to the client; false once the client is gone.
using McpNotify = std::function<bool(const ojson& notification)>;

// Answers one JSON-RPC message: the response to a request, nullopt for a notification or a
// response. A tools/call carrying params._meta.progressToken gets notifications/progress through
// `notify` while it runs (the `stream` tool sends one per streamed chunk, with the chunk's text).
// Tool failures are results with isError true; malformed requests, unknown methods and unknown
// tools are JSON-RPC errors.
std::optional<ojson> handle_mcp_message(const McpTarget& target, const ojson& message,
                                        const McpNotify& notify);

// MCP over stdio: one JSON message per line read from `in`, answers and notifications written to
// `out` one per line. Returns when `in` ends.
void serve_mcp_stdio(const McpTarget& target, std::istream& in, std::ostream& out);

// Streamable HTTP at /mcp: POST carries one JSON-RPC message and is answered with JSON, or with an
// SSE stream when the call reports progress; GET and DELETE get 405 (no server-initiated stream,
// no sessions). The tools call the server that received the request, at the address it was
// received on, with the request's Authorization header. `guard` wraps the POST handler (the
// server's authentication); empty for none.
void add_mcp_routes(
    httplib::Server& http,
    const std::function<httplib::Server::Handler(httplib::Server::Handler)>& guard = {});

}  // namespace torchtpu::server
