// Several sequences decoded together (continuous batching, DESIGN principle 3). A Batch holds
// rings of `rows` rows beside its engine's and schedules sequences onto them: each row has its own
// positions, ring slots, sampler row, stop ids, cancel flag and output; sequences join and leave
// between steps; one step reads prompt chunks within a token budget and then decodes one token
// for every row past its prompt in a single forward pass, or, where rows draft (speculative
// decoding, DecodeOptions::draft) and drafting pays, checks each row's token and draft in one
// pass. It belongs to the engine's owner thread and nothing here knows about HTTP, Python or
// threads: a server puts requests on its own queue to that thread and calls submit, cancel and
// step there.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/draft.h"
#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/sequence.h"
#include "model/rings.h"
#include "model/sampling.h"

namespace torchtpu {

struct BatchOptions {
  int64_t rows = 4;  // sequences in the rings at once; more submissions wait in a queue
  // Tokens one step may put through the model while some row decodes: one per decoding row, the
  // rest for prompt chunks (each at most the engine's prefill_chunk). It bounds how long a prompt
  // being read delays the other rows' next token; a step with no row decoding reads up to a whole
  // prefill_chunk. Must exceed `rows`, so a prompt always advances. 0: min(prefill_chunk, 128) +
  // rows.
  int64_t step_tokens = 0;
  // The prefix cache's budget (engine/prefix_cache.h): 0 keeps none. A sequence leaving its row
  // saves the state after every token in its rings; a prompt chunk ending at a multiple of
  // `cache_block`, at the prompt's end or where a row waiting on it starts (start_or_wait)
  // saves the state there (chunks that cross such a point end at it).
  int64_t cache_bytes = 0;
  int64_t cache_block = 256;
  // Rows (padding included) one forward pass may take when it reads several sequences' prompt
  // chunks together; 1: each prompt is read on its own. 0: 1 on the CPU (docs/BENCHMARKS.md,
  // "Prompts read together": faster with AMX, slower without, and the heap grows), elsewhere no
  // limit beyond the step's budget, since there one pass costs about what one sequence's does.
  int64_t pass_rows = 0;
};

// One row of a batch as a step left it (llama-server's /slots).
struct RowStats {
  // The id submit gave its sequence (the scheduler's ticket one sequence at a time); -1: free.
  int64_t sequence = -1;
  bool reading = false;   // reading its prompt (else decoding, when it has a sequence)
  int64_t prompt_tokens = 0;
  int64_t generated = 0;  // tokens sampled so far
  int64_t remaining = 0;  // tokens it may still generate
  bool drafting = false;  // its options draft (DecodeOptions::draft), whether or not a pass checks
};

// What a Batch holds at the moment (a server's /metrics, /v1/engine and /slots).
struct BatchStats {
  int64_t rows = 0;      // rows in the rings
  int64_t queued = 0;    // submitted, waiting for a row
  int64_t reading = 0;   // rows reading their prompt
  int64_t decoding = 0;  // rows past their prompt
  int64_t steps = 0;     // steps run so far
  // Forward passes that read prompt chunks, and the prompt tokens they read (not those restored
  // from the prefix cache): several rows' chunks can share a pass.
  int64_t prompt_passes = 0;
  int64_t prompt_tokens = 0;
  // The options in effect, defaults resolved: the step's token budget, and the rows a shared
  // prompt pass may take (nullopt: no limit).
  int64_t step_tokens = 0;
  std::optional<int64_t> pass_rows;
  // Positions the rows' rings hold or will hold once their prompts are read (a row's prompt
  // counts whole from the step that admits it, as a cache that reserves a prompt's blocks counts
  // them), and the positions they can hold (rows x context): a cache-use gauge.
  int64_t positions = 0;
  int64_t capacity = 0;
  PrefixCacheStats cache;
  std::vector<RowStats> row_stats;  // one per row, in row order
};

// What a slot action did (Batch::save_slot, restore_slot, erase_slot).
struct SlotOutcome {
  int64_t tokens = 0;  // the state's tokens: saved, restored or erased
  int64_t bytes = 0;   // the file's size: written or read
  double seconds = 0;  // the action itself (the scheduler times it)
};

// Where sequences waiting in this order go, given which rows are free (free[i]): those asking
// for a row (DecodeOptions::row) take it if it is free, the earliest first; then the others take
// the lowest rows left, in order. -1 for those that wait: their turn comes as rows free up, and
// they hold back no one. A Batch admits so, and the scheduler chooses what to hand it alike.
std::vector<int64_t> place_in_rows(const std::vector<int64_t>& wanted, std::vector<bool> free);
// ValueError unless `row` (DecodeOptions::row) is -1 or one of `rows` rows.
void check_row(int64_t row, int64_t rows);

class Batch {
 public:
  // Rings for `options.rows` sequences on the engine's device (each as large as the engine's
  // own). The engine must outlive the batch. ValueError for rows < 1, a step_tokens of rows or
  // fewer, or a negative pass_rows. `cache`: an earlier batch's prefix cache on this engine
  // (take_cache) to go on with, instead of a new one of options.cache_bytes.
  Batch(Engine& engine, const BatchOptions& options, std::optional<PrefixCache> cache = {});

  // Queues a sequence and returns its id (0, 1, 2, ... per batch). The checks of Engine::decode
  // (ValueError), and a row (DecodeOptions::row) inside the batch; read_every is taken as 1 (every
  // step reads each row's token back, to see stops and free rows). on_tokens sees this sequence's
  // tokens as they reach the host, on_logits the float32 logits [vocab] each was chosen from.
  // `media`: the images and clips of an expanded prompt (Engine::decode's); their towers run
  // when the row is admitted, and the prefix cache keys their positions by the items' digests.
  int64_t submit(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                 OnTokens on_tokens = {}, OnLogits on_logits = {}, std::vector<Media> media = {});
  // Ends a queued or running sequence at the start of the next step, with finish "cancelled" and
  // the tokens it has. ValueError for an id that is not queued or running.
  void cancel(int64_t id);
  // One step: cancels, admits queued sequences into free rows (lowest first), reads prompt chunks
  // within the token budget (oldest sequence first), then decodes one token for every row past
  // its prompt, and the draft tokens the pass finds room for and the row's output agrees with
  // (where the gate lets the pass check them: DraftGate). Returns the ids that finished in this
  // step, whose results take_result hands over.
  std::vector<int64_t> step();
  // Hands the prefix cache over, states and counters, for a later batch on the same engine (the
  // scheduler keeps it while the engine sleeps); this batch saves and restores nothing after.
  std::optional<PrefixCache> take_cache() { return std::exchange(cache_, std::nullopt); }
  // llama-server's slot actions (POST /slots/{id}?action=save|restore|erase). Here they act on
  // the prefix cache, which every row shares: a row names the state its last sequence left there,
  // or the last one restored into it (PrefixCache::row_state). ValueError for a row outside the
  // batch or a batch without a prefix cache.
  // Writes that state to `path` (write_prefix_state). ValueError when the row holds none: no
  // sequence has finished there since the cache was made, or its state was evicted or erased.
  SlotOutcome save_slot(int64_t row, const std::string& path);
  // Reads a state file into the prefix cache as the row's (read_prefix_state's errors): a prompt
  // starting with its tokens then starts from it, in any row. ValueError when the state alone
  // exceeds the cache's budget.
  SlotOutcome restore_slot(int64_t row, const std::string& path);
  // Forgets the row's state (and the blocks only it held); its tokens, 0 when it held none.
  int64_t erase_slot(int64_t row);
  // The result of a finished sequence, once. ValueError if `id` has not finished or was taken.
  DecodeResult take_result(int64_t id);

  // Nothing queued or in a row (results may still wait to be taken).
  bool idle() const;
  // Whether each row is free now (no sequence in it).
  std::vector<bool> free_rows() const;
  BatchStats stats() const;
  const BatchOptions& options() const { return options_; }

 private:
  struct Request {
    int64_t id;
    std::vector<int64_t> prompt;
    DecodeOptions options;
    OnTokens on_tokens;
    OnLogits on_logits;
    std::vector<Media> media;
    std::vector<int64_t> cache_key;  // the prompt as prefix_cache_key names it
    LoraScales lora;                 // options.lora resolved at submit
  };
  struct Row {
    std::optional<Request> request;  // none: the row is free
    std::optional<SequenceOutput> output;
    std::vector<int64_t> fed;  // tokens fed to decode steps: the rings hold prompt[0, read) + fed
    int64_t read = 0;          // prompt tokens in the rings
    int64_t position = 0;      // where the row's next token goes (its prompt length once decoding)
    int64_t budget = 0;        // tokens it may generate
    int64_t sampled = 0;       // tokens sampled so far
    int64_t cached = 0;        // prompt tokens restored from the prefix cache
    int64_t draft_room = 0;    // the longest draft it checks (draft_room), 0 without drafts
    int64_t draft_length = 0;  // its next draft's length at most (next_draft_length)
    int64_t drafted = 0, accepted = 0;  // draft tokens checked and kept
    bool started = false;      // restored what the cache held and began reading (start_or_wait)
    // Where its chunks end and its state is saved, this step, for rows waiting on it.
    std::vector<int64_t> save_at;
    at::Tensor token;          // [1] on the device: the token the next decode step feeds
    int64_t token_id = 0;      // its value, as read back
    // [1, 1, hidden_size] on the device, with an assistant (Engine::has_drafter): the model's
    // final hidden state at the position that chose `token`, what the assistant drafts from.
    at::Tensor hidden;
    PromptMedia media;         // the towers' rows for the prompt's soft tokens
    bool decoding() const {
      return request && read == static_cast<int64_t>(request->prompt.size());
    }
  };

  void admit(Row& row, int64_t index, Request request);
  // The prefix cache, for a slot action on `row` (save_slot's ValueErrors).
  PrefixCache& slot_cache(int64_t row);
  // Of the rows reading their prompt (ids ascending), those that read this step, in that order.
  // A row that has not started waits while a row ahead of it (further into its prompt, or as far
  // and older) has yet to read tokens both prompts start with, beyond what the prefix cache holds
  // of its prompt: that row saves its state where the shared tokens end (save_at), and the waiting
  // one starts from it, so a prompt several rows share (a request's choices, one system prompt)
  // is read once. The others start: their prompt's longest cached prefix restored (none for rows
  // whose prompt logits are asked for, which neither wait nor restore).
  std::vector<int64_t> start_or_wait(const std::vector<int64_t>& reading);
  // How many prompt tokens a row reads next, given at most `limit`.
  int64_t chunk_size(const Row& row, int64_t limit) const;
  // Reads up to `limit` more prompt tokens of a row; samples its first token after the last.
  // Returns the tokens read.
  int64_t read_chunk(Row& row, int64_t index, int64_t limit, std::vector<int64_t>& finished);
  // forward's `lora` for ring rows [lo, lo + n): each sequence's scales, a free row's none.
  LoraRows lora_rows(int64_t lo, int64_t n) const;
  // Reads chunks of several of the `reading` rows (those still reading) in one forward pass,
  // within `budget` tokens (padding counted). Returns the tokens the pass put through the model:
  // 0 when fewer than two rows could share it.
  int64_t read_together(const std::vector<int64_t>& reading, int64_t budget,
                        std::vector<int64_t>& finished);
  // After `count` prompt tokens of a row were read: the prefix cache's save points, and the first
  // token from `logits` [vocab] once the prompt is whole.
  void after_chunk(Row& row, int64_t index, int64_t count, const at::Tensor& logits,
                   std::vector<int64_t>& finished);
  void decode_rows(std::vector<int64_t>& finished);
  // Each of the first n rows' draft for this step (lookup_draft, or the assistant's:
  // Engine::draft), empty for rows that do not decode or find none; no drafts at all when no row
  // has one.
  std::vector<std::vector<int64_t>> look_up_drafts(int64_t n);
  // The assistant's drafts of rows [lo, lo + limits.size()), limits[b] tokens for row lo + b, in
  // drafts[lo + b]: one Engine::draft over those rows' rings.
  void assistant_drafts(int64_t lo, const std::vector<int64_t>& limits,
                        std::vector<std::vector<int64_t>>& drafts);
  // The step of decode_rows when rows draft: one pass over each decoding row's fed token and
  // draft, the other rows padding; each row sampled position by position as steps would be, while
  // its draft agrees, and the rings given back what its rejected positions overwrote. Returns
  // the tokens the rows took.
  int64_t check_drafts(int64_t n, const std::vector<std::vector<int64_t>>& drafts,
                       std::vector<int64_t>& finished);
  // Counts a row's new token, read back: why it ends the row (a stop id or a cancel, which the
  // output has seen; or its budget), nullptr when it does not.
  const char* take(Row& row, int64_t token);
  // take, and the row finished when it ends.
  void accept(Row& row, int64_t index, int64_t token, std::vector<int64_t>& finished);
  void finish(Row& row, int64_t index, const char* reason, std::vector<int64_t>& finished);
  // Shows the logits [vocab] a row's token is chosen from to its on_logits, and its grammar's
  // mask to the sampler.
  void before_sampling(Row& row, int64_t index, const at::Tensor& logits);

  Engine& engine_;
  BatchOptions options_;
  // Whether each step's shapes stay fixed (all rows, padding included) or follow the rows in use:
  // the model's host-side shortcut switch (ModelOptions::attend_filled_slots, the CPU's).
  bool fixed_shape_ = false;
  // Whether passes keep each row's final hidden state (Row::hidden): an assistant drafts.
  at::Tensor* keep_hidden(at::Tensor& out) const { return engine_.has_drafter() ? &out : nullptr; }
  DraftGate gate_;   // whether rows that found drafts check them (engine/draft.h)
  Sampler sampler_;  // one row per ring row, through the same ops every step with fixed shapes
  Rings rings_;
  std::vector<Row> rows_;
  std::deque<Request> queue_;
  std::set<int64_t> cancels_;
  std::map<int64_t, DecodeResult> results_;
  int64_t next_id_ = 0;
  int64_t steps_ = 0;
  int64_t prompt_passes_ = 0;
  int64_t prompt_tokens_ = 0;
  at::Tensor pad_token_;  // [1] on the device: what a padding row feeds
  std::optional<PrefixCache> cache_;
};

}  // namespace torchtpu
