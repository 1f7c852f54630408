// The engine on the stand-in out-of-tree device (issue #20): the same tokens as the CPU at
// float32, host reads bounded by the read batches, and one op sequence per decode step.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "standin_device.h"
#include "tiny_checkpoint.h"

namespace torchtpu {
namespace {

// `ple` 32 makes every linear's input a whole number of int4 groups, so the checkpoint can be
// quantized at load.
std::string tiny_dir(int64_t ple = 16) { return testing::tiny_checkpoint("standin-tiny", 1, ple); }

Engine make_engine(const std::string& device, int64_t chunk = 16,
                   Int4Weights int4 = Int4Weights::kAuto) {
  EngineOptions o;
  o.model_dir = tiny_dir(int4 == Int4Weights::kAuto ? 16 : 32);
  o.device = parse_device(device);
  o.dtype = at::kFloat;
  o.context = 512;
  o.prefill_chunk = chunk;
  o.threads = 1;
  o.int4 = int4;
  o.quantize_int4 = int4 != Int4Weights::kAuto;
  return Engine(o);
}

std::vector<int64_t> prompt_of(int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(2 + (i * 37) % 500);
  return ids;
}

DecodeOptions greedy(int64_t max_new, int64_t read_every) {
  DecodeOptions o;
  o.max_new = max_new;
  o.read_every = read_every;
  o.ignore_eos = true;
  return o;
}

SamplingParams every_knob() {
  SamplingParams s;
  s.temperature = 0.8;
  s.top_k = 40;
  s.top_p = 0.9;
  s.min_p = 0.01;
  s.repetition_penalty = 1.1;
  s.presence_penalty = 0.5;
  s.frequency_penalty = 0.3;
  s.seed = 7;
  return s;
}

TEST(StandinDevice, ParsesByItsRegisteredName) {
  const auto device = parse_device(standin::kName);
  EXPECT_EQ(device.type(), c10::DeviceType::PrivateUse1);
  auto t = at::arange(6, at::kFloat).to(device).view({2, 3}) * 2;
  EXPECT_EQ(t.device().type(), c10::DeviceType::PrivateUse1);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(6, at::kFloat).view({2, 3}) * 2));
}

TEST(StandinDevice, CountsDeviceToHostCopiesAndScalarReadsButNotItsOwnFallback) {
  auto t = at::ones({4}, at::kFloat).to(parse_device(standin::kName));
  standin::reset_host_reads();
  auto u = (t + 1).sum() * 3;  // every op runs through the CPU fallback
  EXPECT_EQ(standin::host_reads().total(), 0);
  EXPECT_EQ(u.item<float>(), 24.0f);
  auto host = u.to(at::kCPU);
  EXPECT_EQ(standin::host_reads().scalars, 1);
  EXPECT_EQ(standin::host_reads().copies, 1);
}

TEST(EngineOnStandin, GreedyTokensEqualTheCpusAtFloat32) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  for (int64_t n : {1, 5, 40}) {
    const auto prompt = prompt_of(n);
    const auto expected = cpu.decode(prompt, greedy(48, 4)).tokens;
    ASSERT_EQ(expected.size(), 48u);
    EXPECT_EQ(standin.decode(prompt, greedy(48, 4)).tokens, expected) << "prompt of " << n;
  }
}

TEST(EngineOnStandin, SampledTokensEqualTheCpusWithTheSameSeed) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  auto options = greedy(32, 8);
  options.sampling = every_knob();
  const auto prompt = prompt_of(12);
  EXPECT_EQ(standin.decode(prompt, options).tokens, cpu.decode(prompt, options).tokens);
}

TEST(EngineOnStandin, LogitsEqualTheCpusAtFloat32) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  const auto prompt = prompt_of(20);
  // The CPU runs its own kernels for rms_norm and attention, the device their composites: the
  // same math in another order.
  EXPECT_TRUE(at::allclose(standin.logits(prompt).cpu(), cpu.logits(prompt), 1e-4, 1e-4));
}

TEST(EngineOnStandin, Int4LinearsTakeTheCompositeKernelAndMatchTheCpus) {
  // Quantized at load; on the CPU an int32-packed weight takes the same composite kernel.
  auto cpu = make_engine("cpu", 16, Int4Weights::kComposite);
  auto standin = make_engine(standin::kName, 16, Int4Weights::kComposite);
  const auto prompt = prompt_of(10);
  standin::start_recording();
  const auto tokens = standin.decode(prompt, greedy(24, 4)).tokens;
  const auto record = standin::stop_recording();
  EXPECT_EQ(tokens, cpu.decode(prompt, greedy(24, 4)).tokens);
  // A custom operator reaching the fallback would run its CPU kernel on the host; every one
  // must decompose into ATen ops on the device instead.
  for (const auto& line : record) EXPECT_NE(line.rfind("torchtpu::", 0), 0u) << line;
  EXPECT_TRUE(std::any_of(record.begin(), record.end(), [](const std::string& line) {
    return line.rfind("aten::bitwise_right_shift", 0) == 0;
  })) << "the composite unpacks nibbles on the device";
}

// Host reads seen by each on_tokens call: the first batch carries the prompt's chunks and the
// first token, every later one a read_every window.
std::vector<int64_t> reads_per_batch(Engine& engine, const std::vector<int64_t>& prompt,
                                     const DecodeOptions& options) {
  std::vector<int64_t> reads;
  standin::reset_host_reads();
  int64_t before = 0;
  engine.decode(prompt, options, [&](const std::vector<int64_t>&) {
    const int64_t now = standin::host_reads().total();
    reads.push_back(now - before);
    before = now;
    return true;
  });
  reads.push_back(standin::host_reads().total() - before);  // after the last batch: none
  return reads;
}

void expect_one_read_per_window(const std::vector<int64_t>& reads, int64_t chunks) {
  ASSERT_GE(reads.size(), 3u);
  EXPECT_LE(reads.front(), chunks + 1) << "prompt reading: at most one per chunk";
  for (size_t i = 1; i + 1 < reads.size(); ++i) {
    EXPECT_EQ(reads[i], 1) << "host reads in read window " << i;
  }
  EXPECT_EQ(reads.back(), 0);
}

TEST(EngineOnStandin, SteadyDecodeReadsTheHostOncePerReadEveryWindow) {
  auto engine = make_engine(standin::kName, /*chunk=*/16);
  const auto prompt = prompt_of(40);  // 3 chunks
  const auto reads = reads_per_batch(engine, prompt, greedy(65, 8));
  EXPECT_EQ(reads.size(), 1u + 8u + 1u);  // the first token, 8 windows of 8, the end
  expect_one_read_per_window(reads, 3);
  std::cout << "host reads: prompt+first token " << reads.front() << ", then 1 per window of 8\n";
}

TEST(EngineOnStandin, SamplingWithEveryKnobKeepsOneReadPerWindow) {
  auto engine = make_engine(standin::kName, /*chunk=*/16);
  auto options = greedy(65, 8);
  options.sampling = every_knob();
  options.sampling.logit_bias = {{5, 2.0}, {9, -3.0}};
  expect_one_read_per_window(reads_per_batch(engine, prompt_of(40), options), 3);
}

// The ops of each steady decode step, cut at each on_logits call (which follows every forward
// pass). Left out: the prompt, the piece that samples the first token and sets up the position,
// and the final read.
std::vector<std::vector<std::string>> step_programs(Engine& engine,
                                                    const std::vector<int64_t>& prompt,
                                                    const DecodeOptions& options) {
  standin::start_recording();
  engine.decode(prompt, options, {}, [](const at::Tensor&) { standin::mark(); });
  const auto record = standin::stop_recording();
  std::vector<std::vector<std::string>> steps(1);
  for (const auto& line : record) {
    if (line == "|") {
      steps.emplace_back();
    } else {
      steps.back().push_back(line);
    }
  }
  EXPECT_GE(steps.size(), 4u);
  return {steps.begin() + 2, steps.end() - 1};
}

TEST(EngineOnStandin, EveryDecodeStepIsOneProgram) {
  auto engine = make_engine(standin::kName);
  // 256 tokens from position 4: the sliding rings (8 slots) wrap 32 times, the full rings fill
  // half their 512 slots.
  const auto first = step_programs(engine, prompt_of(4), greedy(256, 1));
  ASSERT_EQ(first.size(), 254u);
  const std::set<std::vector<std::string>> distinct(first.begin(), first.end());
  std::cout << "distinct decode-step programs over 256 tokens: " << distinct.size() << " ("
            << first.front().size() << " device ops each)\n";
  EXPECT_EQ(distinct.size(), 1u);
  EXPECT_FALSE(first.front().empty());
  // Nothing goes up from the host in a greedy step: the token and position stay on the device.
  for (const auto& line : first.front()) {
    EXPECT_EQ(
        line.rfind("aten::_copy_from(", 0) == 0 && line.substr(0, line.find(',')).ends_with("@cpu"),
        false)
        << "a host->device copy in the step: " << line;
  }

  // A new request on the same engine, with a longer prompt and sampling: the same program but
  // for the sampler's own ops, so compare greedy to greedy.
  const auto second = step_programs(engine, prompt_of(37), greedy(20, 1));
  for (const auto& step : second) EXPECT_EQ(step, first.front());
}

bool is_host_read(const std::string& line) {
  return line.rfind("aten::_copy_from(", 0) == 0 && line.ends_with("@cpu, False)");
}

TEST(EngineOnStandin, ReadWindowsKeepOneProgramAndAddOnlyTheTransfer) {
  auto engine = make_engine(standin::kName);
  const auto steps = step_programs(engine, prompt_of(6), greedy(66, 8));
  ASSERT_EQ(steps.size(), 64u);
  // The step that ends a window is the plain step plus one device->host copy, which is a
  // transfer and not part of any compiled program: without it, every step is the same program.
  int64_t reading_steps = 0;
  std::set<std::vector<std::string>> distinct;
  for (const auto& step : steps) {
    std::vector<std::string> program;
    std::copy_if(step.begin(), step.end(), std::back_inserter(program),
                 [](const std::string& line) { return !is_host_read(line); });
    const auto reads = static_cast<int64_t>(step.size() - program.size());
    EXPECT_LE(reads, 1);
    reading_steps += reads;
    distinct.insert(program);
  }
  EXPECT_EQ(distinct.size(), 1u);
  EXPECT_EQ(reading_steps, 8);  // windows ended at steps 8..64
}

TEST(EngineOnStandin, SampledDecodeStepsAreOneProgram) {
  auto engine = make_engine(standin::kName);
  auto options = greedy(40, 1);
  options.sampling = every_knob();
  const auto steps = step_programs(engine, prompt_of(9), options);
  const std::set<std::vector<std::string>> distinct(steps.begin(), steps.end());
  EXPECT_EQ(distinct.size(), 1u);
}

}  // namespace
}  // namespace torchtpu
