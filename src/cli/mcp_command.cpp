#include "cli/mcp_command.h"

#include <cstdlib>
#include <iostream>
#include <memory>

#include "server/mcp.h"

namespace torchtpu::cli {

void add_mcp_command(CLI::App& app) {
  struct Options {
    std::string url = "http://127.0.0.1:8015";
    std::string api_key;
  };
  auto options = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "mcp",
      "MCP server on stdin/stdout (tools ask, stream, engine_info, endpoint_status, "
      "serving_metrics) in front of a torchtpu-cpp server or proxy");
  cmd->add_option("--url", options->url, "The server's URL")->capture_default_str();
  cmd->add_option("--api-key", options->api_key,
                  "The server's API key (default: $TORCHTPU_API_KEY)");
  cmd->callback([options] {
    if (options->api_key.empty()) {
      if (const char* key = std::getenv("TORCHTPU_API_KEY")) options->api_key = key;
    }
    server::McpTarget target{options->url,
                             options->api_key.empty() ? "" : "Bearer " + options->api_key};
    std::cerr << "torchtpu-cpp mcp: tools for " << options->url << " on stdin/stdout\n";
    server::serve_mcp_stdio(target, std::cin, std::cout);
  });
}

}  // namespace torchtpu::cli
