#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "common/errors.h"
#include "common/memory.h"
#include "engine/engine.h"
#include "engine/media.h"
#include "engine/report.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "server/stop_strings.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace torchtpu::cli {
namespace {

using nlohmann::json;

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw ValueError("--ids: '" + item + "' is not an integer token id");
    }
  }
  return ids;
}

TensorToWrite f32_tensor(const std::string& name, const at::Tensor& t) {
  auto c = t.to(at::kCPU, at::kFloat).contiguous();
  TensorToWrite out{name, Dtype::kF32, c.sizes().vec(),
                    std::vector<uint8_t>(c.numel() * sizeof(float))};
  std::memcpy(out.bytes.data(), c.data_ptr(), out.bytes.size());
  return out;
}

std::string read_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError(flag + " " + path + ": cannot open the file");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Images first, then audio clips, in the order given (the order of their placeholders).
std::vector<Media> load_media(const Engine& engine, const std::vector<std::string>& images,
                              const std::vector<std::string>& clips, int64_t image_tokens) {
  std::vector<Media> media;
  for (const auto& path : images) {
    const auto bytes = read_file(path, "--image");
    media.push_back(
        image_media(preprocess_image(decode_image(bytes), engine.image_options(image_tokens))));
  }
  for (const auto& path : clips) {
    engine.check_tower(MediaKind::kAudio);
    const auto bytes = read_file(path, "--audio");
    media.push_back(audio_media(audio_features_from_file(bytes, engine.audio_options())));
  }
  return media;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  struct Args {
    EngineFlags engine;
    std::string ids, prompt, system, dump_logits;
    std::vector<std::string> images, audio, stop;
    int64_t max_new = 64, read_every = 1, image_tokens = 280;
    bool json = false, ignore_eos = false, chat = false, think = false;
    SamplingParams sampling;
    Drafting draft;
    int64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("generate", "Read a prompt and decode it (greedily unless --temperature)");
  a->engine.add_to(*cmd);
  auto* ids = cmd->add_option("--ids", a->ids, "Prompt token ids, comma-separated");
  auto* prompt = cmd->add_option("--prompt", a->prompt,
                                 "Prompt text (needs tokenizer.json); - reads it from stdin");
  ids->excludes(prompt);
  // The chat flags render text: with --ids there is none, so they would do nothing.
  cmd->add_flag("--chat", a->chat, "Render --prompt as a user turn with the chat template")
      ->excludes(ids);
  cmd->add_option("--system", a->system, "System prompt (implies --chat)")->excludes(ids);
  cmd->add_flag("--think", a->think, "Enable thinking in the chat template (implies --chat)")
      ->excludes(ids);
  auto* image = cmd->add_option("--image", a->images,
                  "Image file (JPEG, PNG, WebP), repeatable. With --chat the user turn is the "
                  "images, the clips, then the text; otherwise their placeholders follow <bos>; "
                  "with --ids each image_token_id is one image's placeholder");
  cmd->add_option("--audio", a->audio, "WAV or MP3 clip, repeatable; placed as --image is, after images");
  cmd->add_option("--image-tokens", a->image_tokens,
                  "Soft tokens per image: 70 | 140 | 280 | 560 | 1120")
      ->needs(image);
  cmd->add_option("--max-new", a->max_new, "Tokens to generate")->capture_default_str();
  cmd->add_option("--read-every", a->read_every, "Decode steps between host reads");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Decode exactly --max-new tokens");
  cmd->add_option("--stop", a->stop,
                  "Stop once the text holds this string, which is not printed (repeatable)")
      ->needs(prompt)
      ->check(CLI::Validator(
          [](const std::string& text) { return text.empty() ? "must not be empty" : ""; }, "TEXT"));
  auto* draft_max = add_draft_flags(*cmd, a->draft);
  cmd->add_option("--temperature", a->sampling.temperature, "0 (default): greedy");
  // -1 as well as 0, as a request's top_k (vLLM's word for off).
  cmd->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 or -1: off)")
      ->transform(CLI::Validator(
          [](std::string& text) {
            if (text == "-1") text = "0";
            return std::string();
          },
          "", "off"));
  cmd->add_option("--top-p", a->sampling.top_p, "Keep the smallest set with this mass (1: off)");
  cmd->add_option("--min-p", a->sampling.min_p, "Drop tokens below min_p x the top probability");
  cmd->add_option("--repetition-penalty", a->sampling.repetition_penalty, "1: off");
  cmd->add_option("--presence-penalty", a->sampling.presence_penalty, "0: off");
  cmd->add_option("--frequency-penalty", a->sampling.frequency_penalty, "0: off");
  // An int64 at least 0, as a request's seed: -1 is no "random seed" here, and neither it nor
  // 2^64 may wrap or clamp to 2^64 - 1.
  auto* seed =
      cmd->add_option("--seed", a->seed, "Sampling seed (same seed, same tokens)")
          ->check(CLI::Validator(
              [](const std::string& text) -> std::string {
                int64_t value = 0;
                const auto [end, error] =
                    std::from_chars(text.data(), text.data() + text.size(), value);
                if (error == std::errc() && end == text.data() + text.size() && value >= 0) {
                  return "";
                }
                return "must be an integer from 0 to 9223372036854775807, got " + text;
              },
              "SEED"));
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--dump-logits", a->dump_logits,
                  "Write prompt_logits [T, V] and step_logits [N, V] (f32) to a safetensors file");
  cmd->callback([a, seed, draft_max, ids, prompt] {
    if (ids->count() == 0 && prompt->count() == 0) throw ValueError("give --ids or --prompt");
    // Before the load and the decode, not after them.
    const auto dump_dir = std::filesystem::path(a->dump_logits).parent_path();
    if (!a->dump_logits.empty() && !dump_dir.empty() && !std::filesystem::is_directory(dump_dir)) {
      throw NotFoundError("--dump-logits " + a->dump_logits + ": the directory " +
                          dump_dir.string() + " does not exist");
    }
    const EngineOptions options = a->engine.options();
    if (draft_max->count() == 0) a->draft.tokens = default_draft_tokens(options.draft_model);
    Engine engine(options);
    const int64_t rss_after_load = resident_bytes();
    std::optional<Tokenizer> tokenizer;
    std::vector<int64_t> ids;
    if (prompt->count() > 0) {
      const auto path = Checkpoint(options.model_dir).file_if_exists("tokenizer.json");
      if (path.empty()) {
        throw NotFoundError("--prompt needs " + options.model_dir +
                            "/tokenizer.json; give token ids with --ids instead");
      }
      tokenizer = model_tokenizer(path, engine.config().vocab_size);
      if (a->prompt == "-") {
        a->prompt.assign(std::istreambuf_iterator<char>(std::cin),
                         std::istreambuf_iterator<char>());
      }
      std::string text = a->prompt;
      if (a->chat || a->think || !a->system.empty()) {
        nlohmann::json messages = nlohmann::json::array();
        if (!a->system.empty()) messages.push_back({{"role", "system"}, {"content", a->system}});
        nlohmann::json content = a->prompt;
        if (!a->images.empty() || !a->audio.empty()) {
          content = nlohmann::json::array();
          for (size_t i = 0; i < a->images.size(); ++i) content.push_back({{"type", "image"}});
          for (size_t i = 0; i < a->audio.size(); ++i) content.push_back({{"type", "audio"}});
          content.push_back({{"type", "text"}, {"text", a->prompt}});
        }
        messages.push_back({{"role", "user"}, {"content", content}});
        text = ChatTemplate::from_dir(options.model_dir)
                   .render(messages, nullptr, /*add_generation_prompt=*/true,
                           {{"enable_thinking", a->think}});
      }
      // The chat template writes <bos> itself; a plain prompt gets the tokenizer's own BOS.
      const bool plain = text == a->prompt;
      ids = tokenizer->encode(text, /*add_special_tokens=*/plain);
      if (plain) {
        std::vector<int64_t> placeholders(a->images.size(), engine.config().image_token_id);
        placeholders.insert(placeholders.end(), a->audio.size(), engine.config().audio_token_id);
        const bool bos = !ids.empty() && ids.front() == engine.config().bos_token_id;
        ids.insert(ids.begin() + (bos ? 1 : 0), placeholders.begin(), placeholders.end());
      }
    } else {
      ids = parse_ids(a->ids);
    }
    const auto media = load_media(engine, a->images, a->audio, a->image_tokens);
    if (!media.empty()) ids = expand_media_placeholders(ids, media, engine.config());
    std::optional<Detokenizer> detokenizer;
    if (tokenizer) detokenizer.emplace(*tokenizer, /*show_special_tokens=*/false);
    // The text as it is printed: what the stop strings let through.
    server::StopStrings stops(a->stop);
    std::string text;
    const auto show = [&](const std::string& piece) {
      text += piece;
      if (!a->json) std::cout << piece << std::flush;
    };

    // Every step's logits only for --dump-logits (a vocabulary's floats a token: a long decode
    // would hold gigabytes); the first step's for the report's top 5.
    std::vector<at::Tensor> step_logits;
    at::Tensor first_logits;
    DecodeOptions decode;
    decode.max_new = a->max_new;
    decode.read_every = a->read_every;
    decode.ignore_eos = a->ignore_eos;
    decode.sampling = a->sampling;
    decode.draft = a->draft;
    if (seed->count() > 0) decode.sampling.seed = static_cast<uint64_t>(a->seed);
    size_t taken = 0;  // the tokens up to a stop string's end, where one ends them
    auto on_tokens = [&](const std::vector<int64_t>& batch) {
      for (auto t : batch) {
        ++taken;
        if (!detokenizer) {
          show(std::to_string(t) + " ");
          continue;
        }
        show(stops.push(detokenizer->push(t)));
        // Tokens of the batch past the stop string are neither shown nor decoded on.
        if (stops.stopped()) return false;
      }
      return true;
    };
    auto result = engine.decode(ids, media, decode, on_tokens, [&](const at::Tensor& logits) {
      if (!first_logits.defined()) first_logits = logits.to(at::kCPU);
      if (!a->dump_logits.empty()) step_logits.push_back(logits.to(at::kCPU));
    });
    if (stops.stopped()) {
      // A batch of --read-every tokens was decoded past the stop; the answer ends there.
      result.finish = "stop";
      result.tokens.resize(taken);
      if (step_logits.size() > taken) step_logits.resize(taken);
    } else if (detokenizer) {
      show(stops.push(detokenizer->finish()) + stops.finish());
    }
    if (!a->json) std::cout << "\n";

    if (!a->dump_logits.empty()) {
      write_safetensors(a->dump_logits, {f32_tensor("prompt_logits", engine.logits(ids, media)),
                                         f32_tensor("step_logits", at::stack(step_logits))});
    }
    auto top = first_logits.topk(5);
    auto top_ids = std::get<1>(top);
    auto top_values = std::get<0>(top);
    json out = engine_report(engine);
    out["prompt_ids"] = ids;
    out["tokens"] = result.tokens;
    if (tokenizer) out["text"] = text;
    out["finish"] = result.finish;
    out["stop"] = stops.stopped() ? json(stops.matched()) : json(nullptr);
    out["stop_id"] = result.stop_id ? json(*result.stop_id) : json(nullptr);
    out["prompt_tokens"] = result.prompt_tokens;
    out["read_s"] = result.read_s;
    out["decode_s"] = result.decode_s;
    out["drafted"] = result.drafted;
    out["accepted"] = result.accepted;
    out["top5"] = {
        {"ids", std::vector<int64_t>(top_ids.data_ptr<int64_t>(), top_ids.data_ptr<int64_t>() + 5)},
        {"logits",
         std::vector<float>(top_values.data_ptr<float>(), top_values.data_ptr<float>() + 5)}};
    out["rss_after_load_bytes"] = rss_after_load;
    out["peak_rss_bytes"] = peak_resident_bytes();
    if (a->json) {
      std::cout << out.dump() << "\n";
    } else {
      std::cerr << "finish " << result.finish << ", read " << result.read_s << " s, decode "
                << result.decode_s << " s";
      if (a->draft.tokens > 0) {
        std::cerr << ", drafts kept " << result.accepted << " of " << result.drafted;
      }
      std::cerr << "\n";
    }
  });
}

}  // namespace torchtpu::cli
