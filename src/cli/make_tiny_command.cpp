#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "common/errors.h"
#include "model/make_tiny.h"
#include "text/tokenizer.h"

namespace torchtpu::cli {

void add_make_tiny_command(CLI::App& app) {
  struct Args {
    std::string out, preset = "tiny", layer_types;
    int64_t layers = 0;
    TinySpec spec;
    bool no_double_wide = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("make-tiny", "Write a synthetic Gemma 4 checkpoint (random weights)");
  cmd->add_option("out", args->out, "Output directory")->required();
  cmd->add_option("--preset", args->preset, "tiny | e2b (full E2B shapes)");
  // Every knob below overrides the preset only when given.
  cmd->add_option("--seed", args->spec.seed, "Random seed");
  cmd->add_option("--dtype", args->spec.dtype, "f32 | bf16 | f16");
  cmd->add_option("--prefix", args->spec.prefix, "model.language_model. | model.");
  cmd->add_flag("--dead-shared-kv", args->spec.dead_shared_kv,
                "Also write the unused k/v/k_norm of shared layers");
  cmd->add_flag("--untied", args->spec.untied, "Write an lm_head of its own");
  cmd->add_option("--shards", args->spec.shards, "Number of safetensors files");
  cmd->add_option("--tokenizer", args->spec.tokenizer_dir,
                  "Directory with tokenizer files to copy");
  cmd->add_option("--layer-types", args->layer_types, "e.g. sliding,sliding,full,...");
  cmd->add_option("--layers", args->layers,
                  "Layer count with the E2B pattern (4 sliding, 1 full; the last full)");
  cmd->add_option("--hidden", args->spec.hidden, "Hidden size");
  cmd->add_option("--heads", args->spec.heads, "Attention heads");
  cmd->add_option("--kv-heads", args->spec.kv_heads, "Key/value heads");
  cmd->add_option("--head-dim", args->spec.head_dim, "Head dim of sliding layers");
  cmd->add_option("--global-head-dim", args->spec.global_head_dim, "Head dim of full layers");
  cmd->add_option("--intermediate", args->spec.intermediate,
                  "MLP width (doubled on shared layers)");
  cmd->add_flag("--no-double-wide", args->no_double_wide, "Same MLP width on shared layers");
  cmd->add_option("--ple", args->spec.ple, "Per-layer input width (0: none)");
  cmd->add_option("--window", args->spec.window, "Sliding window");
  cmd->add_option("--shared", args->spec.shared, "KV-shared layers at the end");
  cmd->add_option("--vocab", args->spec.vocab, "Vocabulary size");
  cmd->callback([args, cmd] {
    TinySpec spec = tiny_preset(args->preset);
    // Options given on the command line override the preset's values.
    auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    const TinySpec& a = args->spec;
    if (given("--seed")) spec.seed = a.seed;
    if (given("--dtype")) spec.dtype = a.dtype;
    if (given("--prefix")) spec.prefix = a.prefix;
    spec.dead_shared_kv = a.dead_shared_kv;
    spec.untied = a.untied;
    if (given("--shards")) spec.shards = a.shards;
    spec.tokenizer_dir = a.tokenizer_dir;
    if (given("--hidden")) spec.hidden = a.hidden;
    if (given("--heads")) spec.heads = a.heads;
    if (given("--kv-heads")) spec.kv_heads = a.kv_heads;
    if (given("--head-dim")) spec.head_dim = a.head_dim;
    if (given("--global-head-dim")) spec.global_head_dim = a.global_head_dim;
    if (given("--intermediate")) spec.intermediate = a.intermediate;
    if (args->no_double_wide) spec.double_wide = false;
    if (given("--ple")) spec.ple = a.ple;
    if (given("--window")) spec.window = a.window;
    if (given("--shared")) spec.shared = a.shared;
    if (given("--vocab")) spec.vocab = a.vocab;
    if (!spec.tokenizer_dir.empty()) {
      // The vocabulary holds every id the tokenizer gives, or text prompts would not fit it.
      const auto json = std::filesystem::path(spec.tokenizer_dir) / "tokenizer.json";
      if (!std::filesystem::is_regular_file(json)) {
        throw NotFoundError("--tokenizer " + spec.tokenizer_dir + " holds no tokenizer.json");
      }
      const int64_t pieces = Tokenizer::from_file(json.string()).vocab_size();
      if (!given("--vocab")) {
        spec.vocab = pieces;
      } else if (spec.vocab < pieces) {
        throw ValueError("--vocab " + std::to_string(spec.vocab) + " is smaller than the " +
                         std::to_string(pieces) + " ids of " + json.string() +
                         ": text would give ids the model has no embedding for");
      }
    }
    if (given("--layers")) {
      spec.layer_types.clear();
      for (int64_t l = 0; l < args->layers; ++l) {
        const bool full = l % 5 == 4 || l == args->layers - 1;
        spec.layer_types.push_back(full ? LayerType::kFull : LayerType::kSliding);
      }
    }
    if (given("--layer-types")) {
      spec.layer_types.clear();
      std::string rest = args->layer_types;
      while (!rest.empty()) {
        const auto comma = rest.find(',');
        const std::string t = rest.substr(0, comma);
        if (t == "sliding" || t == "sliding_attention") {
          spec.layer_types.push_back(LayerType::kSliding);
        } else if (t == "full" || t == "full_attention") {
          spec.layer_types.push_back(LayerType::kFull);
        } else {
          throw ValueError("--layer-types: unknown layer type '" + t + "' (sliding or full)");
        }
        rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      }
    }
    make_tiny(args->out, spec);
  });
}

}  // namespace torchtpu::cli
