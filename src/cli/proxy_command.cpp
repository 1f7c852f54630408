#include "cli/proxy_command.h"

#include <cstdlib>
#include <memory>

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
  cmd->callback([options] {
    const int code = server::run_proxy(*options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace torchtpu::cli
