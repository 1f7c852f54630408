// The engine's job queue (DESIGN principle 4): any thread submits sequences and cancels them; the
// engine's owner thread runs them, several at once in a Batch, admitting waiting sequences as rows
// free up. At most `max_queue` sequences wait for a row; more are refused with QueueFull, which a
// server answers with 429. Nothing here knows about HTTP or Python.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/engine.h"

namespace torchtpu {

struct SchedulerOptions {
  // The batch's rows, step budget and prefix cache (batch.h). Ignored when serial().
  BatchOptions batch;
  int64_t max_queue = 16;  // sequences that may wait for a row; more are refused
  // Steps between host reads. Above 1 the scheduler runs one sequence at a time through
  // Engine::decode, which reads back once per read_every steps (a device that pays for every host
  // read); a batch reads every row's token back each step, to see stops and free rows.
  int64_t read_every = 1;
  // With nothing waiting or running for this many seconds the engine sleeps (Engine::sleep: its
  // weights and rings freed, the batch's too) until a submission wakes it, which then waits for
  // the load; below 0: never (llama.cpp's --sleep-idle-seconds).
  double sleep_idle_s = -1;
  // The batch's prefix cache outlives a sleep (at most batch.cache_bytes stay held), for the
  // batch made at the wake: a conversation taken up again reads only its new turn. Else it is
  // freed with the rest.
  bool sleep_preserve_cache = false;
  // One sequence at a time through Engine::decode, no batch.
  bool serial() const { return read_every > 1; }
};

// One sequence for the scheduler. Every callback runs on the owner thread.
struct Submission {
  std::vector<int64_t> prompt;  // expanded (expand_media_placeholders) when media is given
  // The prompt's images and clips, in order per kind (engine/media.h). A server fills it from
  // the request's content parts; the engine checks it against the prompt (ValueError).
  std::vector<Media> media;
  DecodeOptions options;
  OnTokens on_tokens;  // as Engine::decode's; returning false cancels
  OnLogits on_logits;
  // Called once the sequence has a row, before any of its tokens.
  std::function<void()> on_start;
  // Called once when it ends: its result, or what ended it without one (a ValueError from the
  // engine's checks of its prompt or options; any other exception from a failed step).
  std::function<void(DecodeResult, std::exception_ptr)> on_done;
};

// A slot action for the owner thread (llama-server's POST /slots/{id}?action=...).
enum class SlotAction { kSave, kRestore, kErase };
struct SlotTask {
  SlotAction action = SlotAction::kSave;
  int64_t row = 0;
  std::string path;  // the state file, for save and restore
};

// The queue has no room for a submission: more than max_queue sequences would wait.
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SchedulerStats {
  int64_t waiting = 0;  // submitted, without a row yet
  int64_t running = 0;  // in a row: reading their prompt or decoding
  BatchStats batch;     // as of the last step (rows and capacity known once run() started)
  double busy_s = 0;    // time spent in steps
  bool asleep = false;  // the engine's weights are freed (sleep_idle_s)
  int64_t sleeps = 0;   // times it went to sleep
  double last_wake_s = 0;  // how long the last wake took to load the weights again
};

class Scheduler {
 public:
  // ValueError for a negative max_queue or a read_every below 1, or read_every > 1 with more than
  // one row.
  explicit Scheduler(const SchedulerOptions& options);

  // Any thread. Queues a sequence and returns its ticket. QueueFull when it would leave more than
  // max_queue sequences waiting once the rows free now are taken (before run() starts, none are;
  // a sequence asking for a row takes only that one);
  // the submission is then dropped without a call to on_done. ValueError for a row
  // (DecodeOptions::row) outside the batch. A queued submission ends any keep_alive(): the
  // engine sleeps after sleep_idle_s again.
  int64_t submit(Submission submission);
  // Any thread. Queues several sequences (a request's choices) as submit() does, all of them or,
  // with QueueFull, none.
  std::vector<int64_t> submit(std::vector<Submission> submissions);
  // Any thread. Ends a waiting or running sequence (finish "cancelled", its on_done called on the
  // owner thread); nothing for a ticket that has ended.
  void cancel(int64_t ticket);
  // Any thread. Waits until the owner thread has run the action between two steps (a sleeping
  // engine woken first, as for a submission) and returns what it did: Batch::save_slot,
  // restore_slot or erase_slot, and their exceptions. ValueError one sequence at a time (no
  // batch, no prefix cache); std::runtime_error once stop() was called.
  SlotOutcome slot(const SlotTask& task);
  // Any thread. Waits until the owner thread has run `task` with the engine between two steps,
  // asleep or awake as it is (loading or unloading a LoRA adapter), and rethrows its exception.
  // std::runtime_error once stop() was called.
  void run_on_owner(std::function<void(Engine&)> task);
  // Any thread. The engine sleeps as sleep_idle_s running out would make it (whatever that is),
  // once nothing waits or runs: at once when idle, else after what is running ends (Ollama's
  // unload). Returns without waiting; nothing when it sleeps already.
  void sleep_when_idle();
  // Any thread. From now until the next submission or call, the engine sleeps once it has been
  // idle this long instead of sleep_idle_s (Ollama's keep_alive, which each request sets for the
  // model after it): below 0 never, 0 as soon as nothing waits or runs; nullopt: sleep_idle_s. A
  // limit set while the engine idles counts from when it went idle.
  void keep_alive(std::optional<double> seconds);
  // Any thread. The idle time after which the engine sleeps (keep_alive's, else sleep_idle_s);
  // nullopt: never (below 0, or beyond 10⁹ s).
  std::optional<double> idle_limit() const;
  // Any thread. Wakes a sleeping engine as a submission would, and waits until its weights are
  // loaded again, rethrowing a failed load's exception; nothing when awake (Ollama's load).
  // std::runtime_error once stop() was called.
  void wake_up();
  // Any thread. run() returns once nothing waits or runs.
  void stop();
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  // The prefix cache's budget in bytes: the batch's, or 0 one sequence at a time (no batch).
  int64_t cache_budget() const;

  // The owner thread: serves submissions with `engine` until stop(). A failed step ends every
  // sequence in the batch with its exception and the batch starts afresh.
  void run(Engine& engine);

 private:
  struct Entry {
    int64_t ticket;
    Submission submission;
  };
  struct SlotEntry {
    SlotTask task;
    std::promise<SlotOutcome> done;
  };
  struct EngineTask {
    std::function<void(Engine&)> task;
    std::promise<void> done;
  };

  enum class Taken { kWork, kStopped, kIdleTooLong };
  // Waits for work; takes the cancels, the slot actions, the engine tasks and the waiting entries
  // the `free` rows take (place_in_rows). kStopped when stopped and nothing is left to do
  // (`idle`: nothing in the batch); kIdleTooLong when idle, `may_sleep` (the engine is awake) and
  // nothing came for the idle limit (idle_limit(), read again whenever it changes).
  Taken take_work(bool idle, std::vector<bool> free, bool may_sleep,
                  std::vector<Entry>& admitted, std::vector<Entry>& dropped,
                  std::set<int64_t>& cancels, std::vector<SlotEntry>& actions,
                  std::vector<EngineTask>& tasks);
  // Runs the tasks taken, each one's outcome to whoever waits in run_on_owner().
  static void run_tasks(Engine& engine, std::vector<EngineTask>& tasks);
  // idle_limit() with mutex_ held.
  std::optional<double> idle_limit_locked() const;
  // Engine::sleep after sleep_idle_s of idleness, with the stats saying so.
  void sleep(Engine& engine);
  // Engine::wake before `admitted` and `actions` run. False when the engine stays asleep: there
  // are none, or the load failed and each ended with its exception.
  bool wake(Engine& engine, std::vector<Entry>& admitted, std::vector<SlotEntry>& actions);
  // Engine::wake, with the stats saying so; its exception as it is.
  void wake_now(Engine& engine);
  void run_batch(Engine& engine);
  // One slot action on `batch`, timed; its outcome or exception goes to whoever waits in slot().
  static void run_slot(Batch& batch, SlotEntry& action);
  void run_serial(Engine& engine);
  // With nothing running or waiting: the heap's free pages go back to the system. Requests of
  // many shapes (prompt chunks, batch sizes, oneDNN's compiled matmuls coming and going) leave
  // holes that glibc keeps resident otherwise: tens of MB over a soak of the demo model.
  void settle();
  // stats_.batch from `batch`, its counters added to those of the batches before it (ended_).
  // The caller holds mutex_.
  void publish(const Batch& batch);

  SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Entry> waiting_;
  std::set<int64_t> cancels_;  // of sequences past the queue
  // Cancelled while waiting: out of the queue, their on_done still to call on the owner thread.
  std::vector<Entry> dropped_;
  // The rows free as the owner thread last placed or stepped them (none before run() starts).
  std::vector<bool> free_rows_;
  std::vector<SlotEntry> actions_;
  std::vector<EngineTask> tasks_;
  int64_t next_ticket_ = 0;
  bool stopping_ = false;
  bool sleep_asked_ = false;  // sleep_when_idle() was called and the engine has not slept since
  std::optional<double> keep_alive_s_;  // keep_alive()'s limit until the next submission
  SchedulerStats stats_;  // running, batch and busy_s; waiting is waiting_'s size
  // The counters (steps, prompt passes and tokens, the prefix cache's hits, misses, reuse, saves
  // and evictions) of the batches a sleep or a failed step ended, so that stats_.batch's count
  // since the scheduler started, as Prometheus counters must. A cache kept over a sleep keeps
  // counting its own.
  BatchStats ended_;
};

}  // namespace torchtpu
