#include "cli/bench_command.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/engine_flags.h"
#include "common/errors.h"
#include "common/memory.h"
#include "engine/engine.h"
#include "engine/report.h"

namespace torchtpu::cli {
namespace {

using nlohmann::json;

std::vector<int64_t> parse_counts(const std::string &option, const std::string &text) {
  std::vector<int64_t> counts;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    int64_t value = 0;
    try {
      size_t used = 0;
      value = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception &) {
      throw ValueError(option + ": '" + item + "' is not an integer");
    }
    if (value < 1) throw ValueError(option + ": " + item + " must be at least 1");
    counts.push_back(value);
  }
  if (counts.empty()) throw ValueError(option + " is empty");
  return counts;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

json rates(const std::vector<double> &tok_s) {
  return {{"tok_s", tok_s},
          {"median_tok_s", median(tok_s)},
          {"min_tok_s", *std::min_element(tok_s.begin(), tok_s.end())},
          {"max_tok_s", *std::max_element(tok_s.begin(), tok_s.end())}};
}

}  // namespace

std::vector<int64_t> bench_prompt(uint64_t seed, int64_t length, int64_t vocab) {
  uint64_t state = (seed << 32) + static_cast<uint64_t>(length);
  std::vector<int64_t> ids(length);
  for (auto &id : ids) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    id = static_cast<int64_t>(z % static_cast<uint64_t>(vocab));
  }
  return ids;
}

void add_bench_command(CLI::App &app) {
  struct Args {
    EngineFlags engine;
    std::string prompt_tokens = "19,512,4096", read_every = "1,8";
    int64_t new_tokens = 64, repeats = 3;
    uint64_t seed = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto *cmd = app.add_subcommand(
      "bench", "Measure load, first call, prompt reading and decoding (EOS ignored)");
  a->engine.add_to(*cmd);
  cmd->add_option("--prompt-tokens", a->prompt_tokens,
                  "Prompt lengths to time reading for; the first is also the "
                  "decode prompt");
  cmd->add_option("--new", a->new_tokens, "Tokens decoded per decode run");
  cmd->add_option("--read-every", a->read_every,
                  "Host-read intervals to time decoding with (1 streams)");
  cmd->add_option("--repeats", a->repeats, "Timed runs per measurement (medians reported)");
  cmd->add_option("--seed", a->seed, "Seed of the random prompt ids");
  cmd->add_flag("--json", a->json, "Print one JSON object (otherwise a short summary)");
  cmd->callback([a] {
    const auto lengths = parse_counts("--prompt-tokens", a->prompt_tokens);
    const auto read_everies = parse_counts("--read-every", a->read_every);
    if (a->new_tokens < 2) throw ValueError("--new must be at least 2 to time decoding");
    if (a->repeats < 1) throw ValueError("--repeats must be at least 1");
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const int64_t decode_prompt = lengths.front();
    const int64_t context = a->engine.settings.context;
    if (longest > context || decode_prompt + a->new_tokens - 1 > context) {
      throw ValueError("--context " + std::to_string(context) + " holds neither the " +
                       std::to_string(longest) + "-token prompt nor " +
                       std::to_string(decode_prompt) + " + " + std::to_string(a->new_tokens) +
                       " decoded tokens; raise --context");
    }

    Engine engine(a->engine.options());
    const int64_t rss_after_load = resident_bytes();
    const int64_t vocab = engine.config().vocab_size;

    DecodeOptions decode;
    decode.max_new = a->new_tokens;
    decode.read_every = read_everies.front();
    decode.ignore_eos = true;
    const auto short_prompt = bench_prompt(a->seed, decode_prompt, vocab);

    // The first call pays for whatever is lazy (page faults on mmapped weights,
    // allocator and thread-pool warm-up, kernel selection): timed on its own,
    // like the seeds' "first call".
    const auto start = std::chrono::steady_clock::now();
    auto first = engine.decode(short_prompt, decode);
    const double first_call_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    json prompt_read = json::array();
    for (const int64_t length : lengths) {
      const auto prompt = bench_prompt(a->seed, length, vocab);
      DecodeOptions one = decode;
      one.max_new = 1;
      std::vector<double> read_s, tok_s;
      for (int64_t r = 0; r < a->repeats; ++r) {
        read_s.push_back(engine.decode(prompt, one).read_s);
        tok_s.push_back(length / read_s.back());
      }
      json entry = rates(tok_s);
      entry["prompt_tokens"] = length;
      entry["read_s"] = read_s;
      entry["first_ids"] =
          std::vector<int64_t>(prompt.begin(), prompt.begin() + std::min<int64_t>(4, length));
      prompt_read.push_back(entry);
    }

    json decoding = json::array();
    std::vector<int64_t> tokens;
    for (const int64_t every : read_everies) {
      DecodeOptions d = decode;
      d.read_every = every;
      std::vector<double> decode_s, tok_s;
      for (int64_t r = 0; r < a->repeats; ++r) {
        auto result = engine.decode(short_prompt, d);
        decode_s.push_back(result.decode_s);
        // The first token belongs to the prompt read; the other new - 1 are
        // decode steps.
        tok_s.push_back((result.tokens.size() - 1) / result.decode_s);
        tokens = result.tokens;
      }
      json entry = rates(tok_s);
      entry["read_every"] = every;
      entry["decode_s"] = decode_s;
      decoding.push_back(entry);
    }

    json out;
    out["engine"] = engine_report(engine);
    out["model"] = a->engine.model;
    out["emb4"] = a->engine.emb4;
    out["threads"] = at::get_num_threads();
    out["seed"] = a->seed;
    out["repeats"] = a->repeats;
    out["new"] = a->new_tokens;
    out["decode_prompt_tokens"] = decode_prompt;
    out["load_s"] = engine.load_seconds();
    out["first_call_s"] = first_call_s;
    out["first_call"] = {
        {"read_s", first.read_s}, {"decode_s", first.decode_s}, {"read_every", decode.read_every}};
    out["prompt_read"] = prompt_read;
    out["decode"] = decoding;
    out["tokens"] = tokens;
    out["rss_after_load_bytes"] = rss_after_load;
    out["peak_rss_bytes"] = peak_resident_bytes();
    if (a->json) {
      std::cout << out.dump() << "\n";
      return;
    }
    std::cout << "load " << out["load_s"] << " s, first call " << first_call_s << " s\n";
    for (const auto &p : prompt_read) {
      std::cout << "read " << p["prompt_tokens"] << " tokens: " << p["median_tok_s"] << " tok/s\n";
    }
    for (const auto &d : decoding) {
      std::cout << "decode, read every " << d["read_every"] << ": " << d["median_tok_s"]
                << " tok/s\n";
    }
    std::cout << "peak RSS " << out["peak_rss_bytes"] << " bytes\n";
  });
}

}  // namespace torchtpu::cli
