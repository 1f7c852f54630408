#include "cli/mcp_command.h"

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "server/mcp.h"
#include "server/media_parts.h"

namespace torchtpu::cli {

void add_mcp_command(CLI::App& app) {
  struct Options {
    std::string url = "http://127.0.0.1:8015";
    std::string api_key;
    server::MediaLimits media;
  };
  auto options = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "mcp",
      "MCP server on stdin/stdout (tools ask, stream, engine_info, endpoint_status, "
      "serving_metrics) in front of a torchtpu-cpp server or proxy");
  cmd->add_option("--url", options->url, "The server's URL")->capture_default_str();
  cmd->add_option("--api-key", options->api_key,
                  "The server's API key (default: $TORCHTPU_API_KEY)");
  // ask and stream read the files their images and audio arguments name (any file this process
  // may read: it runs as the user), within these limits; the server checks its own again.
  cmd->add_option("--max-media", options->media.max_items,
                  "Image and audio files one ask or stream call may name")
      ->capture_default_str();
  cmd->add_option("--max-image-bytes", options->media.max_image_bytes,
                  "Largest image file ask and stream read")
      ->capture_default_str();
  cmd->add_option("--max-audio-bytes", options->media.max_audio_bytes,
                  "Largest audio file (WAV or MP3) ask and stream read")
      ->capture_default_str();
  cmd->callback([options] {
    default_from_env(options->api_key, "TORCHTPU_API_KEY");
    server::check_media_limits(options->media);
    server::McpTarget target{options->url,
                             options->api_key.empty() ? "" : "Bearer " + options->api_key};
    target.files.scope = server::McpFiles::Scope::kAny;
    target.files.max_items = options->media.max_items;
    target.files.max_image_bytes = options->media.max_image_bytes;
    target.files.max_audio_bytes = options->media.max_audio_bytes;
    std::cerr << "torchtpu-cpp mcp: tools for " << options->url << " on stdin/stdout\n";
    server::serve_mcp_stdio(target, std::cin, std::cout);
  });
}

}  // namespace torchtpu::cli
