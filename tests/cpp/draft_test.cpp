// Speculative decoding by prompt lookup (engine/draft.h, Engine::decode with DecodeOptions::draft):
// the drafter's choice of continuation, and a decode with drafts giving the tokens and logits a
// decode without them gives: greedy and seeded sampling at float32, drafts longer than a sliding
// window, stops and thinking budgets inside a draft, the rings' windows across rejected drafts.
#include "engine/draft.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/batch.h"
#include "engine/engine.h"
#include "model/make_tiny.h"
#include "tiny_checkpoint.h"

namespace torchtpu {
namespace {

using Ids = std::vector<int64_t>;

Drafting ngrams(int64_t min, int64_t max) {
  return {.tokens = 8, .ngram_min = min, .ngram_max = max};
}

TEST(LookupDraft, TakesWhatFollowedTheLatestEarlierRunOfTheLastTokensThatIsFollowedEnough) {
  // [1, 2] ends the sequence and occurs at 0 and 4: the latest, at 4, is followed by 5, 6, 1, 2.
  const Ids history{1, 2, 3, 4, 1, 2, 5, 6, 1, 2};
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 4), 3), (Ids{5, 6, 1}));
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 4), 4), (Ids{5, 6, 1, 2}));
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 4), 0), Ids{});
  // The same split between prompt and output.
  EXPECT_EQ(lookup_draft({1, 2, 3, 4, 1, 2}, {5, 6, 1, 2}, ngrams(2, 4), 3), (Ids{5, 6, 1}));
  // Fewer than asked follow the latest: the earliest, which the most follow.
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 4), 8), (Ids{3, 4, 1, 2, 5, 6, 1, 2}));
  // In a loop the latest run is followed by one turn only; the earliest continues it further.
  EXPECT_EQ(lookup_draft({9, 4, 4, 4, 4}, {}, ngrams(2, 2), 3), (Ids{4, 4}));
}

TEST(LookupDraft, PrefersTheLongestRunAndStopsAtTheShortest) {
  // [7, 1, 2] recurs from 0 (followed by 9); the shorter [1, 2] more recently (followed by 8).
  const Ids history{7, 1, 2, 9, 3, 1, 2, 8, 7, 1, 2};
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 3), 2), (Ids{9, 3}));
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 2), 2), (Ids{8, 7}));
  EXPECT_EQ(lookup_draft(history, {}, ngrams(2, 2), 4), (Ids{8, 7, 1, 2}));
  // Only the last token recurs: a run of 2 finds nothing, a run of 1 does.
  const Ids once{4, 5, 6, 5};
  EXPECT_EQ(lookup_draft(once, {}, ngrams(2, 4), 4), Ids{});
  EXPECT_EQ(lookup_draft(once, {}, ngrams(1, 4), 4), (Ids{6, 5}));
  // A run may overlap its own recurrence: 4 4 at 1 and at 0, followed by one and two tokens.
  EXPECT_EQ(lookup_draft({4, 4, 4, 4}, {}, ngrams(2, 2), 1), (Ids{4}));
  EXPECT_EQ(lookup_draft({4, 4, 4, 4}, {}, ngrams(2, 2), 4), (Ids{4, 4}));
  EXPECT_EQ(lookup_draft({}, {3}, ngrams(1, 4), 4), Ids{});
}

// The gate's choices, from passes timed by hand.
TEST(DraftGate, ChecksDraftsWhileTheyGiveTokensFasterAndRetriesTheKindBehind) {
  DraftGate gate;
  // Steps first, two of them (the first a warm-up), then a drafting pass.
  EXPECT_FALSE(gate.draft(1));
  gate.record(1, false, 1, 0.5);  // warm-up: its rate is not counted
  EXPECT_FALSE(gate.draft(1));
  gate.record(1, false, 1, 0.1);  // 10 tokens a second
  EXPECT_TRUE(gate.draft(1));
  gate.record(1, true, 2, 0.4);  // 5 a second: steps are faster
  for (int64_t i = 0; i < DraftGate::kRetry; ++i) {
    EXPECT_FALSE(gate.draft(1)) << "pass " << i;
    gate.record(1, false, 1, 0.1);
  }
  // Drafts are tried again, and now give 45 a second: 5 + (45 - 5) / 4 = 15 on average.
  EXPECT_TRUE(gate.draft(1));
  gate.record(1, true, 9, 0.2);
  // That pass was the first of 16 without a step.
  for (int64_t i = 1; i < DraftGate::kRetry; ++i) {
    EXPECT_TRUE(gate.draft(1)) << "pass " << i;
    gate.record(1, true, 3, 0.2);  // 15 a second
  }
  EXPECT_FALSE(gate.draft(1)) << "steps were not tried again";
  // Another number of rows decoding learns its own rates.
  EXPECT_FALSE(gate.draft(2));
}

std::string tiny_dir() { return testing::tiny_checkpoint("draft-tiny", 5); }

Engine make_engine() { return Engine(testing::tiny_engine_options(tiny_dir(), 16)); }

// A prompt that says the same thing twice, so its continuation has runs to look up.
Ids repeating_prompt(int64_t salt) {
  Ids ids;
  for (int64_t i = 0; i < 10; ++i) ids.push_back(2 + (i * 37 + salt * 101) % 500);
  const Ids once = ids;
  ids.insert(ids.end(), once.begin(), once.end());
  ids.insert(ids.end(), once.begin(), once.begin() + 3);
  return ids;
}

// Drafts are checked whenever found (Drafting::always): these tests check the drafting itself,
// which the gate would leave out on passes it times as too slow.
DecodeOptions greedy(int64_t max_new, int64_t draft = 0) {
  DecodeOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  o.draft.tokens = draft;
  o.draft.always = true;
  return o;
}

struct Decoded {
  DecodeResult result;
  std::vector<at::Tensor> logits;
};

Decoded decode(Engine& engine, const Ids& prompt, const DecodeOptions& options) {
  Decoded d;
  d.result = engine.decode(prompt, options, {}, [&](const at::Tensor& l) {
    d.logits.push_back(l.clone());
  });
  return d;
}

void expect_same(const Decoded& plain, const Decoded& drafted) {
  EXPECT_EQ(drafted.result.tokens, plain.result.tokens);
  EXPECT_EQ(drafted.result.finish, plain.result.finish);
  ASSERT_EQ(drafted.logits.size(), plain.logits.size());
  for (size_t i = 0; i < plain.logits.size(); ++i) {
    EXPECT_LE((drafted.logits[i] - plain.logits[i]).abs().max().item<double>(), 1e-4)
        << "logits of token " << i;
  }
}

TEST(SpeculativeDecode, GreedyGivesTheTokensAndLogitsOfPlainDecoding) {
  auto engine = make_engine();
  int64_t drafted = 0, accepted = 0;
  for (int64_t salt = 0; salt < 4; ++salt) {
    const auto prompt = repeating_prompt(salt);
    // 80 tokens cross the tiny model's 8-position sliding window ten times.
    const auto plain = decode(engine, prompt, greedy(80));
    EXPECT_EQ(plain.result.drafted, 0);
    for (const int64_t k : {1, 3, 7, 16}) {
      SCOPED_TRACE("salt " + std::to_string(salt) + ", draft " + std::to_string(k));
      const auto with = decode(engine, prompt, greedy(80, k));
      expect_same(plain, with);
      EXPECT_LE(with.result.accepted, with.result.drafted);
      drafted += with.result.drafted;
      accepted += with.result.accepted;
    }
  }
  std::cout << "drafted " << drafted << ", accepted " << accepted << "\n";
  // Both halves of the check ran: drafts kept and drafts rejected (where the rings' windows
  // were put back).
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

// With the gate deciding (Drafting::always off) drafts are tried once steps are timed, whatever
// the timings, and the tokens and logits are plain decoding's, alone and in a Batch.
TEST(SpeculativeDecode, GatedDraftsGiveThePlainTokensAloneAndInABatch) {
  auto engine = make_engine();
  auto o = greedy(60, 4);
  o.draft.always = false;
  std::vector<Decoded> plain;
  int64_t drafted = 0;
  for (int64_t salt = 0; salt < 3; ++salt) {
    plain.push_back(decode(engine, repeating_prompt(salt), greedy(60)));
    const auto with = decode(engine, repeating_prompt(salt), o);
    expect_same(plain.back(), with);
    drafted += with.result.drafted;
  }
  EXPECT_GT(drafted, 0);

  Batch batch(engine, {.rows = 3});
  std::vector<std::vector<at::Tensor>> logits(plain.size());
  for (size_t salt = 0; salt < plain.size(); ++salt) {
    batch.submit(repeating_prompt(static_cast<int64_t>(salt)), o, {},
                 [&logits, salt](const at::Tensor& l) { logits[salt].push_back(l.clone()); });
  }
  std::map<int64_t, DecodeResult> results;
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  drafted = 0;
  for (size_t salt = 0; salt < plain.size(); ++salt) {
    SCOPED_TRACE("sequence " + std::to_string(salt));
    const auto& got = results.at(static_cast<int64_t>(salt));
    expect_same(plain[salt], {got, logits[salt]});
    drafted += got.drafted;
  }
  EXPECT_GT(drafted, 0);
}

// At bf16 a pass over more positions than the CPU's attention kernel takes would round otherwise
// (the composite formula's products): drafts stay within it, and until a sliding window wraps (its
// keys are then summed in another order) a pass's logits are a step's, bit for bit, but for a rare
// step on AVX-512 CPUs: there oneDNN's bf16 matmul sums a long input (the o projection's 2,048 or
// 4,096 here) in another order for one row than for several, and about one row in 80 rounds
// otherwise (Zen 4: one of 360 rows of logits moved, by 0.19; none with oneDNN held to AVX2). E2B's
// attention shapes (8 query heads a kv head, head dim 256) and some 400 positions: with drafts of
// 16 let through, the logits here differed from the 26th token.
TEST(SpeculativeDecode, AtBf16BeforeTheWindowWrapsTheLogitsAreAStepsNearlyBitForBit) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("draft-wide-" + std::to_string(::getpid()));
  auto spec = tiny_preset("tiny");
  spec.seed = 9;
  spec.window = 512;
  spec.heads = 8;
  spec.head_dim = 256;
  spec.global_head_dim = 512;
  make_tiny(dir.string(), spec);
  auto o = testing::tiny_engine_options(dir.string(), 16);
  o.dtype = at::kBFloat16;
  o.context = 512;
  Engine engine(o);
  int64_t drafted = 0, rows = 0, differ = 0;
  for (int64_t salt = 0; salt < 3; ++salt) {
    auto prompt = repeating_prompt(salt);
    for (int64_t i = 0; i < 250; ++i) prompt.push_back(2 + (i * 53 + salt) % 500);
    const auto plain = decode(engine, prompt, greedy(120));
    const auto with = decode(engine, prompt, greedy(120, 16));
    EXPECT_EQ(with.result.tokens, plain.result.tokens);
    ASSERT_EQ(with.logits.size(), plain.logits.size());
    for (size_t i = 0; i < plain.logits.size(); ++i) {
      ++rows;
      if (at::equal(with.logits[i], plain.logits[i])) continue;
      ++differ;
      EXPECT_LE((with.logits[i] - plain.logits[i]).abs().max().item<double>(), 0.25)
          << "salt " << salt << ", token " << i;
    }
    drafted += with.result.drafted;
  }
  EXPECT_LE(differ * 100, rows) << differ << " of " << rows << " rows of logits differ";
  EXPECT_GT(drafted, 0);
  fs::remove_all(dir);
}

TEST(SpeculativeDecode, SampledWithASeedGivesTheTokensOfPlainDecoding) {
  auto engine = make_engine();
  for (uint64_t seed : {1u, 7u, 42u}) {
    auto o = greedy(60);
    o.sampling.temperature = 0.7;
    o.sampling.top_k = 20;
    o.sampling.repetition_penalty = 1.05;
    o.sampling.seed = seed;
    const auto prompt = repeating_prompt(static_cast<int64_t>(seed));
    const auto plain = decode(engine, prompt, o);
    o.draft.tokens = 4;
    o.draft.ngram_min = 1;
    const auto with = decode(engine, prompt, o);
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_same(plain, with);
    EXPECT_GT(with.result.drafted, 0);
  }
}

TEST(SpeculativeDecode, AStopInsideADraftEndsWhereItEndsWithoutOne) {
  auto engine = make_engine();
  const auto prompt = repeating_prompt(2);
  const auto free = engine.decode(prompt, greedy(40, 4));
  ASSERT_GT(free.accepted, 0);
  // Each of the free run's tokens in turn as the stop id.
  for (size_t i = 0; i < free.tokens.size(); i += 5) {
    auto o = greedy(40);
    o.ignore_eos = false;
    o.stop_ids = {free.tokens[i]};
    const auto plain = engine.decode(prompt, o);
    o.draft.tokens = 4;
    const auto with = engine.decode(prompt, o);
    EXPECT_EQ(with.tokens, plain.tokens) << "stop id " << free.tokens[i];
    EXPECT_EQ(with.finish, "stop");
    EXPECT_EQ(with.stop_id, plain.stop_id);
  }
  // on_tokens cancelling mid-draft leaves the tokens it saw.
  int64_t seen = 0;
  const auto cancelled = engine.decode(prompt, greedy(40, 4), [&](const Ids& tokens) {
    seen += static_cast<int64_t>(tokens.size());
    return seen < 9;
  });
  EXPECT_EQ(cancelled.finish, "cancelled");
  EXPECT_EQ(cancelled.tokens, Ids(free.tokens.begin(), free.tokens.begin() + 9));
}

TEST(SpeculativeDecode, AThinkingBudgetSpentInsideADraftClosesTheBlockAsWithoutOne) {
  auto engine = make_engine();
  const auto prompt = repeating_prompt(1);
  const auto free = engine.decode(prompt, greedy(30)).tokens;
  // The block opens at the model's third token and closes with an id it never writes.
  int64_t close = 2;
  while (std::count(free.begin(), free.end(), close) ||
         std::count(prompt.begin(), prompt.end(), close)) {
    ++close;
  }
  const ThinkingMarkers markers{free[2], close};
  Ids message;
  for (int64_t id = 2; message.size() < 3; ++id) {
    if (id != markers.open && id != markers.close) message.push_back(id);
  }
  auto o = greedy(30);
  o.thinking_budget = ThinkingBudget{5, markers, message};
  const auto plain = engine.decode(prompt, o);
  o.draft.tokens = 6;
  const auto with = engine.decode(prompt, o);
  EXPECT_EQ(with.tokens, plain.tokens);
  EXPECT_NE(std::find(plain.tokens.begin(), plain.tokens.end(), close), plain.tokens.end());
}

TEST(SpeculativeDecode, BadDraftOptionsAreValueErrors) {
  auto engine = make_engine();
  Batch batch(engine, {.rows = 2});
  auto o = greedy(4, -1);
  // The engine's and a batch's checks are one: the same message from both.
  for (const bool batched : {false, true}) {
    auto submit = [&] { batched ? (void)batch.submit({2, 3}, o) : (void)engine.decode({2, 3}, o); };
    o.draft = {.tokens = -1};
    try {
      submit();
      FAIL() << "a negative draft was accepted";
    } catch (const ValueError& e) {
      EXPECT_STREQ(e.what(), "draft_max must be at least 0, got -1");
    }
    o.draft = {.tokens = 4, .ngram_min = 3, .ngram_max = 2};
    try {
      submit();
      FAIL() << "ngram_max below ngram_min was accepted";
    } catch (const ValueError& e) {
      EXPECT_STREQ(e.what(),
                   "draft_ngram_min must be at least 1 and draft_ngram_max at least "
                   "draft_ngram_min, got 3 and 2");
    }
    o.draft = {.tokens = 4, .ngram_min = 0, .ngram_max = 2};
    EXPECT_THROW(submit(), ValueError);
    o.draft = {.tokens = 0, .ngram_min = 0, .ngram_max = 2};
    EXPECT_THROW(submit(), ValueError);
  }
  EXPECT_TRUE(batch.idle());
  // The engine decodes on after the refusals.
  EXPECT_EQ(engine.decode({2, 3}, greedy(4, 2)).tokens, engine.decode({2, 3}, greedy(4)).tokens);
}

// Rows drafting in a Batch: each sequence gets the tokens and logits it gets decoded alone without
// drafts, while rows join and leave (so a pass's room changes with the rows decoding: 7 tokens
// for one, 3 for two, 1 for three), greedy and seeded, a stop and a cancel inside a pass, and the
// prefix cache saving rows that end inside one and giving their state to later prompts.
TEST(SpeculativeBatch, EveryRowGetsTheTokensAndLogitsOfDecodingAloneWithoutDrafts) {
  auto engine = make_engine();
  struct Job {
    Ids prompt;
    DecodeOptions options;
    std::vector<at::Tensor> logits;
    int64_t seen = 0;  // tokens on_tokens saw
  };
  std::deque<Job> jobs;  // the batch's callbacks hold references
  for (int64_t salt = 0; salt < 6; ++salt) {
    auto o = greedy(30 + 9 * salt, 7);
    if (salt % 2) {
      o.sampling.temperature = 0.7;
      o.sampling.top_k = 20;
      o.sampling.repetition_penalty = 1.05;
      o.sampling.seed = 5 + salt;
      o.draft.ngram_min = 1;
    }
    jobs.push_back({repeating_prompt(salt), o});
  }
  // Job 2 stops at the token it writes 12th decoded freely.
  const auto free = engine.decode(jobs[2].prompt, jobs[2].options).tokens;
  jobs[2].options.ignore_eos = false;
  jobs[2].options.stop_ids = {free.at(11)};
  Batch batch(engine, {.rows = 3, .cache_bytes = 64 << 20, .cache_block = 8});
  std::map<int64_t, DecodeResult> results;
  std::map<int64_t, Job*> by_id;
  auto submit = [&](Job& job) {
    by_id[batch.submit(job.prompt, job.options, [&job](const Ids& tokens) {
      job.seen += static_cast<int64_t>(tokens.size());
      return true;
    }, [&job](const at::Tensor& l) { job.logits.push_back(l.clone()); })] = &job;
  };
  // A job joins every fourth step; the last is cancelled once it has 10 tokens.
  bool cancelled = false;
  for (int64_t step = 0; !batch.idle() || step < 4 * static_cast<int64_t>(jobs.size()); ++step) {
    if (step % 4 == 0 && step / 4 < static_cast<int64_t>(jobs.size())) submit(jobs[step / 4]);
    if (!cancelled && jobs.back().seen >= 10) {
      batch.cancel(5);
      cancelled = true;
    }
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  ASSERT_EQ(results.size(), jobs.size());
  int64_t drafted = 0, accepted = 0;
  for (const auto& [id, job] : by_id) {
    SCOPED_TRACE("sequence " + std::to_string(id));
    auto o = job->options;
    o.draft.tokens = 0;
    auto alone = decode(engine, job->prompt, o);
    const auto& got = results.at(id);
    if (id == 5) {
      EXPECT_EQ(got.finish, "cancelled");
      ASSERT_GE(got.tokens.size(), 10u);
      alone.result.tokens.resize(got.tokens.size());
      alone.logits.resize(got.tokens.size());
      alone.result.finish = "cancelled";
    }
    expect_same(alone, {got, job->logits});
    if (id == 2) EXPECT_EQ(got.finish, "stop");
    drafted += got.drafted;
    accepted += got.accepted;
  }
  std::cout << "drafted " << drafted << ", accepted " << accepted << "\n";
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);

  // Later turns from the cache: each prompt, its reply and more, beside each other.
  std::vector<Ids> turns;
  for (int64_t id : {0, 1, 2}) {
    Ids next = by_id[id]->prompt;
    next.insert(next.end(), results[id].tokens.begin(), results[id].tokens.end());
    next.insert(next.end(), {7, 8, 9});
    turns.push_back(next);
  }
  for (const auto& t : turns) batch.submit(t, greedy(25, 7));
  results.clear();
  while (!batch.idle()) {
    for (const int64_t id : batch.step()) results[id] = batch.take_result(id);
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& got = results.at(static_cast<int64_t>(jobs.size() + i));
    EXPECT_GT(got.cached_tokens, 0) << "turn " << i;
    EXPECT_EQ(got.tokens, engine.decode(turns[i], greedy(25)).tokens) << "turn " << i;
  }
}

}  // namespace
}  // namespace torchtpu
