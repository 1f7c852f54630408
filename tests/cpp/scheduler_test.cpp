// The engine's scheduler (issue #17): sequences submitted from several threads are decoded
// together and each gets the result Engine::decode gives it alone; beyond max_queue waiting,
// submissions are refused; cancels end waiting and running sequences; a bad submission or a
// failed step ends only what it must, and the scheduler goes on.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "engine/engine.h"
#include "tiny_checkpoint.h"

namespace torchtpu {
namespace {

Engine make_engine() {
  return Engine(testing::tiny_engine_options(testing::tiny_checkpoint("scheduler-tiny", 5), 16));
}

std::vector<int64_t> prompt_of(int64_t n, int64_t salt) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(2 + (i * 37 + salt * 101) % 500);
  return ids;
}

DecodeOptions options_of(int64_t max_new, bool sampled, uint64_t seed) {
  DecodeOptions o;
  o.max_new = max_new;
  o.ignore_eos = true;
  if (sampled) {
    o.sampling.temperature = 0.9;
    o.sampling.top_p = 0.9;
    o.sampling.seed = seed;
  }
  return o;
}

// What a submission saw through its callbacks.
struct Seen {
  bool started = false;
  bool tokens_before_start = false;
  std::vector<int64_t> streamed;
  DecodeResult result;
  std::exception_ptr error;
};

// A submission recording into `seen`, which `done` is set for when it ends.
Submission recording(std::vector<int64_t> prompt, DecodeOptions options, Seen& seen,
                     std::promise<void>& done) {
  Submission s;
  s.prompt = std::move(prompt);
  s.options = std::move(options);
  s.on_start = [&seen] { seen.started = true; };
  s.on_tokens = [&seen](const std::vector<int64_t>& tokens) {
    if (!seen.started) seen.tokens_before_start = true;
    seen.streamed.insert(seen.streamed.end(), tokens.begin(), tokens.end());
    return true;
  };
  s.on_done = [&seen, &done](DecodeResult result, std::exception_ptr error) {
    seen.result = std::move(result);
    seen.error = error;
    done.set_value();
  };
  return s;
}

// Runs the scheduler on its own thread (the engine's owner) for the life of the object.
class Running {
 public:
  Running(Scheduler& scheduler, Engine& engine)
      : scheduler_(scheduler), thread_([&] { scheduler.run(engine); }) {}
  ~Running() {
    scheduler_.stop();
    thread_.join();
  }

 private:
  Scheduler& scheduler_;
  std::thread thread_;
};

// A conversation's two turns decoded alone: the first's output, and the second's prompt (the
// first turn, its output and one more token) and output.
struct TwoTurns {
  std::vector<int64_t> before, next_turn, after;
};
TwoTurns two_turns(Engine& engine, const std::vector<int64_t>& prompt,
                   const DecodeOptions& options) {
  TwoTurns turns;
  turns.before = engine.decode(prompt, options).tokens;
  turns.next_turn = prompt;
  turns.next_turn.insert(turns.next_turn.end(), turns.before.begin(), turns.before.end());
  turns.next_turn.push_back(7);
  turns.after = engine.decode(turns.next_turn, options).tokens;
  return turns;
}

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

TEST(Scheduler, SequencesFromManyThreadsGetWhatEachGetsAlone) {
  auto engine = make_engine();
  struct Case {
    std::vector<int64_t> prompt;
    DecodeOptions options;
  };
  std::vector<Case> cases;
  for (int64_t i = 0; i < 10; ++i) {
    cases.push_back({prompt_of(1 + i * 7, i), options_of(3 + i * 5 % 17, i % 2 == 1, 40 + i)});
  }
  std::vector<DecodeResult> alone;
  for (const auto& c : cases) alone.push_back(engine.decode(c.prompt, c.options));

  SchedulerOptions o;
  o.batch.rows = 3;
  o.max_queue = 16;
  Scheduler scheduler(o);
  std::vector<Seen> seen(cases.size());
  std::vector<std::promise<void>> done(cases.size());
  {
    Running running(scheduler, engine);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < cases.size(); ++i) {
      clients.emplace_back([&, i] {
        scheduler.submit(recording(cases[i].prompt, cases[i].options, seen[i], done[i]));
      });
    }
    for (auto& c : clients) c.join();
    for (auto& d : done) d.get_future().wait();
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    EXPECT_FALSE(seen[i].error);
    EXPECT_TRUE(seen[i].started);
    EXPECT_FALSE(seen[i].tokens_before_start);
    EXPECT_EQ(seen[i].result.tokens, alone[i].tokens);
    EXPECT_EQ(seen[i].streamed, alone[i].tokens);
    EXPECT_EQ(seen[i].result.finish, "length");
  }
  const auto stats = scheduler.stats();
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.batch.rows, 3);
  EXPECT_EQ(stats.batch.capacity, 3 * 256);
  EXPECT_GT(stats.busy_s, 0);
}

TEST(Scheduler, RefusesBeyondMaxQueueAndCancelsWhatWaits) {
  auto engine = make_engine();
  SchedulerOptions o;
  o.batch.rows = 1;
  o.max_queue = 2;
  Scheduler scheduler(o);
  std::vector<Seen> seen(2);
  std::vector<std::promise<void>> done(2);
  // Nothing runs yet, so both wait.
  const auto first = scheduler.submit(recording(prompt_of(5, 1), options_of(4, false, 0), seen[0],
                                                done[0]));
  const auto second = scheduler.submit(recording(prompt_of(5, 2), options_of(4, false, 0), seen[1],
                                                 done[1]));
  EXPECT_NE(first, second);
  EXPECT_EQ(scheduler.stats().waiting, 2);
  Seen refused;
  std::promise<void> never;
  try {
    scheduler.submit(recording(prompt_of(5, 3), options_of(4, false, 0), refused, never));
    FAIL() << "a third submission was queued";
  } catch (const QueueFull& e) {
    EXPECT_STREQ(e.what(), "2 sequences wait for a row already, 0 rows are free and max_queue is 2");
  }
  scheduler.cancel(first);
  {
    Running running(scheduler, engine);
    for (auto& d : done) d.get_future().wait();
  }
  EXPECT_FALSE(seen[0].started);
  EXPECT_EQ(seen[0].result.finish, "cancelled");
  EXPECT_TRUE(seen[0].result.tokens.empty());
  EXPECT_EQ(seen[0].result.prompt_tokens, 5);
  EXPECT_EQ(seen[1].result.finish, "length");
  EXPECT_EQ(seen[1].result.tokens.size(), 4u);
  EXPECT_FALSE(refused.started);
  EXPECT_TRUE(refused.streamed.empty());
}

TEST(Scheduler, TakesARequestsSequencesAllOrNone) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{.batch = {.rows = 2}, .max_queue = 1});
  std::vector<std::vector<int64_t>> alone;
  for (uint64_t i = 0; i < 3; ++i) {
    alone.push_back(engine.decode(prompt_of(4, 7), options_of(5, true, 60 + i)).tokens);
  }
  std::vector<Seen> seen(3);
  std::vector<std::promise<void>> done(3);
  auto group = [&](size_t count) {
    std::vector<Submission> submissions;
    for (size_t i = 0; i < count; ++i) {
      submissions.push_back(
          recording(prompt_of(4, 7), options_of(5, true, 60 + i), seen[i], done[i]));
    }
    return submissions;
  };
  // Before run() no row is free, so two sequences would leave two waiting: neither is queued.
  try {
    scheduler.submit(group(2));
    FAIL() << "two sequences were queued beside a queue of one";
  } catch (const QueueFull& e) {
    EXPECT_STREQ(e.what(),
                 "the request's 2 sequences do not fit: 0 sequences wait for a row already, 0 "
                 "rows are free and max_queue is 1");
  }
  EXPECT_EQ(scheduler.stats().waiting, 0);
  Running running(scheduler, engine);
  while (scheduler.stats().batch.rows == 0) std::this_thread::yield();
  // Running, with both rows free: three fit, two in the rows and one waiting.
  const auto tickets = scheduler.submit(group(3));
  ASSERT_EQ(tickets.size(), 3u);
  EXPECT_LT(tickets[0], tickets[1]);
  EXPECT_LT(tickets[1], tickets[2]);
  for (size_t i = 0; i < 3; ++i) {
    done[i].get_future().wait();
    ASSERT_FALSE(seen[i].error) << message_of(seen[i].error);
    EXPECT_EQ(seen[i].result.tokens, alone[i]);
  }
}

TEST(Scheduler, CancelEndsARunningSequence) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{});
  Seen seen;
  std::promise<void> done;
  std::promise<void> first_tokens;
  auto submission = recording(prompt_of(6, 4), options_of(200, false, 0), seen, done);
  int64_t ticket = -1;
  submission.on_tokens = [&, record = submission.on_tokens](const std::vector<int64_t>& tokens) {
    if (seen.streamed.empty()) first_tokens.set_value();
    return record(tokens);
  };
  {
    Running running(scheduler, engine);
    ticket = scheduler.submit(std::move(submission));
    first_tokens.get_future().wait();
    scheduler.cancel(ticket);
    done.get_future().wait();
    // A ticket that has ended is nothing to cancel.
    scheduler.cancel(ticket);
  }
  EXPECT_EQ(seen.result.finish, "cancelled");
  EXPECT_GE(seen.result.tokens.size(), 1u);
  EXPECT_LT(seen.result.tokens.size(), 200u);
  EXPECT_EQ(seen.result.tokens, seen.streamed);
}

TEST(Scheduler, ABadSubmissionOrAFailedStepEndsOnlyWhatItMust) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{});
  Running running(scheduler, engine);

  Seen bad;
  std::promise<void> bad_done;
  scheduler.submit(recording({2, 999999}, options_of(4, false, 0), bad, bad_done));
  bad_done.get_future().wait();
  ASSERT_TRUE(bad.error);
  EXPECT_THROW(std::rethrow_exception(bad.error), ValueError);
  EXPECT_NE(message_of(bad.error).find("999999"), std::string::npos);
  EXPECT_FALSE(bad.started);

  // A callback that throws fails its step: every sequence in the batch ends with that error.
  Seen thrower, beside;
  std::promise<void> thrower_done, beside_done, beside_started;
  auto failing = recording(prompt_of(4, 5), options_of(50, false, 0), thrower, thrower_done);
  int calls = 0;
  failing.on_tokens = [&](const std::vector<int64_t>&) -> bool {
    if (++calls == 5) throw std::runtime_error("the callback failed");
    return true;
  };
  auto other = recording(prompt_of(4, 6), options_of(200, false, 0), beside, beside_done);
  other.on_start = [&] {
    beside.started = true;
    beside_started.set_value();
  };
  scheduler.submit(std::move(other));
  beside_started.get_future().wait();
  scheduler.submit(std::move(failing));
  thrower_done.get_future().wait();
  beside_done.get_future().wait();
  EXPECT_EQ(message_of(thrower.error), "the callback failed");
  EXPECT_EQ(message_of(beside.error), "the callback failed");

  // The batch started afresh: the next sequence decodes as it does alone.
  Seen after;
  std::promise<void> after_done;
  scheduler.submit(recording(prompt_of(9, 7), options_of(6, false, 0), after, after_done));
  after_done.get_future().wait();
  EXPECT_FALSE(after.error);
  EXPECT_EQ(after.result.tokens, engine.decode(prompt_of(9, 7), options_of(6, false, 0)).tokens);
}

TEST(Scheduler, ReadEveryAboveOneRunsOneSequenceAtATime) {
  auto engine = make_engine();
  SchedulerOptions o;
  o.batch.rows = 1;
  o.read_every = 4;
  Scheduler scheduler(o);
  std::vector<Seen> seen(3);
  std::vector<std::promise<void>> done(3);
  std::vector<DecodeOptions> options;
  for (int i = 0; i < 3; ++i) {
    auto d = options_of(9, i == 1, 7);
    d.read_every = 4;
    options.push_back(d);
  }
  // The one row as each read leaves it (the server's /slots), and the batch's gauges and step
  // count (/v1/engine, /metrics).
  std::vector<std::vector<RowStats>> rows(3);
  std::vector<std::vector<std::array<int64_t, 3>>> gauges(3);  // reading, decoding, steps
  std::vector<int64_t> tickets;
  {
    Running running(scheduler, engine);
    for (int i = 0; i < 3; ++i) {
      auto submission = recording(prompt_of(3 + i, i), options[i], seen[i], done[i]);
      submission.on_tokens = [&, i, record = submission.on_tokens](const auto& tokens) {
        const auto stats = scheduler.stats();
        rows[i].push_back(stats.batch.row_stats.at(0));
        gauges[i].push_back({stats.batch.reading, stats.batch.decoding, stats.batch.steps});
        return record(tokens);
      };
      tickets.push_back(scheduler.submit(std::move(submission)));
    }
    for (auto& d : done) d.get_future().wait();
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].result.tokens, engine.decode(prompt_of(3 + i, i), options[i]).tokens);
    // Reads of the first token at once, then of 4 tokens each.
    std::vector<int64_t> generated;
    for (const auto& row : rows[i]) {
      generated.push_back(row.generated);
      EXPECT_EQ(row.sequence, tickets[i]);
      EXPECT_FALSE(row.reading);
      EXPECT_EQ(row.prompt_tokens, 3 + i);
      EXPECT_EQ(row.generated + row.remaining, 9);
    }
    EXPECT_EQ(generated, (std::vector<int64_t>{1, 5, 9}));
    using Gauges = std::array<int64_t, 3>;
    EXPECT_EQ(gauges[i],
              (std::vector<Gauges>{{0, 1, 9 * i + 1}, {0, 1, 9 * i + 5}, {0, 1, 9 * i + 9}}));
  }
  EXPECT_EQ(scheduler.stats().batch.decoding, 0);
  EXPECT_EQ(scheduler.stats().batch.reading, 0);
  EXPECT_EQ(scheduler.stats().batch.capacity, 256);
  EXPECT_EQ(scheduler.stats().batch.row_stats.at(0).sequence, -1);

  o.batch.rows = 2;
  try {
    Scheduler refused(o);
    FAIL() << "read_every 4 with 2 rows was accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "read_every 4 needs 1 sequence at a time (parallel 1), got 2: a batch reads "
                 "every row's token back each step");
  }
}

// --sleep-idle-seconds: the engine frees its weights (and a batch its rings and prefix cache)
// once idle that long; its configuration and checks still answer, and the next submission loads
// them again and gets the tokens it would have got awake, batched or one at a time. With
// sleep_preserve_cache the prefix cache outlives the sleep: the conversation's next turn starts
// from its history.
TEST(Scheduler, AnIdleEngineSleepsAndTheNextSubmissionWakesIt) {
  auto engine = make_engine();
  auto options = options_of(6, false, 0);
  const auto prompt = prompt_of(5, 3);
  const auto [before, next_turn, after] = two_turns(engine, prompt, options);
  engine.sleep();
  EXPECT_TRUE(engine.asleep());
  EXPECT_THROW(engine.decode(prompt, options), std::logic_error);
  EXPECT_NO_THROW(engine.check_prompt(prompt));
  EXPECT_THROW(engine.check_prompt({2, engine.config().vocab_size}), ValueError);
  engine.wake();
  EXPECT_EQ(engine.decode(prompt, options).tokens, before);

  const std::pair<int64_t, bool> cases[] = {{1, true}, {1, false}, {4, false}};
  for (const auto& [read_every, preserve] : cases) {
    SchedulerOptions o;
    o.batch.rows = read_every > 1 ? 1 : 2;
    o.batch.cache_bytes = read_every > 1 ? 0 : 8 << 20;
    o.read_every = read_every;
    o.sleep_idle_s = 0.2;
    o.sleep_preserve_cache = preserve;
    Scheduler scheduler(o);
    options.read_every = read_every;
    std::vector<Seen> seen(2);
    std::vector<std::promise<void>> done(2);
    Running running(scheduler, engine);
    scheduler.submit(recording(prompt, options, seen[0], done[0]));
    done[0].get_future().wait();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!scheduler.stats().asleep && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto asleep = scheduler.stats();
    ASSERT_TRUE(asleep.asleep) << "read_every " << read_every;
    EXPECT_TRUE(engine.asleep());
    EXPECT_EQ(asleep.sleeps, 1);
    const bool cached = preserve;
    EXPECT_EQ(asleep.batch.cache.bytes > 0, cached) << asleep.batch.cache.bytes;
    EXPECT_EQ(engine.config().vocab_size, make_engine().config().vocab_size);

    scheduler.submit(recording(next_turn, options, seen[1], done[1]));
    done[1].get_future().wait();
    const auto awake = scheduler.stats();
    EXPECT_FALSE(awake.asleep);
    EXPECT_GT(awake.last_wake_s, 0);
    for (const auto& s : seen) EXPECT_EQ(s.error, nullptr);
    EXPECT_EQ(seen[0].result.tokens, before) << "read_every " << read_every;
    EXPECT_EQ(seen[1].result.tokens, after) << "read_every " << read_every;
    // The first turn's rings held its prompt and every output token but the last (never fed).
    const auto history = static_cast<int64_t>(prompt.size() + before.size()) - 1;
    EXPECT_EQ(seen[1].result.cached_tokens, cached ? history : 0) << "read_every " << read_every;
    EXPECT_EQ(awake.batch.cache.hits, cached ? 1 : 0) << "read_every " << read_every;
    if (read_every == 1) {
      // Counters count from the scheduler's start, over the batch the sleep ended: the first
      // turn's miss, steps and prompt tokens stay counted.
      EXPECT_EQ(awake.batch.cache.misses, cached ? 1 : 2);
      EXPECT_GT(awake.batch.steps, asleep.batch.steps);
      EXPECT_GT(asleep.batch.prompt_tokens, 0);
      EXPECT_EQ(awake.batch.prompt_tokens,
                asleep.batch.prompt_tokens + seen[1].result.prompt_tokens -
                    seen[1].result.cached_tokens);
    }
  }
}

// Sleep and wake on request (Ollama's unload and load): a sleep asked while a sequence runs comes
// once it has ended, whole; wake_up returns with the weights loaded; asking again changes nothing.
TEST(Scheduler, SleepWhenIdleWaitsForWhatRunsAndWakeUpLoadsTheWeights) {
  auto engine = make_engine();
  auto options = options_of(24, false, 0);
  const auto prompt = prompt_of(5, 4);
  for (const int64_t read_every : {1, 4}) {
    options.read_every = read_every;
    const auto alone = engine.decode(prompt, options).tokens;
    SchedulerOptions o;
    o.batch.rows = read_every > 1 ? 1 : 2;
    o.batch.cache_bytes = 0;
    o.read_every = read_every;
    Scheduler scheduler(o);  // sleep_idle_s -1: never of itself
    Running running(scheduler, engine);
    Seen seen;
    std::promise<void> done;
    std::promise<void> first_tokens;
    Submission s = recording(prompt, options, seen, done);
    s.on_tokens = [&, tokens = s.on_tokens](const std::vector<int64_t>& t) {
      if (seen.streamed.empty()) first_tokens.set_value();
      return tokens(t);
    };
    scheduler.submit(std::move(s));
    first_tokens.get_future().wait();
    scheduler.sleep_when_idle();
    done.get_future().wait();
    EXPECT_EQ(seen.error, nullptr);
    EXPECT_EQ(seen.result.tokens, alone) << "read_every " << read_every;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!scheduler.stats().asleep && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(scheduler.stats().asleep) << "read_every " << read_every;
    EXPECT_TRUE(engine.asleep());
    scheduler.sleep_when_idle();
    scheduler.wake_up();
    EXPECT_FALSE(engine.asleep());
    const auto awake = scheduler.stats();
    EXPECT_FALSE(awake.asleep);
    EXPECT_EQ(awake.sleeps, 1) << "asked while asleep, it slept no second time";
    EXPECT_GT(awake.last_wake_s, 0);
    scheduler.wake_up();
    EXPECT_EQ(scheduler.stats().last_wake_s, awake.last_wake_s) << "woken while awake";
    Seen again;
    std::promise<void> again_done;
    scheduler.submit(recording(prompt, options, again, again_done));
    again_done.get_future().wait();
    EXPECT_EQ(again.result.tokens, alone) << "read_every " << read_every;
  }
}

// Ollama's keep_alive: a limit set after a submission holds while the engine idles after it,
// counted from when it went idle (0: at once); the next submission restores sleep_idle_s; below 0
// keeps the engine awake whatever sleep_idle_s says.
TEST(Scheduler, KeepAliveSetsTheIdleLimitUntilTheNextSubmission) {
  auto engine = make_engine();
  const auto options = options_of(4, false, 0);
  const auto prompt = prompt_of(5, 5);
  auto wait_asleep = [](const Scheduler& scheduler, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    while (!scheduler.stats().asleep && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return scheduler.stats().asleep;
  };
  auto decode = [&](Scheduler& scheduler) {
    Seen seen;
    std::promise<void> done;
    scheduler.submit(recording(prompt, options, seen, done));
    done.get_future().wait();
    EXPECT_EQ(seen.error, nullptr);
  };
  for (const int64_t read_every : {1, 4}) {
    SchedulerOptions o;
    o.batch.rows = read_every > 1 ? 1 : 2;
    o.batch.cache_bytes = 0;
    o.read_every = read_every;
    Scheduler scheduler(o);  // sleep_idle_s -1: never of itself
    EXPECT_EQ(scheduler.idle_limit(), std::nullopt);
    Running running(scheduler, engine);
    decode(scheduler);
    scheduler.keep_alive(0.3);
    EXPECT_EQ(scheduler.idle_limit(), 0.3);
    ASSERT_TRUE(wait_asleep(scheduler, 20)) << "read_every " << read_every;
    EXPECT_EQ(scheduler.stats().sleeps, 1);

    decode(scheduler);  // wakes the engine, and sleep_idle_s (never) holds again
    EXPECT_EQ(scheduler.idle_limit(), std::nullopt);
    EXPECT_FALSE(wait_asleep(scheduler, 0.6)) << "read_every " << read_every;
    scheduler.keep_alive(0);
    ASSERT_TRUE(wait_asleep(scheduler, 20)) << "read_every " << read_every;
    EXPECT_EQ(scheduler.stats().sleeps, 2);
  }

  SchedulerOptions o;
  o.batch.rows = 2;
  o.batch.cache_bytes = 0;
  o.sleep_idle_s = 0.2;
  Scheduler scheduler(o);
  Running running(scheduler, engine);
  decode(scheduler);
  scheduler.keep_alive(-1);
  EXPECT_EQ(scheduler.idle_limit(), std::nullopt);
  EXPECT_FALSE(wait_asleep(scheduler, 0.8));
  decode(scheduler);
  EXPECT_EQ(scheduler.idle_limit(), 0.2);
  EXPECT_TRUE(wait_asleep(scheduler, 20));
}

// Slot actions (llama-server's save, restore, erase) from another thread run on the owner thread
// between steps; one waking a sleeping engine, as a submission does. A state saved before the
// sleep, whose cache went with the weights, comes back from its file for the next turn.
TEST(Scheduler, SlotActionsRunOnTheOwnerThreadAndWakeASleepingEngine) {
  auto engine = make_engine();
  const auto options = options_of(6, false, 0);
  const auto prompt = prompt_of(9, 4);
  const auto [before, next_turn, after] = two_turns(engine, prompt, options);
  const auto file = std::filesystem::temp_directory_path() /
                    ("scheduler-slot-" + std::to_string(::getpid()));

  SchedulerOptions o;
  o.batch.rows = 2;
  o.batch.cache_bytes = 8 << 20;
  o.sleep_idle_s = 2;  // time enough for the save before the cache goes with the weights
  Scheduler scheduler(o);
  std::vector<Seen> seen(2);
  std::vector<std::promise<void>> done(2);
  {
    Running running(scheduler, engine);
    scheduler.submit(recording(prompt, options, seen[0], done[0]));
    done[0].get_future().wait();
    const auto history = static_cast<int64_t>(prompt.size() + before.size()) - 1;
    EXPECT_EQ(scheduler.slot({SlotAction::kSave, 0, file.string()}).tokens, history);
    EXPECT_THROW(scheduler.slot({SlotAction::kSave, 1, file.string() + ".no"}), ValueError);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!scheduler.stats().asleep && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(scheduler.stats().asleep);
    const SlotOutcome restored = scheduler.slot({SlotAction::kRestore, 1, file.string()});
    EXPECT_EQ(restored.tokens, history);
    EXPECT_EQ(restored.bytes, static_cast<int64_t>(std::filesystem::file_size(file)));
    EXPECT_FALSE(scheduler.stats().asleep);
    scheduler.submit(recording(next_turn, options, seen[1], done[1]));
    done[1].get_future().wait();
    EXPECT_EQ(seen[1].error, nullptr);
    EXPECT_EQ(seen[1].result.tokens, after);
    EXPECT_EQ(seen[1].result.cached_tokens, history);
  }
  EXPECT_THROW(scheduler.slot({SlotAction::kErase, 0, ""}), std::runtime_error) << "stopped";
  Scheduler serial(SchedulerOptions{.batch = {.rows = 1}, .read_every = 4});
  EXPECT_THROW(serial.slot({SlotAction::kErase, 0, ""}), ValueError);
  std::filesystem::remove(file);
}

// Engine tasks (loading and unloading LoRA adapters) run on the owner thread, between steps,
// with sequences running around them, one at a time or in a batch; their exceptions reach the
// caller; after stop() they are refused.
TEST(Scheduler, EngineTasksRunOnTheOwnerThreadBetweenSteps) {
  auto engine = make_engine();
  const auto options = options_of(24, false, 0);
  const auto prompt = prompt_of(7, 9);
  const auto alone = engine.decode(prompt, options).tokens;
  for (const auto& o : {SchedulerOptions{.batch = {.rows = 2}},
                        SchedulerOptions{.batch = {.rows = 1}, .read_every = 4}}) {
    Scheduler scheduler(o);
    Seen seen;
    std::promise<void> done;
    std::thread::id owner;
    Engine* given = nullptr;
    {
      Running running(scheduler, engine);
      scheduler.submit(recording(prompt, options, seen, done));
      scheduler.run_on_owner([&](Engine& e) {
        owner = std::this_thread::get_id();
        given = &e;
      });
      EXPECT_NE(owner, std::this_thread::get_id());
      EXPECT_EQ(given, &engine);
      EXPECT_THROW(scheduler.run_on_owner([](Engine&) { throw ValueError("refused"); }),
                   ValueError);
      done.get_future().wait();
      EXPECT_EQ(seen.error, nullptr);
      EXPECT_EQ(seen.result.tokens, alone);
    }
    EXPECT_THROW(scheduler.run_on_owner([](Engine&) {}), std::runtime_error) << "stopped";
  }
}

// A sequence asking for a row (llama-server's id_slot) waits for it in the queue while later
// ones take the free rows.
TEST(Scheduler, ASequenceAskingForABusyRowHoldsBackNoOne) {
  auto engine = make_engine();
  SchedulerOptions o;
  o.batch.rows = 2;
  Scheduler scheduler(o);
  std::vector<Seen> seen(3);
  std::vector<std::promise<void>> done(3);
  std::mutex order_mutex;
  std::vector<int> order;  // which sequences ended, in order
  const std::pair<int64_t, int64_t> asks[] = {{200, -1}, {2, 0}, {2, -1}};  // max_new, row
  std::vector<Submission> submissions;
  for (int i = 0; i < 3; ++i) {
    auto options = options_of(asks[i].first, false, 0);
    options.row = asks[i].second;
    submissions.push_back(recording(prompt_of(6, 20 + i), options, seen[i], done[i]));
    auto on_done = submissions.back().on_done;
    submissions.back().on_done = [&, i, on_done](DecodeResult r, std::exception_ptr e) {
      {
        std::lock_guard lock(order_mutex);
        order.push_back(i);
      }
      on_done(std::move(r), e);
    };
  }
  // The first has row 0 when the others come: the second waits for it, the third takes row 1.
  std::promise<void> first_started;
  auto on_start = submissions[0].on_start;
  submissions[0].on_start = [&, on_start] {
    on_start();
    first_started.set_value();
  };
  {
    Running running(scheduler, engine);
    scheduler.submit(std::move(submissions[0]));
    first_started.get_future().wait();
    scheduler.submit(std::move(submissions[1]));
    scheduler.submit(std::move(submissions[2]));
    for (auto& d : done) d.get_future().wait();
  }
  EXPECT_EQ(order, (std::vector<int>{2, 0, 1}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[i].error, nullptr);
    EXPECT_EQ(seen[i].result.tokens.size(), static_cast<size_t>(asks[i].first));
  }
  auto options = options_of(2, false, 0);
  options.row = 2;
  Seen never;
  std::promise<void> unused;
  EXPECT_THROW(scheduler.submit(recording(prompt_of(3, 1), options, never, unused)), ValueError);
}

// With max_queue 0 a sequence asking for a busy row is refused, since no other row serves it,
// and the rows that are free still take the others.
TEST(Scheduler, ASequenceAskingForABusyRowTakesAPlaceInTheQueue) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{.batch = {.rows = 2}, .max_queue = 0});
  std::vector<Seen> seen(2);
  std::vector<std::promise<void>> done(2);
  auto first = recording(prompt_of(6, 30), options_of(200, false, 0), seen[0], done[0]);
  std::promise<void> first_started;
  first.on_start = [&] {
    seen[0].started = true;
    first_started.set_value();
  };
  Running running(scheduler, engine);
  // Until the owner thread has made the batch no row is free, and max_queue 0 refuses all.
  while (scheduler.stats().batch.rows == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t ticket = scheduler.submit(std::move(first));
  first_started.get_future().wait();
  auto pinned = options_of(2, false, 0);
  pinned.row = 0;
  Seen refused;
  std::promise<void> never;
  try {
    scheduler.submit(recording(prompt_of(3, 31), pinned, refused, never));
    FAIL() << "a sequence asking for the busy row 0 was queued with max_queue 0";
  } catch (const QueueFull& e) {
    EXPECT_STREQ(e.what(),
                 "0 sequences wait for a row already, 1 rows are free but not row 0, which it "
                 "asks for and max_queue is 0");
  }
  scheduler.submit(recording(prompt_of(3, 32), options_of(2, false, 0), seen[1], done[1]));
  done[1].get_future().wait();
  EXPECT_EQ(seen[1].result.tokens.size(), 2u);
  scheduler.cancel(ticket);
  done[0].get_future().wait();
  EXPECT_FALSE(refused.started);
}

// One sequence at a time, a decode runs to its end before the owner thread takes more work;
// sequences cancelled while they wait still leave the queue at once, and hear that they ended
// at the running sequence's next read, not at its end.
TEST(Scheduler, ReadEveryAboveOneFreesTheQueuePlacesOfCancelledSequencesAtOnce) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{.batch = {.rows = 1}, .max_queue = 2, .read_every = 4});
  std::vector<Seen> seen(4);
  std::vector<std::promise<void>> done(4);
  std::mutex order_mutex;
  std::vector<int> order;  // which sequences ended, in order
  auto submission = [&](int i, int64_t max_new) {
    auto options = options_of(max_new, false, 0);
    options.read_every = 4;
    auto s = recording(prompt_of(4, 40 + i), options, seen[i], done[i]);
    s.on_done = [&, i, on_done = s.on_done](DecodeResult r, std::exception_ptr e) {
      {
        std::lock_guard lock(order_mutex);
        order.push_back(i);
      }
      on_done(std::move(r), e);
    };
    return s;
  };
  // The first holds its first read until the others have come and gone.
  std::promise<void> reading, release;
  auto first = submission(0, 40);
  first.on_tokens = [&, record = first.on_tokens, once = true](const auto& tokens) mutable {
    if (std::exchange(once, false)) {
      reading.set_value();
      release.get_future().wait();
    }
    return record(tokens);
  };
  Running running(scheduler, engine);
  scheduler.submit(std::move(first));
  reading.get_future().wait();
  const int64_t a = scheduler.submit(submission(1, 2));
  const int64_t b = scheduler.submit(submission(2, 2));
  scheduler.cancel(a);
  scheduler.cancel(b);
  EXPECT_EQ(scheduler.stats().waiting, 0);
  scheduler.submit(submission(3, 2));
  release.set_value();
  for (auto& d : done) d.get_future().wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 0, 3}));
  EXPECT_EQ(seen[1].result.finish, "cancelled");
  EXPECT_FALSE(seen[2].started);
  EXPECT_EQ(seen[0].result.tokens.size(), 40u);
  EXPECT_EQ(seen[3].result.tokens.size(), 2u);
}

TEST(Scheduler, StopReturnsOnceNothingIsLeft) {
  auto engine = make_engine();
  Scheduler scheduler(SchedulerOptions{});
  Seen seen;
  std::promise<void> done;
  scheduler.submit(recording(prompt_of(4, 8), options_of(5, false, 0), seen, done));
  // Asked to stop before it ran, it still serves what was submitted, then returns.
  scheduler.stop();
  scheduler.run(engine);
  EXPECT_EQ(seen.result.tokens.size(), 5u);
  EXPECT_THROW(Scheduler(SchedulerOptions{.max_queue = -1}), ValueError);
}

}  // namespace
}  // namespace torchtpu
