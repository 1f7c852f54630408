// The cost of constrained decoding per decode step on a real vocabulary (the Gemma 4 test
// tokenizer: 262,144 ids): llguidance's allowed-token mask, the mask applied to float32 logits
// with ATen, and the commit, for a JSON-schema constraint and for json_object. Tokens are drawn
// uniformly from the allowed set (seeded), so the walk goes through strings, numbers, arrays and
// nested objects as a model's output would. Prints one JSON object; docs/BENCHMARKS.md has the
// numbers.
//
//   grammar_mask_bench TOKENIZER_JSON [STEPS=400] [RUNS=5]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/constraint.h"

using namespace torchtpu;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / v.size();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "address": {"type": "object", "properties": {
      "street": {"type": "string", "maxLength": 30},
      "city": {"type": "string", "maxLength": 20},
      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
      "required": ["city"], "additionalProperties": false},
    "status": {"enum": ["active", "inactive", "banned"]},
    "score": {"type": "number"}
  },
  "required": ["name", "age", "status"],
  "additionalProperties": false
})";

nlohmann::json measure(const std::shared_ptr<const GrammarVocabulary>& vocabulary,
                       const Grammar& grammar, int steps, int runs) {
  std::vector<double> compile_us, mask_us, apply_us, commit_us, step_us;
  int64_t tokens = 0, finished = 0;
  const auto logits = at::randn({vocabulary->size()});
  for (int run = 0; run < runs; ++run) {
    std::mt19937_64 rng(run);
    auto t = Clock::now();
    Constraint c(vocabulary, grammar);
    compile_us.push_back(us_since(t));
    for (int step = 0; step < steps && !c.complete(); ++step) {
      t = Clock::now();
      const auto& words = c.allowed();
      mask_us.push_back(us_since(t));
      t = Clock::now();
      const auto masked = c.mask(logits);
      apply_us.push_back(us_since(t));
      (void)masked;
      std::vector<int64_t> allowed;
      for (int64_t id = 0; id < vocabulary->size(); ++id) {
        if ((words[id / 32] >> (id % 32) & 1) &&
            std::find(vocabulary->end_ids().begin(), vocabulary->end_ids().end(), id) ==
                vocabulary->end_ids().end()) {
          allowed.push_back(id);
        }
      }
      if (allowed.empty()) break;  // only an end token is left: the output is complete
      const int64_t token = allowed[rng() % allowed.size()];
      t = Clock::now();
      c.commit(token);
      commit_us.push_back(us_since(t));
      step_us.push_back(mask_us.back() + apply_us.back() + commit_us.back());
      ++tokens;
    }
    finished += c.complete();
  }
  return {{"steps", tokens},
          {"runs", runs},
          {"runs_complete", finished},
          {"compile_us_median", median(compile_us)},
          {"mask_us_median", median(mask_us)},
          {"mask_us_p90", percentile(mask_us, 0.9)},
          {"apply_us_median", median(apply_us)},
          {"commit_us_median", median(commit_us)},
          {"step_us_median", median(step_us)},
          {"step_us_mean", mean(step_us)},
          {"step_us_p90", percentile(step_us, 0.9)},
          {"step_us_max", percentile(step_us, 1.0)}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: grammar_mask_bench TOKENIZER_JSON [STEPS=400] [RUNS=5]\n";
    return 2;
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 400;
  const int runs = argc > 3 ? std::stoi(argv[3]) : 5;
  at::set_num_threads(1);
  const auto tokenizer = Tokenizer::from_file(argv[1]);
  std::vector<int64_t> ends;
  for (const char* end : {"<turn|>", "<eos>"}) {
    if (auto id = tokenizer.token_to_id(end)) ends.push_back(*id);
  }
  auto t = Clock::now();
  auto vocabulary = std::make_shared<const GrammarVocabulary>(tokenizer, ends);
  const double vocabulary_ms = us_since(t) / 1000;
  nlohmann::json out = {
      {"vocabulary", vocabulary->size()},
      {"vocabulary_build_ms", vocabulary_ms},
      {"json_schema", measure(vocabulary, {GrammarKind::kJsonSchema, kSchema}, steps, runs)},
      {"json_object", measure(vocabulary, {GrammarKind::kJsonObject, ""}, steps, runs)}};
  std::cout << out.dump(2) << "\n";
}
