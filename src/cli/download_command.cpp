#include "cli/download_command.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "hub/hub.h"

namespace torchtpu {
namespace {

struct DownloadArgs {
  std::string id;
  std::string revision;
  std::vector<std::string> include;
  std::string cache_dir;
  bool quiet = false;
};

void run_download(const DownloadArgs& args) {
  hub::Options opts = hub::Options::from_env();
  if (!args.cache_dir.empty()) opts.cache_dir = args.cache_dir;
  if (args.quiet) opts.progress = false;
  std::string id = args.id;
  std::string revision = args.revision;
  if (size_t at = id.find('@'); at != std::string::npos) {
    if (at + 1 == id.size()) {
      throw ValueError("'" + id + "' names no revision after '@': give org/name or " +
                       "org/name@revision");
    }
    if (!revision.empty() && revision != id.substr(at + 1)) {
      throw ValueError("the revision is given twice: '" + id.substr(at + 1) + "' in " + id +
                       " and --revision " + revision);
    }
    revision = id.substr(at + 1);
    id = id.substr(0, at);
  }
  std::cout << hub::download(id, revision, opts, args.include) << std::endl;
}

}  // namespace

void add_download_command(CLI::App& app) {
  auto args = std::make_shared<DownloadArgs>();
  CLI::App* cmd = app.add_subcommand(
      "download",
      "Download a model from the Hugging Face Hub into the shared cache (HF_HUB_CACHE) and print "
      "its snapshot directory. Only the files the engine reads are fetched.");
  cmd->add_option("id", args->id, "Hub model id, org/name or org/name@revision")->required();
  cmd->add_option("--revision", args->revision, "branch, tag or commit (default: main)");
  cmd->add_option("--include", args->include,
                  "only files matching this glob (repeat the flag for more), among those the "
                  "engine reads")
      ->allow_extra_args(false);
  cmd->add_option("--cache-dir", args->cache_dir, "cache directory instead of HF_HUB_CACHE");
  cmd->add_flag("--quiet", args->quiet, "no progress output");
  cmd->callback([args] { run_download(*args); });
}

}  // namespace torchtpu
