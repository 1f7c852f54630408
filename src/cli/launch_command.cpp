#include "cli/launch_command.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/errors.h"
#include "server/connection.h"
#include "server/mcp.h"

namespace torchtpu::cli {
namespace {

using json = nlohmann::json;

struct Options {
  std::string agent;
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;
  bool print = false;
  std::vector<std::string> args;
};

// What the agent is run with: variables set in its environment, and its command line.
struct Launch {
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> argv;
};

httplib::Result get(const std::string& origin, const std::string& api_key, const char* path) {
  const server::BaseUrl base = server::split_base_url(origin);
  httplib::Client http(base.origin);
  http.set_connection_timeout(5);
  http.set_read_timeout(30);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  return http.Get(base.path + path, headers);
}

// The ids `origin`'s /v1/models lists, and the base model's (the first without a parent; the
// others are LoRA adapters). Errors say what to do: start a server, pass its key, name its URL.
std::pair<std::vector<std::string>, std::string> served_models(const std::string& origin,
                                                               const std::string& api_key) {
  if (!origin.starts_with("http://") && !origin.starts_with("https://")) {
    throw ValueError("--url " + origin + " is not an http:// or https:// URL");
  }
  const auto res = get(origin, api_key, "/v1/models");
  if (!res) {
    throw std::runtime_error("no server answers at " + origin + " (" +
                             server::describe(res.error()) +
                             "): start one with `torchtpu-cpp serve`, or name yours with --url");
  }
  if (res->status == 401) {
    throw ValueError(origin + (api_key.empty() ? " wants an API key" : " refused the API key") +
                     " (HTTP 401 from /v1/models): pass the key it was started with as "
                     "--api-key or $TORCHTPU_API_KEY");
  }
  if (res->status != 200) {
    throw std::runtime_error(origin + "/v1/models answered HTTP " + std::to_string(res->status) +
                             ": " + res->body.substr(0, 300));
  }
  std::vector<std::string> ids;
  std::string base;
  try {
    const json listing = json::parse(res->body);
    for (const auto& model : listing.at("data")) {
      ids.push_back(model.at("id").get<std::string>());
      if (base.empty() && !model.contains("parent")) base = ids.back();
    }
  } catch (const json::exception&) {
    ids.clear();
  }
  if (ids.empty() || base.empty()) {
    throw std::runtime_error(origin + "/v1/models lists no model in OpenAI's shape: is " + origin +
                             " a torchtpu-cpp server?");
  }
  return {ids, base};
}

// The context the server holds (llama-server's /props, default_generation_settings.n_ctx), or
// 0 when it does not say (a proxy, another server).
int64_t server_context(const std::string& origin, const std::string& api_key) {
  const auto res = get(origin, api_key, "/props");
  if (!res || res->status != 200) return 0;
  try {
    return json::parse(res->body).at("default_generation_settings").at("n_ctx").get<int64_t>();
  } catch (const json::exception&) {
    return 0;
  }
}

// Claude Code speaks Anthropic's Messages API at ANTHROPIC_BASE_URL (no /v1) and sends
// ANTHROPIC_AUTH_TOKEN as a bearer token (it must not be empty, so a server without a key gets
// a placeholder it ignores). An empty ANTHROPIC_API_KEY keeps a key of the user's own, which
// Claude Code would send instead, out of this run. Its background tasks and subagents ask for
// its haiku, sonnet and opus models by name: each is set to the served model, as an unknown name
// gets a 404 from the server.
Launch claude(const std::string& origin, const std::string& api_key, const std::string& model) {
  Launch l;
  l.env = {{"ANTHROPIC_BASE_URL", origin},
           {"ANTHROPIC_AUTH_TOKEN", api_key.empty() ? "torchtpu-cpp" : api_key},
           {"ANTHROPIC_API_KEY", ""},
           {"ANTHROPIC_MODEL", model},
           {"ANTHROPIC_DEFAULT_OPUS_MODEL", model},
           {"ANTHROPIC_DEFAULT_SONNET_MODEL", model},
           {"ANTHROPIC_DEFAULT_HAIKU_MODEL", model},
           {"ANTHROPIC_SMALL_FAST_MODEL", model}};
  l.argv = {"claude"};
  return l;
}

// Codex speaks the Responses API to a model provider its config names; `-c key=value` settings
// (TOML values: quoted strings) define one for this run only. Its key comes from the variable
// env_key names, set only when the server has a key.
Launch codex(const std::string& origin, const std::string& api_key, const std::string& model) {
  Launch l;
  const std::string provider = "model_providers.torchtpu.";
  auto toml = [](const std::string& s) { return json(s).dump(); };
  l.argv = {"codex",
            "-c", "model_provider=" + toml("torchtpu"),
            "-c", provider + "name=" + toml("torchtpu-cpp"),
            "-c", provider + "base_url=" + toml(origin + "/v1"),
            "-c", provider + "wire_api=" + toml("responses")};
  if (!api_key.empty()) {
    l.argv.insert(l.argv.end(), {"-c", provider + "env_key=" + toml("TORCHTPU_API_KEY")});
    l.env = {{"TORCHTPU_API_KEY", api_key}};
  }
  l.argv.insert(l.argv.end(), {"-m", model});
  return l;
}

// OpenCode reads a whole configuration, merged over its files, from OPENCODE_CONFIG_CONTENT: a
// provider through AI SDK's OpenAI-compatible package (Chat Completions) with the served model,
// chosen as its model and as the small model it titles sessions with.
Launch opencode(const std::string& origin, const std::string& api_key, const std::string& model) {
  json provider = {{"npm", "@ai-sdk/openai-compatible"},
                   {"name", "torchtpu-cpp"},
                   {"options", {{"baseURL", origin + "/v1"}}},
                   {"models", {{model, {{"name", model}}}}}};
  if (!api_key.empty()) provider["options"]["apiKey"] = api_key;
  const json config = {{"$schema", "https://opencode.ai/config.json"},
                       {"provider", {{"torchtpu", provider}}},
                       {"model", "torchtpu/" + model},
                       {"small_model", "torchtpu/" + model}};
  return {{{"OPENCODE_CONFIG_CONTENT", config.dump()}}, {"opencode"}};
}

struct Agent {
  const char* name;     // launch's argument, and the program looked up on PATH
  const char* title;    // how messages name it
  const char* install;  // how the message for a missing program says to get it
  Launch (*launch)(const std::string& origin, const std::string& api_key,
                   const std::string& model);
  // The context below which launch warns, and the size of the agent's first request (its system
  // prompt and tools), measured with Claude Code 2.1.197, Codex 0.171.0 and OpenCode 1.18.33.
  int64_t context;
  const char* first_request;
};

constexpr Agent kAgents[] = {
    {"claude", "Claude Code", "npm install -g @anthropic-ai/claude-code", claude, 32768,
     "about 18,000 tokens"},
    {"codex", "Codex", "npm install -g @openai/codex", codex, 16384, "about 6,000 tokens"},
    {"opencode", "OpenCode", "npm install -g opencode-ai", opencode, 16384, "about 7,000 tokens"},
};

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void print_launch(const Launch& l) {
  for (const auto& [name, value] : l.env) {
    std::cout << "export " << name << "=" << shell_quoted(value) << "\n";
  }
  std::string line;
  for (const auto& a : l.argv) line += (line.empty() ? "" : " ") + shell_quoted(a);
  std::cout << line << "\n";
}

// Replaces this process with the agent; returns only by throwing.
[[noreturn]] void run_launch(const Agent& agent, const Launch& l) {
  for (const auto& [name, value] : l.env) ::setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& a : l.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int error = errno;
  if (error == ENOENT) {
    throw std::runtime_error(std::string("`") + agent.name + "` (" + agent.title +
                             ") is not on PATH: install it (" + agent.install +
                             "), or see with --print what it would be run with");
  }
  throw std::runtime_error(std::string("cannot run `") + agent.name + "`: " + std::strerror(error));
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto options = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "launch",
      "Run Claude Code, Codex or OpenCode against a running torchtpu-cpp server (arguments after "
      "-- go to the agent)");
  std::vector<std::string> names;
  for (const auto& agent : kAgents) names.emplace_back(agent.name);
  cmd->add_option("agent", options->agent,
                  "claude (Claude Code), codex (Codex) or opencode (OpenCode)")
      ->required()
      ->check(CLI::IsMember(names));
  cmd->add_option("args", options->args, "Arguments for the agent, after --");
  cmd->add_option("--url", options->url, "The server's URL")->capture_default_str();
  cmd->add_option("--api-key", options->api_key,
                  "The server's API key (default: $TORCHTPU_API_KEY)");
  cmd->add_option("--model", options->model,
                  "A model the server lists at /v1/models, such as a LoRA adapter (default: the "
                  "base model)");
  cmd->add_flag("--print", options->print,
                "Print the environment and command the agent would run with, and run nothing");
  cmd->callback([options] {
    default_from_env(options->api_key, "TORCHTPU_API_KEY");
    const std::string origin = server::origin_of(options->url);
    const auto [ids, base] = served_models(origin, options->api_key);
    std::string model = options->model.empty() ? base : options->model;
    if (std::find(ids.begin(), ids.end(), model) == ids.end()) {
      std::string listed;
      for (const auto& id : ids) listed += (listed.empty() ? "'" : ", '") + id + "'";
      throw ValueError("--model '" + model + "' is not served at " + origin + ", which lists " +
                       listed);
    }
    const Agent& agent = *std::find_if(std::begin(kAgents), std::end(kAgents),
                                       [&](const Agent& a) { return a.name == options->agent; });
    Launch l = agent.launch(origin, options->api_key, model);
    l.argv.insert(l.argv.end(), options->args.begin(), options->args.end());
    if (options->print) return print_launch(l);
    // A warning, not a refusal: the agent's own error would only come with its first request.
    if (const int64_t context = server_context(origin, options->api_key);
        context > 0 && context < agent.context) {
      std::cerr << "torchtpu-cpp launch: warning: the server's context holds " << context
                << " tokens, and " << agent.title << "'s first request alone is "
                << agent.first_request << ", growing with the conversation: start `torchtpu-cpp "
                << "serve` with --context " << agent.context << " or more\n";
    }
    std::cerr << "torchtpu-cpp launch: " << agent.title << " with " << model << " at " << origin
              << "\n";
    run_launch(agent, l);
  });
}

}  // namespace torchtpu::cli
