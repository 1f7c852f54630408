#include "cli/serve_command.h"

#include <cstdlib>
#include <memory>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "server/server.h"

namespace torchtpu::cli {

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<server::ServeOptions>();
  auto* cmd = app.add_subcommand("serve",
                                 "OpenAI-compatible HTTP server (no --model: "
                                 "a demo checkpoint with random weights)");
  cmd->add_option("--model", options->model_dir,
                  "Checkpoint directory or Hub id (org/name[@rev]), downloaded into the Hub cache "
                  "while /health answers 503");
  cmd->add_option("--emb4", options->engine.emb4_dir,
                  "Directory or Hub id with int4 vocabulary tables");
  cmd->add_option("--model-id", options->model_id,
                  "Id the model is served under (default: the first --served-model-name, else "
                  "the directory's name)");
  cmd->add_option("--served-model-name", options->served_model_names,
                  "Another name requests may use for the model; repeatable, all listed by "
                  "/v1/models");
  cmd->add_option("--host", options->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", options->port, "Port (0: any free port)")->capture_default_str();
  add_engine_settings(*cmd, options->engine);
  cmd->add_option("--api-key", options->api_key,
                  "Require 'Authorization: Bearer KEY' on everything but the probes (/health, "
                  "/livez, /ping), /metrics without --metrics-auth, and the chat page, which asks "
                  "for the key (default: $TORCHTPU_API_KEY)");
  cmd->add_flag("--metrics-auth", options->metrics_auth, "/metrics needs the API key too");
  cmd->add_flag("--no-slots", options->no_slots,
                "GET /slots answers 501: which requests run where stays unseen");
  cmd->add_option("--slot-save-path", options->slot_save_path,
                  "Folder of the prefix state files of POST /slots/{id}?action=save|restore "
                  "(made if missing); without it slot actions answer 501");
  cmd->add_flag("--runtime-lora", options->runtime_lora,
                "POST /v1/load_lora_adapter and /v1/unload_lora_adapter load and unload LoRA "
                "adapters from this machine's directories while serving (vLLM's runtime LoRA "
                "updating); without it they answer 403");
  cmd->add_option("--metrics-compat", options->metrics_compat,
                  "none | vllm: also export the load gauges under vLLM's names")
      ->capture_default_str();
  cmd->add_option("--drain-grace", options->drain_grace_s,
                  "Seconds after SIGTERM during which /health answers 503 while requests are "
                  "still served")
      ->capture_default_str();
  cmd->add_option("--sleep-idle-seconds", options->sleep_idle_s,
                  "Seconds without a request after which the engine frees its weights and "
                  "caches until the next request reloads them (-1: never)")
      ->capture_default_str();
  cmd->add_flag("--sleep-preserve-cache", options->sleep_preserve_cache,
                "Keep the prefix cache while asleep (at most --cache-mb), so a conversation taken "
                "up again reads only its new turn");
  cmd->add_option("--parallel", options->parallel,
                  "Requests decoded together, each with its own KV cache (more wait)")
      ->capture_default_str();
  cmd->add_option("--max-queue", options->max_queue, "Requests that may wait for the engine")
      ->capture_default_str();
  cmd->add_option("--cache-mb", options->cache_mb,
                  "Prefix cache budget in MiB: finished requests' KV reused by requests that "
                  "start with the same tokens (0: off)")
      ->capture_default_str();
  cmd->add_option("--step-tokens", options->step_tokens,
                  "Tokens one step may put through the model while requests decode: one per "
                  "decoding request, the rest read prompts in chunks (bounds how long a prompt "
                  "being read holds the others' next token; 0: 128 + --parallel)")
      ->capture_default_str();
  cmd->add_option("--pass-rows", options->pass_rows,
                  "Rows, padding included, one forward pass may take when prompts arriving "
                  "together are read together (1: each on its own; 0: 1 on the CPU, no limit on "
                  "accelerators)")
      ->capture_default_str();
  cmd->add_option("--read-every", options->read_every,
                  "Decode steps between host reads (above 1 needs --parallel 1)")
      ->capture_default_str();
  auto* draft_max = add_draft_flags(*cmd, options->draft);
  cmd->add_option("--reasoning-budget", options->reasoning_budget,
                  "Tokens a reply may think before its thinking block is closed for it, unless "
                  "the request sets thinking_token_budget or reasoning_budget_tokens (-1: no "
                  "limit)")
      ->capture_default_str();
  cmd->add_option("--reasoning-budget-message", options->reasoning_budget_message,
                  "Text written into the thought when a budget closes it, just before <channel|> "
                  "(default: none, the thought is closed straight away)");
  cmd->add_flag("--constrain-tools", options->constrain_tools,
                "Hold tool calls to the declared tools' schemas with tool_choice auto too "
                "(required and named functions always are)");
  cmd->add_option("--max-body-bytes", options->max_body_bytes, "Largest request body accepted")
      ->capture_default_str();
  cmd->add_option("--max-media", options->media.max_items,
                  "Images and audio clips a request may hold")
      ->capture_default_str();
  cmd->add_option("--max-image-bytes", options->media.max_image_bytes,
                  "Largest image accepted, as encoded (a data: URL's base64 counts in "
                  "--max-body-bytes too)")
      ->capture_default_str();
  cmd->add_option("--max-audio-bytes", options->media.max_audio_bytes,
                  "Largest audio file (WAV or MP3) accepted")
      ->capture_default_str();
  cmd->add_option("--image-tokens", options->media.image_tokens,
                  "An image's soft tokens when a request's detail is auto: 70, 140, 280, 560 or "
                  "1120 (detail low is 70, high 1120)")
      ->capture_default_str();
  cmd->add_flag("--allow-media-urls", options->media.allow_urls,
                "Fetch http(s) image URLs that requests name (off: only data: URLs)");
  cmd->add_option("--media-url-timeout", options->media.url_timeout_s,
                  "Seconds one image URL fetch may take in all")
      ->capture_default_str();
  cmd->add_option("--mcp-media-dir", options->mcp_media_dir,
                  "A directory whose files the MCP tools at /mcp may read for their images and "
                  "audio (paths resolved, only inside it; default: none, file paths refused)");
  cmd->callback([options, draft_max] {
    if (draft_max->count() == 0) {
      options->draft.tokens = default_draft_tokens(options->engine.draft_model);
    }
    default_from_env(options->api_key, "TORCHTPU_API_KEY");
    const int code = server::run(*options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace torchtpu::cli
