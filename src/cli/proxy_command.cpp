#include "cli/proxy_command.h"

#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "server/proxy.h"

namespace torchtpu::cli {

void add_proxy_command(CLI::App& app) {
  auto options = std::make_shared<server::ProxyOptions>();
  auto* cmd = app.add_subcommand(
      "proxy", "Local proxy: the chat page and /mcp here, everything else forwarded upstream");
  cmd->add_option("--host", options->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", options->port, "Port (0: any free port)")->capture_default_str();
  auto* url = cmd->add_option("--upstream", options->upstream, "The upstream server's URL");
  auto* command = cmd->add_option(
      "--upstream-cmd", options->upstream_cmd,
      "A shell command whose last output line is the upstream URL; run again when the upstream "
      "stops answering");
  url->excludes(command);
  cmd->add_option("--upstream-cmd-timeout", options->upstream_cmd_timeout_s,
                  "Seconds the upstream command may run before it is killed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-body-bytes", options->max_body_bytes,
                  "Largest request body accepted (the proxy holds each whole before forwarding "
                  "it; raise it with the upstream's)")
      ->capture_default_str();
  cmd->add_option("--api-key", options->api_key,
                  "The proxy's own key: require 'Authorization: Bearer KEY' on everything but the "
                  "chat page and /health (default: $TORCHTPU_PROXY_API_KEY)");
  cmd->add_option("--upstream-api-key", options->upstream_api_key,
                  "The key the proxy sends upstream in place of the client's; needs --api-key "
                  "(default: $TORCHTPU_UPSTREAM_API_KEY)");
  cmd->callback([options] {
    default_from_env(options->api_key, "TORCHTPU_PROXY_API_KEY");
    default_from_env(options->upstream_api_key, "TORCHTPU_UPSTREAM_API_KEY");
    const int code = server::run_proxy(*options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace torchtpu::cli
