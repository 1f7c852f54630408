#include "cli/quantize_command.h"

#include <iostream>
#include <memory>
#include <string>

#include "quant/quantize.h"

namespace torchtpu {

void add_quantize_command(CLI::App& app) {
  struct Args {
    std::string in, out, emb4;
    int64_t group = 32;
    bool asym = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a compressed-tensors pack-quantized (W4A16) copy of a dense checkpoint");
  cmd->add_option("IN", args->in, "dense bf16/f16/f32 checkpoint directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("OUT", args->out, "output directory (must not exist or be empty)")->required();
  cmd->add_option("--group", args->group,
                  "input columns per scale; -1 for one scale per output row")
      ->capture_default_str();
  cmd->add_option("--emb4", args->emb4,
                  "also write the emb4 twin here: int4 embed_tokens, embed_tokens_per_layer and "
                  "an untied lm_head (F16 scales, group 32)");
  cmd->add_flag("--asym", args->asym, "asymmetric weights (scale and zero point per group)");
  cmd->callback([args] {
    const QuantizeSummary s =
        quantize_checkpoint(args->in, args->out, {args->group, !args->asym, args->emb4});
    std::cout << "quantized " << s.quantized << " linears, copied " << s.dense
              << " tensors unchanged: " << args->out << " (" << s.out_bytes / (1 << 20)
              << " MiB of tensors)\n";
    if (!args->emb4.empty()) {
      std::cout << "emb4 twin with " << s.emb4_tables << " int4 vocabulary tables: " << args->emb4
                << " (" << s.emb4_bytes / (1 << 20) << " MiB of tensors)\n";
    }
  });
}

}  // namespace torchtpu
