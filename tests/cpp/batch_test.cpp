// Sequences decoded together in a Batch give the tokens each gives decoded alone (issue #17):
// greedy and seeded sampling at float32, with rows joining, leaving and cancelled at random
// steps, prompts read in chunks between other rows' tokens, and, on the stand-in device, a fixed
// number of rows with padding.
#include "engine/batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "engine/engine.h"
#include "engine/logprobs.h"
#include "model/sampling.h"
#include "standin_device.h"
#include "tiny_checkpoint.h"

namespace torchtpu {
namespace {

std::string tiny_dir() { return testing::tiny_checkpoint("batch-tiny", 3); }

Engine make_engine(const std::string& device = "cpu", int64_t chunk = 16) {
  auto o = testing::tiny_engine_options(tiny_dir(), chunk);
  o.device = parse_device(device);
  return Engine(o);
}

std::vector<int64_t> prompt_of(int64_t n, int64_t salt = 0) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(2 + (i * 37 + salt * 101) % 500);
  return ids;
}

DecodeOptions greedy(int64_t max_new) {
  DecodeOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  return o;
}

DecodeOptions sampled(int64_t max_new, uint64_t seed) {
  auto o = greedy(max_new);
  o.sampling.temperature = 0.9;
  o.sampling.top_k = 50;
  o.sampling.top_p = 0.95;
  o.sampling.repetition_penalty = 1.1;
  o.sampling.frequency_penalty = 0.2;
  o.sampling.seed = seed;
  return o;
}

struct Job {
  std::vector<int64_t> prompt;
  DecodeOptions options;
};

// Each sequence's tokens are those `reference` decodes for it alone; a cancelled one's are a
// prefix of them.
void expect_as_alone(Engine& reference, const std::map<int64_t, Job>& jobs,
                     const std::map<int64_t, DecodeResult>& results) {
  for (const auto& [id, job] : jobs) {
    const auto alone = reference.decode(job.prompt, job.options).tokens;
    const auto& got = results.at(id);
    if (got.finish == "cancelled") {
      ASSERT_LE(got.tokens.size(), alone.size());
      EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), alone.begin()))
          << "cancelled sequence " << id << " is a prefix of its tokens alone";
    } else {
      EXPECT_EQ(got.tokens, alone) << "sequence " << id;
    }
  }
}

// Runs the batch until idle; returns each finished sequence's result by id.
std::map<int64_t, DecodeResult> run(Batch& batch) {
  std::map<int64_t, DecodeResult> results;
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  return results;
}

// Logits with three equal largest values, where ATen's topk and sort each put a different one
// first: greedy decoding, the first candidate of top-p and the first top_logprobs entry are all
// the smallest of the three ids (argmax_last's rule).
TEST(Sampler, EqualLargestLogitsGoToTheSmallestIdEverywhere) {
  constexpr int64_t kVocab = 4096;
  at::manual_seed(0);
  const auto logits = at::randn({1, kVocab});
  for (const int64_t id : {kVocab / 3, int64_t{7}, kVocab - 5}) logits[0][id] = 10.0;
  SamplingParams greedy;
  SamplingParams top_p;  // only the first candidate survives
  top_p.temperature = 1.0;
  top_p.top_p = 1e-9;
  top_p.seed = 1;
  SamplingParams top_k_and_p = top_p;  // candidates through topk rather than a whole sort
  top_k_and_p.top_k = 3;
  for (const auto& params : {greedy, top_p, top_k_and_p}) {
    Sampler sampler(1, kVocab, at::kCPU, /*fixed_shape=*/false);
    sampler.set(0, params, {});
    EXPECT_EQ(sampler.next(logits).item<int64_t>(), 7) << params.top_k << " " << params.top_p;
  }
  const TokenLogprob entry = token_logprob(logits[0].log_softmax(0), 7, 3, /*ranked=*/true);
  ASSERT_EQ(entry.top.size(), 3u);
  EXPECT_EQ(entry.top[0].first, 7);
  EXPECT_EQ(entry.top[1].first, kVocab / 3);
  EXPECT_EQ(entry.top[2].first, kVocab - 5);
  EXPECT_EQ(entry.rank, 1);
}

TEST(Batch, GreedyRowsGiveTheTokensEachGivesAlone) {
  auto engine = make_engine();
  // More sequences than rows (the rest queue), prompts from 1 token to several chunks and
  // windows, budgets that end rows at different steps.
  std::vector<Job> jobs;
  for (int64_t i = 0; i < 7; ++i) jobs.push_back({prompt_of(1 + i * 9, i), greedy(5 + i * 7)});
  Batch batch(engine, {.rows = 3});
  for (const auto& job : jobs) batch.submit(job.prompt, job.options);
  const auto results = run(batch);
  ASSERT_EQ(results.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto alone = engine.decode(jobs[i].prompt, jobs[i].options);
    EXPECT_EQ(results.at(i).tokens, alone.tokens) << "sequence " << i;
    EXPECT_EQ(results.at(i).finish, "length");
    EXPECT_EQ(results.at(i).prompt_tokens, static_cast<int64_t>(jobs[i].prompt.size()));
  }
}

TEST(Batch, SampledRowsWithASeedGiveTheTokensEachGivesAlone) {
  auto engine = make_engine();
  std::vector<Job> jobs;
  for (int64_t i = 0; i < 5; ++i) jobs.push_back({prompt_of(3 + i * 11, i), sampled(30, 100 + i)});
  jobs.push_back({prompt_of(12, 9), greedy(30)});  // a greedy row among sampled ones
  Batch batch(engine, {.rows = 4});
  for (const auto& job : jobs) batch.submit(job.prompt, job.options);
  const auto results = run(batch);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(results.at(i).tokens, engine.decode(jobs[i].prompt, jobs[i].options).tokens)
        << "sequence " << i;
  }
}

TEST(Batch, RowsJoiningLeavingAndCancelledAtRandomStepsKeepTheirTokens) {
  auto engine = make_engine();
  std::mt19937 random(17);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(random);
  };
  Batch batch(engine, {.rows = 4, .step_tokens = 12});
  std::map<int64_t, Job> jobs;
  std::map<int64_t, DecodeResult> results;
  std::vector<int64_t> cancelled;
  int64_t submitted = 0;
  while (submitted < 14 || !batch.idle()) {
    if (submitted < 14 && pick(0, 2) == 0) {
      Job job{prompt_of(pick(1, 40), submitted),
              pick(0, 1) ? greedy(pick(1, 40)) : sampled(pick(1, 40), submitted)};
      jobs[batch.submit(job.prompt, job.options)] = job;
      ++submitted;
    }
    if (pick(0, 9) == 0) {
      const auto stats = batch.stats();
      if (stats.queued + stats.reading + stats.decoding > 0) {
        // A random live sequence: the newest ones not finished yet.
        for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
          if (!results.count(it->first) &&
              std::find(cancelled.begin(), cancelled.end(), it->first) == cancelled.end()) {
            batch.cancel(it->first);
            cancelled.push_back(it->first);
            break;
          }
        }
      }
    }
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  ASSERT_EQ(results.size(), jobs.size());
  EXPECT_FALSE(cancelled.empty());
  expect_as_alone(engine, jobs, results);
}

TEST(Batch, StopIdsAndOnTokensEndARowAndFreeItForTheQueue) {
  auto engine = make_engine();
  const auto prompt = prompt_of(10);
  const auto alone = engine.decode(prompt, greedy(20)).tokens;
  auto stopping = greedy(20);
  stopping.ignore_eos = false;
  stopping.stop_ids = {alone[6]};
  const auto first_stop =
      std::find(alone.begin(), alone.end(), alone[6]) - alone.begin();  // may repeat earlier

  Batch batch(engine, {.rows = 1});
  const int64_t stopped = batch.submit(prompt, stopping);
  int64_t seen = 0;
  const int64_t cancelled = batch.submit(prompt, greedy(20), [&](const std::vector<int64_t>& t) {
    seen += static_cast<int64_t>(t.size());
    return seen < 4;
  });
  const int64_t last = batch.submit(prompt, greedy(3));
  auto results = run(batch);
  EXPECT_EQ(results.at(stopped).finish, "stop");
  EXPECT_EQ(results.at(stopped).stop_id, alone[6]);
  EXPECT_EQ(results.at(stopped).tokens,
            std::vector<int64_t>(alone.begin(), alone.begin() + first_stop));
  EXPECT_EQ(results.at(cancelled).finish, "cancelled");
  EXPECT_EQ(results.at(cancelled).tokens, std::vector<int64_t>(alone.begin(), alone.begin() + 4));
  EXPECT_EQ(results.at(last).tokens, std::vector<int64_t>(alone.begin(), alone.begin() + 3));
}

TEST(Batch, ALongPromptIsReadInChunksWhileOtherRowsGetATokenEveryStep) {
  auto engine = make_engine("cpu", /*chunk=*/16);
  Batch batch(engine, {.rows = 3, .step_tokens = 10});
  const auto short_prompt = prompt_of(4, 1);
  std::vector<int64_t> steps_with_token;
  int64_t step = 0;
  const int64_t running = batch.submit(short_prompt, greedy(40), [&](const std::vector<int64_t>&) {
    steps_with_token.push_back(step);
    return true;
  });
  for (; step < 3; ++step) batch.step();
  const auto long_prompt = prompt_of(100, 2);
  const int64_t reader = batch.submit(long_prompt, greedy(8));
  int64_t reading_steps = 0;
  std::map<int64_t, DecodeResult> results;
  for (; !batch.idle(); ++step) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
    if (batch.stats().reading > 0) ++reading_steps;
  }
  // 100 prompt tokens at most 9 per step beside the one decoding row: 12 steps of reading, each
  // of which also gave the running sequence its next token.
  EXPECT_GE(reading_steps, 11);
  // Its first step gives two tokens (the prompt's and the decode step's), every later one one.
  ASSERT_EQ(steps_with_token.size(), 40u);
  for (size_t i = 2; i < steps_with_token.size(); ++i) {
    EXPECT_EQ(steps_with_token[i], steps_with_token[i - 1] + 1) << "a step without a token";
  }
  EXPECT_EQ(results.at(running).tokens, engine.decode(short_prompt, greedy(40)).tokens);
  EXPECT_EQ(results.at(reader).tokens, engine.decode(long_prompt, greedy(8)).tokens);
}

TEST(Batch, AStepWithNoRowDecodingReadsAWholePrefillChunk) {
  auto engine = make_engine("cpu", /*chunk=*/16);
  Batch batch(engine, {.rows = 2, .step_tokens = 5});
  const auto prompt = prompt_of(40, 3);
  const int64_t id = batch.submit(prompt, greedy(6));
  int64_t steps = 0;
  while (batch.stats().decoding == 0) {
    ASSERT_TRUE(batch.step().empty());
    ++steps;
  }
  // 40 tokens in chunks of 16: three steps, where the budget of 5 would have taken eight.
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(run(batch).at(id).tokens, engine.decode(prompt, greedy(6)).tokens);
}

TEST(Batch, PromptsArrivingTogetherShareForwardPassesAndKeepTheirTokens) {
  auto engine = make_engine("cpu", /*chunk=*/16);
  // Four prompts of different lengths, longer than the sliding window (8), so the shared passes
  // pad the shorter chunks and every row's rings wrap; greedy and seeded sampling.
  std::vector<Job> jobs = {{prompt_of(19, 1), greedy(6)},
                           {prompt_of(22, 2), sampled(6, 7)},
                           {prompt_of(21, 3), greedy(6)},
                           {prompt_of(23, 4), sampled(6, 8)}};
  Batch batch(engine, {.rows = 4, .step_tokens = 100, .pass_rows = 64});
  std::map<int64_t, Job> by_id;
  for (const auto& job : jobs) by_id[batch.submit(job.prompt, job.options)] = job;
  batch.step();
  const auto stats = batch.stats();
  EXPECT_EQ(stats.decoding, 4) << "every prompt read in the first step";
  EXPECT_EQ(stats.prompt_tokens, 19 + 22 + 21 + 23);
  // Chunks of at most 8 (the window), 4 rows to a pass, within the 100 tokens of a step with no
  // row decoding: 8 of each, 8 of each, then their last 3 to 7 padded to 7. One by one, each
  // prompt would take 2 passes (chunks of 16), 8 in all.
  EXPECT_EQ(stats.prompt_passes, 3);
  expect_as_alone(engine, by_id, run(batch));
}

TEST(Batch, APassOfPromptsAcrossADecodingRowLeavesItsRingsAsTheyWere) {
  auto engine = make_engine("cpu", /*chunk=*/16);
  Batch batch(engine, {.rows = 3, .step_tokens = 30, .pass_rows = 64});
  // Rows 0 and 2 end after one token; row 1 decodes on, with a prompt past the window, so
  // that a padding entry written into its sliding rings would replace one still in its window.
  std::map<int64_t, Job> jobs;
  for (const auto& job : std::vector<Job>{{prompt_of(5, 1), greedy(1)},
                                          {prompt_of(13, 2), greedy(20)},
                                          {prompt_of(6, 3), greedy(1)}}) {
    jobs[batch.submit(job.prompt, job.options)] = job;
  }
  std::map<int64_t, DecodeResult> results;
  for (int i = 0; i < 2; ++i) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  ASSERT_EQ(results.size(), 2u) << "rows 0 and 2 are free";
  const auto passes = batch.stats().prompt_passes;
  // Two prompts into rows 0 and 2: one pass over rows 0-2, row 1 padding alone.
  for (const auto& job :
       std::vector<Job>{{prompt_of(7, 5), greedy(8)}, {prompt_of(7, 6), sampled(8, 3)}}) {
    jobs[batch.submit(job.prompt, job.options)] = job;
  }
  batch.step();
  EXPECT_EQ(batch.stats().prompt_passes, passes + 1);
  EXPECT_EQ(batch.stats().decoding, 3);
  for (auto& [id, result] : run(batch)) results[id] = std::move(result);
  expect_as_alone(engine, jobs, results);
}

// A thinking budget: the markers are ids of the test's choosing, so that the tiny model's own
// greedy tokens open a block.
TEST(Batch, ASpentThinkingBudgetForcesTheBlockClosedAloneAndBesideOtherRows) {
  auto engine = make_engine();
  const auto prompt = prompt_of(9, 4);
  const auto free = engine.decode(prompt, greedy(12)).tokens;
  auto seen = [&](int64_t id, size_t end) {
    return std::count(prompt.begin(), prompt.end(), id) +
           std::count(free.begin(), free.begin() + end, id);
  };
  // The first token the model writes once: it opens the block; an id it never writes closes it.
  size_t k = 1;
  while (seen(free[k], free.size()) != 1) ++k;
  ASSERT_LE(k + 5, free.size());
  int64_t close = 2;
  while (seen(close, free.size()) != 0) ++close;
  const ThinkingMarkers markers{free[k], close};

  auto capped = greedy(12);
  capped.thinking_budget = ThinkingBudget{3, markers};
  const auto alone = engine.decode(prompt, capped).tokens;
  ASSERT_EQ(alone.size(), 12u);
  // Up to the opening marker and 3 tokens of thought, what the model writes freely; then the
  // closing marker, whatever the model would have written.
  EXPECT_EQ(std::vector<int64_t>(alone.begin(), alone.begin() + k + 4),
            std::vector<int64_t>(free.begin(), free.begin() + k + 4));
  EXPECT_EQ(alone[k + 4], close);

  // A block the prompt opened counts the prompt's tokens after the marker: with one there, a
  // budget of 2 leaves the model one token of thought.
  auto opened = prompt;
  opened.insert(opened.end(), {markers.open, prompt[0]});
  const auto opened_free = engine.decode(opened, greedy(12)).tokens;
  ASSERT_NE(opened_free[0], markers.open);
  auto two = greedy(12);
  two.thinking_budget = ThinkingBudget{2, markers};
  const auto opened_alone = engine.decode(opened, two).tokens;
  EXPECT_EQ(opened_alone[0], opened_free[0]);
  EXPECT_EQ(opened_alone[1], close);
  // A budget of 0 closes the block at once.
  auto none = greedy(12);
  none.thinking_budget = ThinkingBudget{0, markers};
  EXPECT_EQ(engine.decode(opened, none).tokens[0], close);

  // With a message, the spent budget writes the message first, then closes the block.
  auto told = greedy(static_cast<int64_t>(k) + 8);
  std::vector<int64_t> message;
  for (int64_t id = 2; message.size() < 2; ++id) {
    if (id != markers.open && id != close) message.push_back(id);
  }
  message.push_back(message[0]);
  told.thinking_budget = ThinkingBudget{3, markers, message};
  const auto told_alone = engine.decode(prompt, told).tokens;
  ASSERT_EQ(told_alone.size(), k + 8);
  EXPECT_EQ(std::vector<int64_t>(told_alone.begin(), told_alone.begin() + k + 4),
            std::vector<int64_t>(alone.begin(), alone.begin() + k + 4));
  EXPECT_EQ(std::vector<int64_t>(told_alone.begin() + k + 4, told_alone.begin() + k + 8),
            (std::vector<int64_t>{message[0], message[1], message[0], close}));

  // Beside a row without a budget, each row gets the tokens it gets alone.
  Batch batch(engine, {.rows = 4});
  batch.submit(prompt, capped);
  batch.submit(opened, two);
  batch.submit(prompt_of(5, 1), greedy(12));
  batch.submit(prompt, told);
  const auto results = run(batch);
  EXPECT_EQ(results.at(0).tokens, alone);
  EXPECT_EQ(results.at(1).tokens, opened_alone);
  EXPECT_EQ(results.at(2).tokens, engine.decode(prompt_of(5, 1), greedy(12)).tokens);
  EXPECT_EQ(results.at(3).tokens, told_alone);
}

// llama-server's id_slot (DecodeOptions::row): a sequence asking for a busy row waits for it while
// later ones take the other rows; each gets its tokens alone.
TEST(Batch, ASequenceAskingForARowWaitsForItWhileOthersTakeTheRest) {
  EXPECT_EQ(place_in_rows({1, -1, 1, -1, 0}, {true, true, false}),
            (std::vector<int64_t>{1, -1, -1, -1, 0}));
  EXPECT_EQ(place_in_rows({-1, 1, -1}, {true, true, true}), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(place_in_rows({-1, 0}, {true, true}), (std::vector<int64_t>{1, 0}))
      << "a row asked for goes to the sequence asking, even a later one";
  EXPECT_EQ(place_in_rows({2, -1}, {false, false, false}), (std::vector<int64_t>{-1, -1}));

  auto engine = make_engine();
  Batch batch(engine, {.rows = 2});
  std::map<int64_t, Job> jobs;
  const auto submit = [&](Job job, int64_t row) {
    job.options.row = row;
    jobs[batch.submit(job.prompt, job.options)] = job;
  };
  std::map<int64_t, DecodeResult> results;
  std::map<int64_t, std::set<int64_t>> rows_of;  // sequence -> the rows it was seen in
  submit({prompt_of(5, 1), greedy(12)}, -1);  // row 0
  ASSERT_TRUE(batch.step().empty());
  submit({prompt_of(6, 2), greedy(4)}, 0);    // waits for row 0
  submit({prompt_of(7, 3), greedy(3)}, -1);   // row 1, free
  submit({prompt_of(4, 4), greedy(3)}, -1);   // row 1, once the third leaves it
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
    const auto stats = batch.stats();
    for (size_t row = 0; row < stats.row_stats.size(); ++row) {
      if (stats.row_stats[row].sequence >= 0) rows_of[stats.row_stats[row].sequence].insert(row);
    }
  }
  EXPECT_EQ(rows_of, (std::map<int64_t, std::set<int64_t>>{{0, {0}}, {1, {0}}, {2, {1}},
                                                           {3, {1}}}));
  for (const auto& [id, result] : results) EXPECT_EQ(result.finish, "length") << id;
  expect_as_alone(engine, jobs, results);
  auto bad = greedy(2);
  for (const int64_t row : {2, -2}) {
    bad.row = row;
    try {
      batch.submit(prompt_of(3), bad);
      ADD_FAILURE() << "row " << row << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()), "row " + std::to_string(row) +
                                           " does not exist: the rows are 0 to 1 (-1: the "
                                           "first free one)");
    }
  }
}

// What DecodeOptions::prompt_logits saw: the chunks' logits by their first position.
struct PromptLogits {
  std::vector<std::pair<int64_t, at::Tensor>> chunks;
  OnPromptLogits callback() {
    return [this](const at::Tensor& logits, int64_t first) {
      chunks.emplace_back(first, logits.to(at::kCPU).clone());
    };
  }
  // The chunks in order, each starting where the one before ended: [positions, vocab].
  at::Tensor joined() const {
    std::vector<at::Tensor> parts;
    int64_t next = 0;
    for (const auto& [first, logits] : chunks) {
      EXPECT_EQ(first, next) << "a chunk's logits out of order";
      next = first + logits.size(0);
      parts.push_back(logits);
    }
    return at::cat(parts);
  }
};

TEST(Batch, PromptLogitsAreThoseOfOneCausalPassBesideOtherRowsAndWhateverTheCacheHolds) {
  // Chunks of at most kPromptLogitsChunk (not the engine's 100) across many sliding windows.
  auto engine = make_engine("cpu", 100);
  const auto prompt = prompt_of(150, 4);
  const std::vector<int64_t> head(prompt.begin(), prompt.begin() + 100);
  const auto want = engine.logits(prompt).narrow(0, 0, 149);

  Batch batch(engine, {.rows = 3, .cache_bytes = 64 << 20, .cache_block = 16});
  batch.submit(head, greedy(3));  // leaves its state in the prefix cache
  run(batch);
  PromptLogits seen;
  auto scored = greedy(12);
  scored.prompt_logits = seen.callback();
  const int64_t beside = batch.submit(prompt_of(20, 5), greedy(40));  // decodes meanwhile
  const int64_t id = batch.submit(prompt, scored);
  const auto results = run(batch);
  const auto got = seen.joined();
  ASSERT_EQ(got.size(0), 149);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-4);
  for (const auto& [first, logits] : seen.chunks) EXPECT_LE(logits.size(0), kPromptLogitsChunk);
  EXPECT_EQ(results.at(id).cached_tokens, 0) << "restored positions have no logits";
  EXPECT_EQ(results.at(id).tokens, engine.decode(prompt, greedy(12)).tokens);
  EXPECT_EQ(results.at(beside).tokens, engine.decode(prompt_of(20, 5), greedy(40)).tokens);
  // The cache did hold the prompt's head: without prompt logits it is restored.
  const int64_t again = batch.submit(prompt, greedy(2));
  EXPECT_GE(run(batch).at(again).cached_tokens, 96);

  // Engine::decode sees the same logits.
  PromptLogits alone;
  scored.prompt_logits = alone.callback();
  EXPECT_EQ(engine.decode(prompt, scored).tokens, results.at(id).tokens);
  EXPECT_LE((alone.joined() - want).abs().max().item<double>(), 1e-4);
  // A one-token prompt has no token to score.
  PromptLogits none;
  scored.prompt_logits = none.callback();
  engine.decode({2}, scored);
  EXPECT_TRUE(none.chunks.empty());
}

TEST(Batch, BadInputIsAValueErrorNamingTheLimit) {
  auto engine = make_engine();
  EXPECT_THROW(Batch(engine, {.rows = 0}), ValueError);
  try {
    Batch(engine, {.rows = 4, .step_tokens = 4});
    FAIL() << "step_tokens equal to rows was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("step_tokens (4) must exceed rows (4)"), std::string::npos)
        << e.what();
  }
  try {
    Batch(engine, {.rows = 2, .pass_rows = -3});
    FAIL() << "a negative pass_rows was accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "pass_rows must be at least 0, got -3");
  }
  Batch batch(engine, {.rows = 2});
  EXPECT_THROW(batch.submit({}, greedy(4)), ValueError);
  EXPECT_THROW(batch.submit({2, 100000}, greedy(4)), ValueError);
  EXPECT_THROW(batch.submit({2, 3}, greedy(0)), ValueError);
  auto budget = greedy(4);
  budget.thinking_budget = ThinkingBudget{-1, {5, 6}};
  try {
    batch.submit({2, 3}, budget);
    FAIL() << "a negative thinking budget was accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "thinking_budget must be at least 0, got -1");
  }
  budget.thinking_budget = ThinkingBudget{4, {5, 100000}};
  EXPECT_THROW(batch.submit({2, 3}, budget), ValueError);
  budget.thinking_budget = ThinkingBudget{4, {5, 6}, {7, 6}};
  try {
    batch.submit({2, 3}, budget);
    FAIL() << "a budget message holding the closing marker was accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "thinking_budget message holds the thinking block's marker 6: it would close it "
                 "early");
  }
  budget.thinking_budget = ThinkingBudget{4, {5, 6}, {100000}};
  EXPECT_THROW(batch.submit({2, 3}, budget), ValueError);
  EXPECT_THROW(batch.cancel(5), ValueError);
  EXPECT_THROW(batch.take_result(0), ValueError);
  const int64_t id = batch.submit({2, 3}, greedy(2));
  while (batch.step().empty()) {
  }
  EXPECT_EQ(batch.take_result(id).tokens.size(), 2u);
  EXPECT_THROW(batch.take_result(id), ValueError);  // taken once
  EXPECT_THROW(batch.cancel(id), ValueError);       // finished
}

TEST(Batch, OnTheStandinDeviceEveryStepRunsAllRowsWithPaddingAndMatchesTheCpu) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  Batch batch(standin, {.rows = 4, .step_tokens = 24});
  std::vector<Job> jobs{{prompt_of(5, 1), greedy(24)}, {prompt_of(30, 2), sampled(12, 5)}};
  for (const auto& job : jobs) batch.submit(job.prompt, job.options);
  standin::start_recording();
  const auto results = run(batch);
  const auto record = standin::stop_recording();
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(results.at(i).tokens, cpu.decode(jobs[i].prompt, jobs[i].options).tokens)
        << "sequence " << i;
  }
  // Every decode step embeds all four rows' tokens, whatever the number of live ones; the prompt
  // chunks are the only other lookups: both prompts' first 5 and 8 tokens (the window) in one
  // pass of 2 x 8, then the longer one's next 8 and last 14 alone, within the step budgets of 24
  // and 23.
  std::map<std::string, int64_t> lookups;
  for (const auto& line : record) {
    if (line.rfind("aten::index_select(Float[512, 64], 0, ", 0) == 0) ++lookups[line];
  }
  auto of = [&](int tokens) {
    return lookups["aten::index_select(Float[512, 64], 0, Long[" + std::to_string(tokens) + "])"];
  };
  EXPECT_EQ(of(4), 23) << "one per token of the longer sequence after its first";
  EXPECT_EQ(of(16), 1);
  EXPECT_EQ(of(8), 1);
  EXPECT_EQ(of(14), 1);
  EXPECT_EQ(lookups.size(), 4u);
}

// Drafting rows on a fixed-shape device: every pass that checks drafts takes all rows with the
// rows' longest draft room (3 rows x (1 + 3) tokens), whatever each row found, and each sequence
// gets the tokens it gets alone on the CPU without drafts.
TEST(Batch, OnTheStandinDeviceDraftingPassesHaveOneShapeAndMatchTheCpu) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  Batch batch(standin, {.rows = 3});
  std::vector<Job> jobs;
  for (int64_t i = 0; i < 3; ++i) {
    auto prompt = prompt_of(10, 60 + i);
    const auto once = prompt;
    prompt.insert(prompt.end(), once.begin(), once.end());
    auto o = i == 1 ? sampled(20, 9) : greedy(20 + 5 * i);
    o.draft = {.tokens = 3, .ngram_min = 1, .always = true};
    jobs.push_back({prompt, o});
    batch.submit(jobs.back().prompt, o);
  }
  standin::start_recording();
  const auto results = run(batch);
  const auto record = standin::stop_recording();
  int64_t drafted = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto alone = jobs[i].options;
    alone.draft = {};
    EXPECT_EQ(results.at(i).tokens, cpu.decode(jobs[i].prompt, alone).tokens) << "sequence " << i;
    drafted += results.at(i).drafted;
  }
  EXPECT_GT(drafted, 0);
  // The embedding lookups of a multiple of the 3 rows are plain steps' 3 tokens and drafting
  // passes' 12, no other size (this test's prompt chunks come to other sizes).
  std::map<int64_t, int64_t> all_rows;
  const std::string lookup = "aten::index_select(Float[512, 64], 0, Long[";
  for (const auto& line : record) {
    if (line.rfind(lookup, 0) != 0) continue;
    const int64_t n = std::stoll(line.substr(lookup.size()));
    if (n % 3 == 0) ++all_rows[n];
  }
  EXPECT_GT(all_rows[12], 0) << "no drafting pass of 3 rows x 4 tokens";
  EXPECT_GT(all_rows[3], 0) << "no plain step";
  EXPECT_EQ(all_rows.size(), 2u);
}

// Issue #20's one program per decode step, with rows joining, leaving and cancelled: every step
// that reads no prompt (nothing queued or reading when it starts) runs the same device ops, the
// forward pass, the sampling of all rows and the one read back, whatever the number of live rows
// and however each samples: greedy, temperature with top-k, top-p and min-p, penalties, logit
// bias, seeds. And each sequence still gives the tokens it gives alone on the CPU.
TEST(Batch, OnTheStandinDeviceEveryDecodeStepIsOneProgramAsRowsJoinLeaveAndSampleDifferently) {
  auto cpu = make_engine("cpu");
  auto standin = make_engine(standin::kName);
  Batch batch(standin, {.rows = 3});
  std::mt19937 rng(11);
  auto kind_of = [](int64_t i, int64_t max_new) {
    auto o = greedy(max_new);
    switch (i % 5) {
      case 1: o = sampled(max_new, 20 + i); break;
      case 2:
        o.sampling.temperature = 1.3;
        o.sampling.top_k = 40;
        o.sampling.top_p = 0.8;
        o.sampling.min_p = 0.05;
        o.sampling.seed = 30 + i;
        break;
      case 3:
        o.sampling.repetition_penalty = 1.3;
        o.sampling.presence_penalty = 0.5;
        o.sampling.frequency_penalty = -0.4;
        break;
      case 4:
        o.sampling.temperature = 0.7;
        o.sampling.logit_bias = {{7, 5.0}, {300, -100.0}};
        o.sampling.seed = 40 + i;
        break;
    }
    return o;
  };
  std::map<int64_t, Job> jobs;
  std::map<int64_t, DecodeResult> results;
  std::set<std::vector<std::string>> steps;
  std::set<int64_t> live_rows_seen;
  int64_t decode_steps = 0, cancelled = 0;
  for (int64_t step = 0; step < 200 && (jobs.size() < 10 || !batch.idle()); ++step) {
    if (jobs.size() < 10 && rng() % 4 == 0) {
      const auto i = static_cast<int64_t>(jobs.size());
      Job job{prompt_of(3 + rng() % 9, 40 + i), kind_of(i, 4 + rng() % 14)};
      jobs[batch.submit(job.prompt, job.options)] = job;
    }
    auto before = batch.stats();
    if (before.queued == 0 && before.reading == 0 && before.decoding > 1 && rng() % 8 == 0) {
      for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
        if (!results.count(it->first)) {
          batch.cancel(it->first);
          ++cancelled;
          break;
        }
      }
    }
    standin::start_recording();
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
    const auto record = standin::stop_recording();
    if (before.queued == 0 && before.reading == 0 && before.decoding > 0) {
      steps.insert(record);
      live_rows_seen.insert(before.decoding);
      ++decode_steps;
    }
  }
  ASSERT_TRUE(batch.idle());
  ASSERT_EQ(results.size(), 10u);
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(decode_steps, 20);
  EXPECT_GT(live_rows_seen.size(), 1u) << "the steps compared had the same number of live rows";
  std::cout << "over " << decode_steps << " decode steps with 1 to " << *live_rows_seen.rbegin()
            << " live rows of 3 (" << cancelled << " cancelled): " << steps.size()
            << " distinct whole-step programs of " << steps.begin()->size() << " ops\n";
  EXPECT_EQ(steps.size(), 1u);
  expect_as_alone(cpu, jobs, results);
}

}  // namespace
}  // namespace torchtpu
