#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/errors.h"
#include "common/memory.h"

namespace torchtpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Adds the counters of `from` to those of `to`; the gauges (rows, positions, cache bytes, ...)
// are left as they are.
void add_counters(BatchStats& to, const BatchStats& from) {
  to.steps += from.steps;
  to.prompt_passes += from.prompt_passes;
  to.prompt_tokens += from.prompt_tokens;
  to.cache.hits += from.cache.hits;
  to.cache.misses += from.cache.misses;
  to.cache.reused_tokens += from.cache.reused_tokens;
  to.cache.saves += from.cache.saves;
  to.cache.evictions += from.cache.evictions;
}

DecodeResult cancelled_before_start(const Submission& submission) {
  DecodeResult result;
  result.finish = "cancelled";
  result.prompt_tokens = static_cast<int64_t>(submission.prompt.size());
  return result;
}

}  // namespace

void Scheduler::run_slot(Batch& batch, SlotEntry& action) {
  const auto start = Clock::now();
  try {
    SlotOutcome outcome;
    const SlotTask& task = action.task;
    switch (task.action) {
      case SlotAction::kSave: outcome = batch.save_slot(task.row, task.path); break;
      case SlotAction::kRestore: outcome = batch.restore_slot(task.row, task.path); break;
      case SlotAction::kErase: outcome.tokens = batch.erase_slot(task.row); break;
    }
    outcome.seconds = seconds_since(start);
    action.done.set_value(outcome);
  } catch (...) {
    action.done.set_exception(std::current_exception());
  }
}

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  if (options_.max_queue < 0) {
    throw ValueError("max_queue must be at least 0, got " + std::to_string(options_.max_queue));
  }
  if (options_.read_every < 1) {
    throw ValueError("read_every must be at least 1, got " + std::to_string(options_.read_every));
  }
  if (options_.read_every > 1 && options_.batch.rows != 1) {
    throw ValueError("read_every " + std::to_string(options_.read_every) +
                     " needs 1 sequence at a time (parallel 1), got " +
                     std::to_string(options_.batch.rows) +
                     ": a batch reads every row's token back each step");
  }
}

int64_t Scheduler::submit(Submission submission) {
  std::vector<Submission> one;
  one.push_back(std::move(submission));
  return submit(std::move(one)).front();
}

std::vector<int64_t> Scheduler::submit(std::vector<Submission> submissions) {
  const int64_t rows = options_.serial() ? 1 : options_.batch.rows;
  for (const auto& submission : submissions) check_row(submission.options.row, rows);
  std::vector<int64_t> tickets;
  {
    std::lock_guard lock(mutex_);
    const auto waiting = static_cast<int64_t>(waiting_.size());
    const auto count = static_cast<int64_t>(submissions.size());
    // The rows free now take those waiting as the owner thread will place them, a sequence that
    // asks for a row only that one; what is left over waits for a row.
    std::vector<int64_t> wanted;
    for (const auto& entry : waiting_) wanted.push_back(entry.submission.options.row);
    for (const auto& submission : submissions) wanted.push_back(submission.options.row);
    const auto placed = place_in_rows(wanted, free_rows_);
    if (std::count(placed.begin(), placed.end(), -1) > options_.max_queue) {
      std::string busy;  // a row asked for and not free: the others do not serve it
      for (int64_t k = count - 1; k >= 0; --k) {
        const int64_t row = submissions[k].options.row;
        if (row >= 0 && placed[waiting + k] < 0) busy = std::to_string(row);
      }
      const std::string queue =
          std::to_string(waiting) + " sequences wait for a row already, " +
          std::to_string(std::count(free_rows_.begin(), free_rows_.end(), true)) +
          " rows are free" + (busy.empty() ? "" : " but not row " + busy + ", which it asks for") +
          " and max_queue is " + std::to_string(options_.max_queue);
      throw QueueFull(count == 1 ? queue
                                 : "the request's " + std::to_string(count) +
                                       " sequences do not fit: " + queue);
    }
    for (auto& submission : submissions) {
      tickets.push_back(next_ticket_++);
      waiting_.push_back({tickets.back(), std::move(submission)});
    }
    keep_alive_s_.reset();
  }
  changed_.notify_all();
  return tickets;
}

void Scheduler::cancel(int64_t ticket) {
  {
    std::lock_guard lock(mutex_);
    // A waiting sequence gives up its place in the queue at once, even while the owner thread is
    // inside one long decode (read_every): it hears the cancel when it next looks.
    const auto at = std::find_if(waiting_.begin(), waiting_.end(),
                                 [&](const Entry& entry) { return entry.ticket == ticket; });
    if (at == waiting_.end()) {
      cancels_.insert(ticket);
    } else {
      dropped_.push_back(std::move(*at));
      waiting_.erase(at);
    }
  }
  changed_.notify_all();
}

SlotOutcome Scheduler::slot(const SlotTask& task) {
  if (options_.serial()) {
    throw ValueError("slots keep no state one sequence at a time (read_every " +
                     std::to_string(options_.read_every) + "): there is no prefix cache");
  }
  std::future<SlotOutcome> done;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw std::runtime_error("the engine is stopping: slot actions are over");
    actions_.push_back({task, {}});
    done = actions_.back().done.get_future();
  }
  changed_.notify_all();
  return done.get();
}

void Scheduler::run_on_owner(std::function<void(Engine&)> task) {
  std::future<void> done;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw std::runtime_error("the engine is stopping: it takes no more tasks");
    tasks_.push_back({std::move(task), {}});
    done = tasks_.back().done.get_future();
  }
  changed_.notify_all();
  done.get();
}

void Scheduler::sleep_when_idle() {
  {
    std::lock_guard lock(mutex_);
    if (stats_.asleep) return;
    sleep_asked_ = true;
  }
  changed_.notify_all();
}

void Scheduler::keep_alive(std::optional<double> seconds) {
  {
    std::lock_guard lock(mutex_);
    keep_alive_s_ = seconds;
  }
  changed_.notify_all();
}

std::optional<double> Scheduler::idle_limit() const {
  std::lock_guard lock(mutex_);
  return idle_limit_locked();
}

std::optional<double> Scheduler::idle_limit_locked() const {
  // Longer than any server runs, and short enough for a steady_clock deadline (int64 ns).
  constexpr double kForever = 1e9;
  const double limit = keep_alive_s_.value_or(options_.sleep_idle_s);
  if (limit < 0 || limit > kForever) return std::nullopt;
  return limit;
}

void Scheduler::wake_up() {
  {
    std::lock_guard lock(mutex_);
    sleep_asked_ = false;  // the later request wins
  }
  run_on_owner([this](Engine& engine) {
    if (engine.asleep()) wake_now(engine);
  });
}

void Scheduler::run_tasks(Engine& engine, std::vector<EngineTask>& tasks) {
  for (auto& t : tasks) {
    try {
      t.task(engine);
      t.done.set_value();
    } catch (...) {
      t.done.set_exception(std::current_exception());
    }
  }
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  SchedulerStats s = stats_;
  s.waiting = static_cast<int64_t>(waiting_.size());
  return s;
}

Scheduler::Taken Scheduler::take_work(bool idle, std::vector<bool> free,
                                      bool may_sleep,
                                      std::vector<Entry>& admitted, std::vector<Entry>& dropped,
                                      std::set<int64_t>& cancels,
                                      std::vector<SlotEntry>& actions,
                                      std::vector<EngineTask>& tasks) {
  std::unique_lock lock(mutex_);
  auto ready = [&] {
    return !idle || !waiting_.empty() || !cancels_.empty() || !dropped_.empty() ||
           !actions_.empty() || !tasks_.empty() || stopping_ || sleep_asked_;
  };
  const auto idle_since = Clock::now();
  while (!ready()) {
    const auto limit = idle && may_sleep ? idle_limit_locked() : std::nullopt;
    if (!limit) {
      changed_.wait(lock);
      continue;
    }
    const auto deadline = idle_since + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(*limit));
    if (Clock::now() >= deadline) return Taken::kIdleTooLong;
    changed_.wait_until(lock, deadline);
  }
  // Tasks queued before stop() still run; those after it are refused.
  tasks = std::exchange(tasks_, {});
  if (idle && waiting_.empty() && dropped_.empty() && actions_.empty() && tasks.empty() &&
      stopping_) {
    return Taken::kStopped;
  }
  if (idle && sleep_asked_ && waiting_.empty() && actions_.empty() && cancels_.empty() &&
      dropped_.empty()) {
    sleep_asked_ = false;
    return Taken::kIdleTooLong;
  }
  cancels = std::exchange(cancels_, {});
  actions = std::exchange(actions_, {});
  dropped = std::exchange(dropped_, {});
  std::vector<int64_t> wanted;
  for (const auto& entry : waiting_) wanted.push_back(entry.submission.options.row);
  free_rows_ = std::move(free);
  const auto placed = place_in_rows(wanted, free_rows_);
  std::deque<Entry> still;
  for (size_t k = 0; k < placed.size(); ++k) {
    if (placed[k] >= 0) {
      free_rows_[placed[k]] = false;
      admitted.push_back(std::move(waiting_[k]));
    } else {
      still.push_back(std::move(waiting_[k]));
    }
  }
  waiting_ = std::move(still);
  // Counted as running, its prompt as held, from here, so a scrape never misses a sequence
  // between queue and row (the next step's stats replace these figures).
  stats_.running += static_cast<int64_t>(admitted.size());
  for (const auto& entry : admitted) {
    stats_.batch.positions += static_cast<int64_t>(entry.submission.prompt.size());
  }
  return Taken::kWork;
}

void Scheduler::sleep(Engine& engine) {
  engine.sleep();
  {
    std::lock_guard lock(mutex_);
    stats_.asleep = true;
    ++stats_.sleeps;
    if (!options_.sleep_preserve_cache) {
      stats_.batch.cache.states = 0;
      stats_.batch.cache.bytes = 0;
    }
  }
}

void Scheduler::wake_now(Engine& engine) {
  const auto start = Clock::now();
  engine.wake();
  std::lock_guard lock(mutex_);
  stats_.asleep = false;
  stats_.last_wake_s = seconds_since(start);
}

bool Scheduler::wake(Engine& engine, std::vector<Entry>& admitted,
                     std::vector<SlotEntry>& actions) {
  if (!engine.asleep() || (admitted.empty() && actions.empty())) return !engine.asleep();
  try {
    wake_now(engine);
  } catch (...) {
    const auto error = std::current_exception();
    {
      std::lock_guard lock(mutex_);
      stats_.running -= static_cast<int64_t>(admitted.size());
      stats_.batch.positions = 0;
    }
    for (auto& entry : admitted) entry.submission.on_done({}, error);
    for (auto& action : actions) action.done.set_exception(error);
    admitted.clear();
    actions.clear();
    return false;
  }
  return true;
}

void Scheduler::publish(const Batch& batch) {
  stats_.batch = batch.stats();
  free_rows_ = batch.free_rows();
  add_counters(stats_.batch, ended_);
}

int64_t Scheduler::cache_budget() const {
  return options_.serial() ? 0 : options_.batch.cache_bytes;
}

void Scheduler::run(Engine& engine) {
  if (options_.serial()) {
    run_serial(engine);
  } else {
    run_batch(engine);
  }
}

void Scheduler::run_batch(Engine& engine) {
  std::optional<Batch> batch;
  engine.release_rings();  // a warm-up's: the batch's rows are all this engine decodes in
  batch.emplace(engine, options_.batch);
  {
    std::lock_guard lock(mutex_);
    publish(*batch);
  }
  std::map<int64_t, Entry> running;  // by the batch's id
  // The prefix cache while the engine sleeps (sleep_preserve_cache).
  std::optional<PrefixCache> kept;
  // A batch that goes (for a sleep, or after a failed step) leaves its counters to ended_, where
  // the next one's count on from.
  const auto end_batch = [&] {
    add_counters(ended_, batch->stats());
    batch.reset();
  };
  while (true) {
    std::vector<Entry> admitted, dropped;
    std::set<int64_t> cancels;
    std::vector<SlotEntry> actions;
    std::vector<EngineTask> tasks;
    const bool idle = !batch || batch->idle();
    auto free = batch ? batch->free_rows() : std::vector<bool>(options_.batch.rows, true);
    const Taken taken = take_work(idle, std::move(free), !engine.asleep(), admitted, dropped,
                                  cancels, actions, tasks);
    run_tasks(engine, tasks);
    if (taken == Taken::kStopped) break;
    // Asked to sleep while asleep already: nothing to do.
    if (taken == Taken::kIdleTooLong && !engine.asleep()) {
      // The batch's rings go with the weights.
      if (options_.sleep_preserve_cache) kept = batch->take_cache();
      end_batch();
      sleep(engine);
    }
    if (taken == Taken::kIdleTooLong) continue;
    for (auto& entry : dropped) {
      entry.submission.on_done(cancelled_before_start(entry.submission), nullptr);
    }
    for (const auto& [id, entry] : running) {
      if (cancels.count(entry.ticket) > 0) batch->cancel(id);
    }
    if (!wake(engine, admitted, actions)) continue;
    if (!batch) batch.emplace(engine, options_.batch, std::exchange(kept, std::nullopt));
    for (auto& action : actions) run_slot(*batch, action);
    for (auto& entry : admitted) {
      auto& s = entry.submission;
      int64_t id;
      try {
        id = batch->submit(s.prompt, s.options, s.on_tokens, s.on_logits, s.media);
      } catch (...) {
        s.on_done({}, std::current_exception());
        continue;
      }
      if (s.on_start) s.on_start();
      running.emplace(id, std::move(entry));
    }

    const auto start = Clock::now();
    std::vector<std::pair<Entry, DecodeResult>> finished;
    std::vector<Entry> failed;
    std::exception_ptr error;
    const bool stepped = !batch->idle();
    if (stepped) {
      try {
        for (const int64_t id : batch->step()) {
          auto node = running.extract(id);
          finished.emplace_back(std::move(node.mapped()), batch->take_result(id));
        }
      } catch (...) {
        // The rings may hold a half-written step: every sequence in them ends, the batch
        // starts afresh.
        error = std::current_exception();
        for (auto& [id, entry] : running) failed.push_back(std::move(entry));
        running.clear();
        end_batch();
        batch.emplace(engine, options_.batch);
      }
    }
    {
      // The gauges drop a sequence before its caller hears that it ended.
      std::lock_guard lock(mutex_);
      stats_.running = static_cast<int64_t>(running.size());
      publish(*batch);
      stats_.busy_s += seconds_since(start);
    }
    for (auto& [entry, result] : finished) entry.submission.on_done(std::move(result), nullptr);
    for (auto& entry : failed) entry.submission.on_done({}, error);
    if (stepped && batch->idle()) settle();
  }
}

void Scheduler::settle() {
  {
    std::lock_guard lock(mutex_);
    if (!waiting_.empty()) return;
  }
  release_free_heap();
}

void Scheduler::run_serial(Engine& engine) {
  {
    std::lock_guard lock(mutex_);
    stats_.batch.rows = 1;
    stats_.batch.capacity = engine.options().context;
    stats_.batch.row_stats.assign(1, RowStats{});
    free_rows_.assign(1, true);
  }
  while (true) {
    std::vector<Entry> admitted, dropped;
    std::set<int64_t> cancels;
    std::vector<SlotEntry> actions;  // none: slot() refuses them here
    std::vector<EngineTask> tasks;
    const Taken taken = take_work(/*idle=*/true, {true}, !engine.asleep(), admitted, dropped,
                                  cancels, actions, tasks);
    run_tasks(engine, tasks);
    if (taken == Taken::kStopped) break;
    if (taken == Taken::kIdleTooLong) {
      if (!engine.asleep()) sleep(engine);
      continue;
    }
    for (auto& entry : dropped) {
      entry.submission.on_done(cancelled_before_start(entry.submission), nullptr);
    }
    if (!wake(engine, admitted, actions)) continue;
    for (auto& entry : admitted) {
      auto& s = entry.submission;
      if (s.on_start) s.on_start();
      auto positions = static_cast<int64_t>(s.prompt.size());
      {
        std::lock_guard lock(mutex_);
        stats_.batch.row_stats[0] = {entry.ticket, true, positions, 0,
                                     engine.token_budget(positions, s.options.max_new),
                                     s.options.draft.tokens > 0};
        stats_.batch.reading = 1;
      }
      auto on_tokens = [&](const std::vector<int64_t>& tokens) {
        const auto count = static_cast<int64_t>(tokens.size());
        positions += count;
        std::vector<Entry> gone;
        bool cancelled;
        {
          std::lock_guard lock(mutex_);
          stats_.batch.positions = positions;
          stats_.batch.reading = 0;
          stats_.batch.decoding = 1;
          stats_.batch.steps += count;  // counted by tokens: a pass that keeps drafts counts each
          stats_.batch.row_stats[0].reading = false;
          stats_.batch.row_stats[0].generated += count;
          stats_.batch.row_stats[0].remaining -= count;
          cancelled = cancels_.erase(entry.ticket) > 0;
          gone = std::exchange(dropped_, {});
        }
        // Those that left the queue hear it now rather than when this sequence ends.
        for (auto& e : gone) e.submission.on_done(cancelled_before_start(e.submission), nullptr);
        return !cancelled && (!s.on_tokens || s.on_tokens(tokens));
      };
      const auto start = Clock::now();
      DecodeResult result;
      std::exception_ptr error;
      try {
        result = engine.decode(s.prompt, s.media, s.options, on_tokens, s.on_logits);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        stats_.running = 0;
        stats_.batch.positions = 0;
        stats_.batch.reading = 0;
        stats_.batch.decoding = 0;
        stats_.batch.row_stats[0] = RowStats{};
        free_rows_.assign(1, true);
        stats_.busy_s += seconds_since(start);
      }
      s.on_done(std::move(result), error);
    }
    if (!admitted.empty()) settle();
  }
}

}  // namespace torchtpu
