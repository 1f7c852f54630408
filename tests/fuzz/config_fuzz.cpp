// libFuzzer harness: the JSON files of a checkpoint directory. The first byte chooses the file the
// rest of the input becomes: config.json (parse_config_json), generation_config.json (load_config
// beside a valid config.json), tokenizer_config.json (ChatTemplate::from_dir) or tokenizer.json
// (Tokenizer::from_json_string). A bad file is a FormatError (NotFoundError for a directory
// without any chat template); nothing else may escape.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/errors.h"
#include "io/config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// The demo checkpoint's text config: what generation_config.json is loaded beside.
constexpr char kConfig[] = R"({"model_type": "gemma4_text", "vocab_size": 262144,
  "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
  "head_dim": 16, "global_head_dim": 32, "intermediate_size": 128, "use_double_wide_mlp": true,
  "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 262144, "sliding_window": 128,
  "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-06, "num_kv_shared_layers": 2,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "rope_parameters": {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                       "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
  "eos_token_id": 1, "bos_token_id": 2, "pad_token_id": 0})";

void write(const fs::path& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
}

// A directory of this process's own, removed at exit.
const fs::path& scratch_dir() {
  static const struct Scratch {
    fs::path path;
    Scratch() {
      std::string name = (fs::temp_directory_path() / "torchtpu-fuzz-config-XXXXXX").string();
      if (::mkdtemp(name.data()) == nullptr) std::abort();
      path = name;
      write(path / "config.json", kConfig, sizeof(kConfig) - 1);
    }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } scratch;
  return scratch.path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  const char* text = reinterpret_cast<const char*>(data + 1);
  const size_t length = size - 1;
  try {
    switch (mode) {
      case 0: torchtpu::parse_config_json(std::string(text, length), "config.json"); break;
      case 1:
        write(scratch_dir() / "generation_config.json", text, length);
        torchtpu::load_config(scratch_dir().string());
        break;
      case 2:
        write(scratch_dir() / "tokenizer_config.json", text, length);
        torchtpu::ChatTemplate::from_dir(scratch_dir().string());
        break;
      default:
        torchtpu::Tokenizer::from_json_string(std::string_view(text, length), "tokenizer.json");
    }
  } catch (const torchtpu::FormatError&) {
  } catch (const torchtpu::NotFoundError&) {
  }
  return 0;
}
