// The prefix cache of a Batch (issue #17): a sequence that starts from a saved state gives the
// tokens and, within 1e-4 at float32, the logits it gives read from scratch: after a previous
// turn and its reply, at a block boundary inside a shared prompt, past the sliding window's edge,
// after evictions, and for rows given one prompt (or a common start) together, which read it once;
// the budget, LRU order and counters say what happened.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "engine/batch.h"
#include "engine/engine.h"
#include "engine/state_file.h"
#include "model/rings.h"
#include "tiny_checkpoint.h"

namespace torchtpu {
namespace {

// Sliding window 8: every reuse point here is past the window's edge.
std::string tiny_dir() { return testing::tiny_checkpoint("prefix-cache-tiny", 4); }

Engine make_engine() { return Engine(testing::tiny_engine_options(tiny_dir(), 24)); }

std::vector<int64_t> tokens_of(int64_t n, int64_t salt) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(4 + (i * 37 + salt * 101) % 500);
  return ids;
}

std::vector<int64_t> operator+(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

DecodeOptions greedy(int64_t max_new) {
  DecodeOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  return o;
}

struct Run {
  DecodeResult result;
  std::vector<at::Tensor> logits;
};

// One sequence through the batch, with the logits of each of its tokens.
Run through(Batch& batch, const std::vector<int64_t>& prompt, int64_t max_new,
            std::vector<int64_t> reuse_points = {}) {
  Run run;
  auto options = greedy(max_new);
  options.reuse_points = std::move(reuse_points);
  const int64_t id = batch.submit(
      prompt, options, {}, [&](const at::Tensor& logits) { run.logits.push_back(logits.clone()); });
  while (!batch.idle()) batch.step();
  run.result = batch.take_result(id);
  return run;
}

// The same sequence read from scratch by the engine alone.
Run alone(Engine& engine, const std::vector<int64_t>& prompt, int64_t max_new) {
  Run run;
  run.result = engine.decode(prompt, greedy(max_new), {}, [&](const at::Tensor& logits) {
    run.logits.push_back(logits.clone());
  });
  return run;
}

void expect_same(const Run& got, const Run& expected) {
  EXPECT_EQ(got.result.tokens, expected.result.tokens);
  ASSERT_EQ(got.logits.size(), expected.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    const double diff = (got.logits[i] - expected.logits[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4) << "logits of token " << i;
  }
}

TEST(PrefixCache, ASecondTurnStartsFromTheFirstTurnAndItsReply) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto first_prompt = tokens_of(37, 1);
  const auto first = through(batch, first_prompt, 10);
  EXPECT_EQ(first.result.cached_tokens, 0);
  // The reply's last token was sampled but never fed: the rings hold the prompt and 9 tokens.
  const auto second_prompt = first_prompt + first.result.tokens + tokens_of(6, 2);
  const auto second = through(batch, second_prompt, 12);
  EXPECT_EQ(second.result.cached_tokens, 37 + 9);
  expect_same(second, alone(engine, second_prompt, 12));
  const auto stats = batch.stats().cache;
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.reused_tokens, 46);
}

// DecodeOptions::cache_salt: a sequence starts only from states saved under its own salt, and
// gives the tokens it gives from scratch either way.
TEST(PrefixCache, ASequenceReusesOnlyWhatWasSavedUnderItsSalt) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto prompt = tokens_of(37, 3);
  auto salted = [&](const std::string& salt) {
    auto o = greedy(6);
    o.cache_salt = salt;
    const int64_t id = batch.submit(prompt, o);
    while (!batch.idle()) batch.step();
    return batch.take_result(id);
  };
  const auto alone_tokens = alone(engine, prompt, 6).result.tokens;
  for (const auto& [salt, cached] : std::vector<std::pair<std::string, int64_t>>{
           {"a", 0}, {"a", 36}, {"b", 0}, {"", 0}, {"", 36}, {"b", 36}}) {
    const auto result = salted(salt);
    EXPECT_EQ(result.cached_tokens, cached) << "salt '" << salt << "'";
    EXPECT_EQ(result.tokens, alone_tokens) << "salt '" << salt << "'";
  }
}

// A regenerated reply: the state saved where the prompt ended serves the prompt itself, less
// its last token, which is read again for the logits. 37 is no multiple of the block and spans
// several sliding windows; the slot of the left-out entry held one that no later window reaches.
TEST(PrefixCache, APromptSentAgainReadsOnlyItsLastToken) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto prompt = tokens_of(37, 5);
  const auto expected = alone(engine, prompt, 10);
  expect_same(through(batch, prompt, 10), expected);
  const auto again = through(batch, prompt, 10);
  EXPECT_EQ(again.result.cached_tokens, 36);
  expect_same(again, expected);
  // The sequence left a longer state (the prompt and 9 fed tokens): it does not cover this one.
  const auto shorter = std::vector<int64_t>(prompt.begin(), prompt.begin() + 30);
  EXPECT_EQ(through(batch, shorter, 4).result.cached_tokens, 16);
  EXPECT_EQ(batch.stats().cache.reused_tokens, 36 + 16);
}

TEST(PrefixCache, ATurnWhoseReplyIsRenderedInOtherTokensReusesThePreviousPrompt) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto first_prompt = tokens_of(37, 3);
  const auto first = through(batch, first_prompt, 10);
  // The template wrote the reply back in tokens the model did not feed: only the prompt, saved
  // where it ended (37 is no multiple of the block), matches.
  auto rendered = first.result.tokens;
  rendered[0] = rendered[0] == 7 ? 8 : 7;
  const auto second_prompt = first_prompt + rendered + tokens_of(6, 4);
  const auto second = through(batch, second_prompt, 12);
  EXPECT_EQ(second.result.cached_tokens, 37);
  expect_same(second, alone(engine, second_prompt, 12));
}

TEST(PrefixCache, PromptsSharingTheirStartReuseItFromTheLastBlockBoundary) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto system = tokens_of(40, 3);
  through(batch, system + tokens_of(5, 4), 4);
  // Saved while reading: after 16 and 32 tokens (and the whole sequence when it left).
  const auto other = system + tokens_of(9, 5);
  const auto run = through(batch, other, 8);
  EXPECT_EQ(run.result.cached_tokens, 32);
  expect_same(run, alone(engine, other, 8));
}

// DecodeOptions::reuse_points: the state where a turn begins serves a prompt that parts from this
// one there (another conversation after the same system prompt), where the last block end before
// it was all there was.
TEST(PrefixCache, APromptPartingAtAReusePointStartsFromIt) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto system = tokens_of(21, 3);
  const auto first = system + tokens_of(5, 4);
  expect_same(through(batch, first, 4, {21}), alone(engine, first, 4));
  const auto other = system + tokens_of(9, 5);
  const auto run = through(batch, other, 8);
  EXPECT_EQ(run.result.cached_tokens, 21);
  expect_same(run, alone(engine, other, 8));

  for (const int64_t point : {0, 30, -1}) {
    auto options = greedy(2);
    options.reuse_points = {point};
    try {
      batch.submit(other, options);
      ADD_FAILURE() << "reuse point " << point << " was taken";
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()), "reuse point " + std::to_string(point) +
                                           " is outside the prompt's positions [1, 30)");
    }
  }
}

TEST(PrefixCache, EvictionKeepsTheBudgetAndAMissAfterItReadsFromScratch) {
  auto engine = make_engine();
  // Room for about one sequence's state of ~50 positions: each new one evicts the older.
  Batch probe(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
  through(probe, tokens_of(45, 6), 6);
  const int64_t one_state = probe.stats().cache.bytes;
  ASSERT_GT(one_state, 0);

  Batch batch(engine, {.rows = 1, .cache_bytes = one_state + one_state / 2, .cache_block = 16});
  const auto a = tokens_of(45, 7), b = tokens_of(45, 8);
  const auto first_a = through(batch, a, 6);
  through(batch, b, 6);
  const auto stats = batch.stats().cache;
  EXPECT_GT(stats.evictions, 0);
  EXPECT_LE(stats.bytes, one_state + one_state / 2);

  const auto again_a = a + first_a.result.tokens;
  const auto miss = through(batch, again_a, 6);
  EXPECT_LT(miss.result.cached_tokens, 45) << "a's states were evicted for b's";
  expect_same(miss, alone(engine, again_a, 6));
  // b's blocks went for a's second turn; its states were the least recently used.
  const auto after = through(batch, b + tokens_of(3, 9), 6);
  expect_same(after, alone(engine, b + tokens_of(3, 9), 6));
}

TEST(PrefixCache, RowsOfABatchShareItWhileDecodingTogether) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 3, .cache_bytes = 64 << 20, .cache_block = 8});
  const auto system = tokens_of(30, 10);
  through(batch, system + tokens_of(2, 11), 2);
  std::vector<std::vector<int64_t>> prompts;
  std::map<int64_t, std::vector<int64_t>> by_id;
  for (int64_t i = 0; i < 5; ++i) {
    prompts.push_back(system + tokens_of(3 + i * 5, 12 + i));
    by_id[batch.submit(prompts.back(), greedy(10))] = prompts.back();
  }
  std::map<int64_t, DecodeResult> results;
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  for (const auto& [id, prompt] : by_id) {
    EXPECT_GE(results.at(id).cached_tokens, 24) << "sequence " << id;
    EXPECT_EQ(results.at(id).tokens, engine.decode(prompt, greedy(10)).tokens) << "sequence " << id;
  }
}

// Submits `prompts` together (sampled, seed 50 + i) and runs the batch until idle: each one's
// result and the logits of each of its tokens.
std::vector<Run> together(Batch& batch, const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<Run> runs(prompts.size());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto options = greedy(8);
    options.sampling.temperature = 0.9;
    options.sampling.seed = 50 + i;
    index[batch.submit(prompts[i], options, {}, [&runs, i](const at::Tensor& logits) {
      runs[i].logits.push_back(logits.clone());
    })] = i;
  }
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) runs[index.at(id)].result = batch.take_result(id);
  }
  return runs;
}

// `prompts` decoded one at a time by the engine alone, as together() samples them.
std::vector<Run> each_alone(Engine& engine, const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<Run> runs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto options = greedy(8);
    options.sampling.temperature = 0.9;
    options.sampling.seed = 50 + i;
    Run run;
    run.result = engine.decode(prompts[i], options, {}, [&](const at::Tensor& logits) {
      run.logits.push_back(logits.clone());
    });
    runs.push_back(std::move(run));
  }
  return runs;
}

TEST(PrefixCache, RowsGivenOnePromptTogetherReadItOnce) {
  auto engine = make_engine();
  const auto prompt = tokens_of(45, 20);  // two chunks of 24, no multiple of the block
  const std::vector<std::vector<int64_t>> prompts(3, prompt);
  const auto expected = each_alone(engine, prompts);
  Batch batch(engine, {.rows = 3, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto runs = together(batch, prompts);
  // The first row read it; the others waited, then started from its state before the last token.
  EXPECT_EQ(batch.stats().prompt_tokens, 45 + 1 + 1);
  EXPECT_EQ(runs[0].result.cached_tokens, 0);
  EXPECT_EQ(runs[1].result.cached_tokens, 44);
  EXPECT_EQ(runs[2].result.cached_tokens, 44);
  EXPECT_EQ(batch.stats().cache.hits, 2);
  EXPECT_EQ(batch.stats().cache.misses, 1);
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    expect_same(runs[i], expected[i]);
  }
  // Three draws: the seeds differ.
  EXPECT_NE(runs[0].result.tokens, runs[1].result.tokens);

  // Without a cache, or with one too small to hold a state, nobody waits for what cannot be
  // restored: each row reads the whole prompt.
  for (const int64_t budget : {int64_t{0}, int64_t{1}}) {
    Batch plain(engine, {.rows = 3, .cache_bytes = budget, .cache_block = 16});
    const auto read_alone = together(plain, prompts);
    EXPECT_EQ(plain.stats().prompt_tokens, 3 * 45) << "budget " << budget;
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(read_alone[i].result.tokens, expected[i].result.tokens) << "budget " << budget;
    }
  }
}

TEST(PrefixCache, ARowWaitsForTheStartItSharesAndReadsOnlyItsOwnTokens) {
  auto engine = make_engine();
  const auto system = tokens_of(30, 21);
  const std::vector<std::vector<int64_t>> prompts = {system + tokens_of(10, 22),
                                                     system + tokens_of(7, 23), tokens_of(20, 24)};
  const auto expected = each_alone(engine, prompts);
  Batch batch(engine, {.rows = 3, .cache_bytes = 64 << 20, .cache_block = 16});
  const auto runs = together(batch, prompts);
  // The second waited for the first to read the 30 shared tokens (its state saved there, no
  // multiple of the block), then read its own 7; the third shares nothing and read all of its.
  EXPECT_EQ(runs[1].result.cached_tokens, 30);
  EXPECT_EQ(runs[2].result.cached_tokens, 0);
  EXPECT_EQ(batch.stats().prompt_tokens, 40 + 7 + 20);
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    expect_same(runs[i], expected[i]);
  }
}

// llama-server's slot save and restore (engine/state_file.h): a state a row left, written to a
// file and read by another engine on the same weights (a restarted server), gives a sequence
// starting with its tokens the tokens and logits of reading them all, across the sliding window.
TEST(SlotState, AStateReadFromAFileGivesAnotherEngineWhatReadingItsTokensGives) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("slot-state-" + std::to_string(::getpid()) + ".safetensors");
  const auto first_prompt = tokens_of(37, 12);
  std::vector<int64_t> second_prompt;
  {
    auto engine = make_engine();
    Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
    through(batch, tokens_of(20, 13), 3);  // row 0 is free again: the next sequence takes it
    const auto first = through(batch, first_prompt, 10);
    second_prompt = first_prompt + first.result.tokens + tokens_of(6, 14);
    // A link where the partial file goes is replaced, not written through.
    const auto target = file.string() + ".target";
    std::filesystem::remove(file.string() + ".partial");
    std::ofstream(target) << "kept";
    std::filesystem::create_symlink(target, file.string() + ".partial");
    const SlotOutcome saved = batch.save_slot(0, file.string());
    EXPECT_EQ(std::filesystem::file_size(target), 4u);
    EXPECT_FALSE(std::filesystem::exists(file.string() + ".partial"));
    std::filesystem::remove(target);
    EXPECT_EQ(saved.tokens, 37 + 9);
    EXPECT_EQ(saved.bytes, static_cast<int64_t>(std::filesystem::file_size(file)));
  }
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
  const SlotOutcome restored = batch.restore_slot(1, file.string());
  EXPECT_EQ(restored.tokens, 46);
  EXPECT_EQ(restored.bytes, static_cast<int64_t>(std::filesystem::file_size(file)));
  const auto second = through(batch, second_prompt, 12);
  EXPECT_EQ(second.result.cached_tokens, 46);
  expect_same(second, alone(engine, second_prompt, 12));
  // The restored state is the row's: saved again, it is the same file's worth.
  const auto again = file.string() + ".again";
  EXPECT_EQ(batch.save_slot(1, again).tokens, 46);
  std::filesystem::remove(file);
  std::filesystem::remove(again);
}

TEST(SlotState, AFileOfOtherWeightsRingsOrContextIsAFormatErrorSayingSo) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto file = (dir / ("slot-other-" + std::to_string(::getpid()))).string();
  {
    auto engine = make_engine();
    Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
    through(batch, tokens_of(45, 15), 4);
    ASSERT_EQ(batch.save_slot(0, file).tokens, 48);
  }
  const auto refused = [&](EngineOptions options, const std::string& needle) {
    Engine engine(options);
    Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
    try {
      batch.restore_slot(0, file);
      ADD_FAILURE() << "restored into an engine whose " << needle << " differs";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(batch.stats().cache.states, 0);
  };
  const auto same = testing::tiny_engine_options(tiny_dir(), 24);
  refused(testing::tiny_engine_options(testing::tiny_checkpoint("prefix-cache-tiny", 5), 24),
          "other weights");
  auto bf16 = same;
  bf16.dtype = at::kBFloat16;
  refused(bf16, "where this engine's rings hold BF16");
  auto short_context = same;
  short_context.context = 40;
  refused(short_context, "holds a state of 48 tokens; this engine's context takes states of 1 "
                         "to 39");

  auto engine = make_engine();
  Batch batch(engine, {.rows = 1, .cache_bytes = 64 << 20, .cache_block = 16});
  EXPECT_THROW(batch.restore_slot(0, file + ".missing"), NotFoundError);
  // A safetensors file of another kind: the checkpoint's own weights.
  try {
    batch.restore_slot(0, tiny_dir() + "/model.safetensors");
    ADD_FAILURE() << "restored a checkpoint as a state";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a prefix state file"), std::string::npos);
  }
  // A byte of a ring's KV changed after the save (a disk's error, another program): the
  // header, shapes and weights still match, the digest does not.
  const auto flipped = file + ".flipped";
  std::filesystem::copy_file(file, flipped);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    // Half way in: past the small header, inside the rings' KV.
    const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(flipped) / 2);
    f.seekg(middle);
    const char byte = static_cast<char>(f.get() ^ 0x10);
    f.seekp(middle);
    f.put(byte);
  }
  try {
    batch.restore_slot(0, flipped);
    ADD_FAILURE() << "restored a file whose bytes changed";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes do not match the digest written with them"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(batch.stats().cache.states, 0);
  // Cut short on the way: the header no longer fits the file.
  const auto cut = file + ".cut";
  std::filesystem::copy_file(file, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(file) / 2);
  EXPECT_THROW(batch.restore_slot(0, cut), FormatError);
  // A state larger than the whole budget is refused, and nothing is held.
  Batch small(engine, {.rows = 1, .cache_bytes = 4096, .cache_block = 16});
  try {
    small.restore_slot(0, file);
    ADD_FAILURE() << "restored a state larger than the budget";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("larger than the prefix cache's whole budget"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(small.stats().cache.states, 0);
  // Written again with a digest that matches (anyone can compute one): values no decode leaves in
  // a ring are refused as the file is read, not met by the request that reuses them.
  Rings rings(engine.config(), engine.options().context, 1, at::kFloat, at::kCPU);
  const auto forged = [&](const std::function<void(PrefixState&)>& edit,
                          const std::string& needle) {
    PrefixState state = read_prefix_state(file, engine.weights_id(), rings);
    edit(state);
    const auto path = file + ".forged";
    write_prefix_state(path, state, engine.weights_id());
    try {
      batch.restore_slot(0, path);
      ADD_FAILURE() << "restored a file whose state has " << needle;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(batch.stats().cache.states, 0);
    std::filesystem::remove(path);
  };
  forged([](PrefixState& s) { s.full_k[0].view(-1)[5] = NAN; },
         "full.0.k holds a value that is "
         "not finite");
  forged([](PrefixState& s) { s.sliding_v[0].view(-1)[0] = INFINITY; },
         "sliding.0.v holds a value that is not finite");
  forged([](PrefixState& s) { s.sliding_kpos[0][0] = int64_t{1} << 62; },
         "sliding.0.kpos holds a position outside -1 (an empty slot) to 47, the state's last");
  forged([](PrefixState& s) { s.sliding_kpos[0][0] = -5; }, "sliding.0.kpos holds a position");
  std::filesystem::remove(file);
  std::filesystem::remove(cut);
  std::filesystem::remove(flipped);
}

TEST(SlotState, EraseForgetsTheRowsStateAndActionsOnNothingAreValueErrors) {
  const auto file = (std::filesystem::temp_directory_path() /
                     ("slot-erase-" + std::to_string(::getpid()))).string();
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2, .cache_bytes = 64 << 20, .cache_block = 16});
  EXPECT_THROW(batch.save_slot(0, file), ValueError) << "no sequence has finished in row 0";
  EXPECT_THROW(batch.save_slot(2, file), ValueError) << "there is no row 2";
  EXPECT_THROW(batch.erase_slot(-1), ValueError);
  EXPECT_EQ(batch.erase_slot(1), 0);
  const auto prompt = tokens_of(37, 16);
  const auto first = through(batch, prompt, 10);
  EXPECT_EQ(batch.erase_slot(0), 46);
  EXPECT_EQ(batch.erase_slot(0), 0);
  EXPECT_THROW(batch.save_slot(0, file), ValueError) << "row 0's state was erased";
  // What is left is the prompt's own save point: the next turn reads the reply again.
  const auto next = prompt + first.result.tokens + tokens_of(6, 17);
  const auto run = through(batch, next, 6);
  EXPECT_EQ(run.result.cached_tokens, 37);
  expect_same(run, alone(engine, next, 6));

  Batch uncached(engine, {.rows = 1});
  EXPECT_THROW(uncached.erase_slot(0), ValueError) << "no prefix cache";
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(PrefixCache, BadBudgetsAreValueErrors) {
  EXPECT_THROW(PrefixCache(-1, 16), ValueError);
  EXPECT_THROW(PrefixCache(1 << 20, 0), ValueError);
}

}  // namespace
}  // namespace torchtpu
