#include "engine/batch.h"

#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <utility>

#include "common/errors.h"
#include "engine/state_file.h"
#include "ops/int4_cpu.h"

namespace torchtpu {

// A row that is not decoding still takes part in a decode step when it lies below the last
// decoding row (or always, with fixed shapes): a padding row. It feeds pad_token_ at its next
// position (0 when free), so the step writes one entry into its own ring row at that position,
// which no later read sees: a prompt chunk starting there replaces entries at or after its first
// position (Gemma4::attention), a new sequence resets the row, and the slot it overwrites in a
// sliding ring holds a position the window has already left. Its query sees that entry, so the
// attention of every row has a key.

namespace {

const BatchOptions& checked(const BatchOptions& options) {
  if (options.rows < 1) {
    throw ValueError("a batch needs at least 1 row, got " + std::to_string(options.rows));
  }
  check_cache_block(options.cache_block);
  return options;
}

// Prompt tokens a step reads beside decoding rows by default. Without AMX, a 4,096-token prompt
// read beside a stream in chunks of 512 held the stream up to 5.5-7.6 s between two tokens; in
// chunks of 128, 1.6-1.9 s, for a read 0.98-1.25x as long (E2B, 2 cores, two pairs of runs;
// docs/BENCHMARKS.md, "Several rows without AMX").
constexpr int64_t kDefaultSharedChunk = 128;

// On the CPU a pass that checks drafts takes at most this many positions, padding counted: the
// rows the int4 kernel reads its weights once for. One decoding row may draft 7 tokens, two 3
// each, three or four 1, five or more none: a drafting pass reads the weights once, as a step
// does, and a full batch decodes as without drafts (docs/BENCHMARKS.md, "Drafts in a Batch").
constexpr int64_t kDraftPassPositions = ops::int4_cpu::kMaxRows;

// Host ids or positions as an int64 tensor of `shape` on `device`.
at::Tensor long_tensor(const std::vector<int64_t>& v, at::IntArrayRef shape,
                       const at::Device& device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).view(shape).to(device);
}

}  // namespace

Batch::Batch(Engine& engine, const BatchOptions& options, std::optional<PrefixCache> cache)
    : engine_(engine),
      options_(checked(options)),
      fixed_shape_(!engine.model_options().attend_filled_slots),
      sampler_(options.rows, engine.config().vocab_size, engine.options().device, fixed_shape_) {
  if (options_.step_tokens == 0) {
    options_.step_tokens =
        std::min(engine.options().prefill_chunk, kDefaultSharedChunk) + options_.rows;
  }
  if (options_.pass_rows < 0) {
    throw ValueError("pass_rows must be at least 0, got " + std::to_string(options_.pass_rows));
  }
  // On the CPU a shared pass of eight 32-token prompts (E2B, 2 cores) gave the last its first
  // token 0.53x as late with AMX, the median 0.92-0.96x, but without AMX the last 1.4x and the
  // median 2.5x as late; and with AMX the server's heap grew 3.8-8.8% over js_soak's short run
  // against 3.8-3.9% (likely oneDNN products built for each new row count).
  // docs/BENCHMARKS.md, "Prompts read together".
  if (options_.pass_rows == 0) {
    options_.pass_rows =
        engine.options().device.is_cpu() ? 1 : std::numeric_limits<int64_t>::max();
  }
  if (options_.step_tokens <= options_.rows) {
    throw ValueError("step_tokens (" + std::to_string(options_.step_tokens) +
                     ") must exceed rows (" + std::to_string(options_.rows) +
                     "), so that a prompt being read always advances");
  }
  c10::InferenceMode inference;
  const auto& o = engine.options();
  rings_ = engine.make_rings(options_.rows);
  rows_.resize(options_.rows);
  pad_token_ = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(o.device));
  if (cache) {
    cache_ = std::move(cache);
  } else if (options_.cache_bytes > 0) {
    cache_.emplace(options_.cache_bytes, options_.cache_block);
  }
}

std::vector<int64_t> place_in_rows(const std::vector<int64_t>& wanted, std::vector<bool> free) {
  std::vector<int64_t> placed(wanted.size(), -1);
  for (size_t k = 0; k < wanted.size(); ++k) {
    const int64_t row = wanted[k];
    if (row >= 0 && row < static_cast<int64_t>(free.size()) && free[row]) {
      placed[k] = row;
      free[row] = false;
    }
  }
  for (size_t k = 0; k < wanted.size(); ++k) {
    const auto first = std::find(free.begin(), free.end(), true);
    if (wanted[k] >= 0 || first == free.end()) continue;
    placed[k] = first - free.begin();
    *first = false;
  }
  return placed;
}

void check_row(int64_t row, int64_t rows) {
  if (row < -1 || row >= rows) {
    throw ValueError("row " + std::to_string(row) + " does not exist: the rows are 0 to " +
                     std::to_string(rows - 1) + " (-1: the first free one)");
  }
}

int64_t Batch::submit(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                      OnTokens on_tokens, OnLogits on_logits, std::vector<Media> media) {
  engine_.check_decode(prompt, options, media);
  check_row(options.row, options_.rows);
  DecodeOptions every_step = options;
  every_step.read_every = 1;
  auto lora = engine_.lora_scales(options.lora);
  const int64_t id = next_id_++;
  const auto salt = lora_salt(lora);
  auto cache_key = prefix_cache_key(
      prompt, media, engine_.config(),
      salt.empty() ? options.cache_salt : options.cache_salt + "\n" + salt);
  queue_.push_back({id, prompt, std::move(every_step), std::move(on_tokens), std::move(on_logits),
                    std::move(media), std::move(cache_key), std::move(lora)});
  return id;
}

void Batch::cancel(int64_t id) {
  const bool queued =
      std::any_of(queue_.begin(), queue_.end(), [&](const Request& r) { return r.id == id; });
  const bool running = std::any_of(rows_.begin(), rows_.end(), [&](const Row& row) {
    return row.request && row.request->id == id;
  });
  if (!queued && !running) {
    throw ValueError("sequence " + std::to_string(id) +
                     " is not queued or running in this batch (finished, or never submitted)");
  }
  cancels_.insert(id);
}

DecodeResult Batch::take_result(int64_t id) {
  const auto it = results_.find(id);
  if (it == results_.end()) {
    throw ValueError("sequence " + std::to_string(id) +
                     " has no result to take (still running, already taken, or never submitted)");
  }
  DecodeResult result = std::move(it->second);
  results_.erase(it);
  return result;
}

bool Batch::idle() const {
  return queue_.empty() &&
         std::none_of(rows_.begin(), rows_.end(), [](const Row& row) { return row.request; });
}

std::vector<bool> Batch::free_rows() const {
  std::vector<bool> free;
  for (const auto& row : rows_) free.push_back(!row.request);
  return free;
}

BatchStats Batch::stats() const {
  BatchStats s;
  s.rows = options_.rows;
  s.queued = static_cast<int64_t>(queue_.size());
  for (const auto& row : rows_) {
    RowStats& r = s.row_stats.emplace_back();
    if (!row.request) continue;
    (row.decoding() ? s.decoding : s.reading)++;
    const auto prompt = static_cast<int64_t>(row.request->prompt.size());
    s.positions += std::max(row.position, prompt);
    r = {row.request->id, !row.decoding(), prompt, row.sampled, row.budget - row.sampled,
         row.request->options.draft.tokens > 0};
  }
  s.capacity = options_.rows * engine_.options().context;
  s.steps = steps_;
  s.prompt_passes = prompt_passes_;
  s.prompt_tokens = prompt_tokens_;
  s.step_tokens = options_.step_tokens;
  if (options_.pass_rows != std::numeric_limits<int64_t>::max()) s.pass_rows = options_.pass_rows;
  if (cache_) s.cache = cache_->stats();
  return s;
}

void Batch::admit(Row& row, int64_t index, Request request) {
  const auto n = static_cast<int64_t>(request.prompt.size());
  row.output.emplace(request.options, engine_.config().eos_token_ids, request.prompt,
                     std::move(request.on_tokens));
  row.budget = engine_.token_budget(n, request.options.max_new);
  row.draft_length = row.draft_room =
      draft_room(request.options.draft, rings_, engine_.options().device);
  row.request = std::move(request);
  rings_.reset_row(index);
  row.media = engine_.embed_media(row.request->prompt, row.request->media);
}

std::vector<int64_t> Batch::start_or_wait(const std::vector<int64_t>& reading) {
  std::vector<int64_t> order = reading;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rows_[a].read > rows_[b].read; });
  for (const int64_t i : order) rows_[i].save_at.clear();
  std::set<int64_t> waiting;
  for (size_t k = 0; k < order.size(); ++k) {
    Row& row = rows_[order[k]];
    if (row.started) continue;
    if (cache_ && !row.request->options.prompt_logits) {
      const auto& key = row.request->cache_key;
      const int64_t held = cache_->held_for(key);
      for (size_t j = 0; j < k; ++j) {
        Row& ahead = rows_[order[j]];
        const auto& other = ahead.request->cache_key;
        const auto shared = std::mismatch(key.begin(), key.end(), other.begin(), other.end());
        // A restored state leaves one prompt token to read, for the first token's logits.
        const int64_t target = std::min<int64_t>(shared.first - key.begin(),
                                                 static_cast<int64_t>(key.size()) - 1);
        if (target > held && ahead.read < target) {
          ahead.save_at.push_back(target);
          waiting.insert(order[k]);
          break;
        }
      }
      if (waiting.count(order[k]) > 0) continue;
      row.cached = cache_->restore(key, rings_, order[k]);
    }
    row.read = row.position = row.cached;
    row.started = true;
  }
  std::vector<int64_t> started;
  for (const int64_t i : reading) {
    if (waiting.count(i) == 0) started.push_back(i);
  }
  return started;
}

void Batch::finish(Row& row, int64_t index, const char* reason, std::vector<int64_t>& finished) {
  const int64_t id = row.request->id;
  if (cache_) {
    const auto& key = row.request->cache_key;
    std::vector<int64_t> held(key.begin(), key.begin() + row.read);
    held.insert(held.end(), row.fed.begin(), row.fed.end());
    cache_->save(held, rings_, index);
    cache_->set_row_state(index, std::move(held));
  }
  auto& result = results_[id] = row.output->done(reason);
  result.cached_tokens = row.cached;
  result.drafted = row.drafted;
  result.accepted = row.accepted;
  finished.push_back(id);
  sampler_.clear(index);
  row = Row{};
}

PrefixCache& Batch::slot_cache(int64_t row) {
  if (row < 0 || row >= options_.rows) {
    throw ValueError("slot " + std::to_string(row) + " does not exist: the slots are 0 to " +
                     std::to_string(options_.rows - 1));
  }
  if (!cache_) {
    throw ValueError("the prefix cache is off (a budget of 0 bytes): slots keep no state");
  }
  return *cache_;
}

SlotOutcome Batch::save_slot(int64_t row, const std::string& path) {
  PrefixCache& cache = slot_cache(row);
  const auto* tokens = cache.row_state(row);
  const std::string slot = "slot " + std::to_string(row);
  if (!tokens) {
    throw ValueError(slot + " has no state to save: no sequence has finished in it, and none " +
                     "was restored into it, since the prefix cache was made");
  }
  const auto state = cache.get(*tokens);
  if (!state) {
    throw ValueError(slot + "'s last state (" + std::to_string(tokens->size()) +
                     " tokens) is no longer in the prefix cache: evicted for its budget");
  }
  return {static_cast<int64_t>(tokens->size()),
          write_prefix_state(path, *state, engine_.weights_id())};
}

SlotOutcome Batch::restore_slot(int64_t row, const std::string& path) {
  PrefixCache& cache = slot_cache(row);
  PrefixState state = read_prefix_state(path, engine_.weights_id(), rings_);
  const auto tokens = static_cast<int64_t>(state.tokens.size());
  if (!cache.put(state)) {
    throw ValueError(path + " holds a state of " + std::to_string(tokens) +
                     " tokens, larger than the prefix cache's whole budget (" +
                     std::to_string(cache.budget() >> 20) + " MiB)");
  }
  cache.set_row_state(row, std::move(state.tokens));
  return {tokens, static_cast<int64_t>(std::filesystem::file_size(path))};
}

int64_t Batch::erase_slot(int64_t row) {
  PrefixCache& cache = slot_cache(row);
  const auto* tokens = cache.row_state(row);
  const int64_t erased = tokens ? cache.erase(*tokens) : 0;
  cache.set_row_state(row, {});
  return erased;
}

const char* Batch::take(Row& row, int64_t token) {
  row.token_id = token;
  ++row.sampled;
  if (!row.output->take(&token, 1)) return "stop";
  return row.sampled == row.budget ? "length" : nullptr;
}

void Batch::accept(Row& row, int64_t index, int64_t token, std::vector<int64_t>& finished) {
  if (const char* reason = take(row, token)) finish(row, index, reason, finished);
}

void Batch::before_sampling(Row& row, int64_t index, const at::Tensor& logits) {
  if (row.request->on_logits) row.request->on_logits(logits);
  if (row.output->masked()) row.output->forbid(sampler_.forbidden(index));
}

int64_t Batch::chunk_size(const Row& row, int64_t limit) const {
  const int64_t n = static_cast<int64_t>(row.request->prompt.size());
  int64_t count = std::min({n - row.read, engine_.options().prefill_chunk, limit});
  // With a prefix cache, a chunk that crosses a multiple of the block, a point a waiting row
  // starts from (save_at) or one of the request's reuse points ends there, so the state at that
  // point can be saved for prompts that share only the tokens up to it.
  if (!cache_) return count;
  const int64_t block = cache_->block();
  if ((row.read + count) / block > row.read / block && (row.read + count) % block) {
    count = (row.read + count) / block * block - row.read;
  }
  for (const auto* points : {&row.save_at, &row.request->options.reuse_points}) {
    for (const int64_t point : *points) {
      if (point > row.read && point < row.read + count) count = point - row.read;
    }
  }
  return count;
}

LoraRows Batch::lora_rows(int64_t lo, int64_t n) const {
  std::vector<const LoraScales*> scales;
  for (int64_t i = lo; i < lo + n; ++i) {
    const auto& request = rows_[i].request;
    scales.push_back(request ? &request->lora : nullptr);
  }
  return torchtpu::lora_rows(scales);
}

int64_t Batch::read_chunk(Row& row, int64_t index, int64_t limit, std::vector<int64_t>& finished) {
  const int64_t count = chunk_size(row, limit);
  auto row_rings = rings_.rows(index, 1);
  const auto logits = engine_.read_chunk(row_rings, row.request->prompt, row.read,
                                         row.read + count, &row.media, keep_hidden(row.hidden),
                                         lora_rows(index, 1), row.request->options.prompt_logits);
  ++prompt_passes_;
  after_chunk(row, index, count, logits, finished);
  return count;
}

int64_t Batch::read_together(const std::vector<int64_t>& reading, int64_t budget,
                             std::vector<int64_t>& finished) {
  // The pass spans ring rows [lo, hi] with every chunk padded to the longest, T: rows between
  // that read nothing ride along as padding alone. A row joins, oldest first, while the pass
  // stays within the budget and pass_rows and its padding within half the tokens it reads.
  // Chunks stay within a sliding window, so that the ring writes of every row's tokens stay
  // whole (Gemma4::forward). Rows with images or audio read alone, with their soft tokens, and
  // rows whose prompt logits are asked for, with every position's logits.
  if (options_.pass_rows < 2) return 0;  // no two rows fit: each prompt reads alone
  const int64_t window = engine_.config().sliding_window;
  const int64_t cap = window > 0 ? std::min(budget, window) : budget;
  std::vector<std::pair<int64_t, int64_t>> group;  // (row, tokens)
  int64_t T = 0, real = 0, lo = options_.rows, hi = -1;
  for (const int64_t i : reading) {
    const Row& row = rows_[i];
    if (!row.request || row.decoding() || !row.request->media.empty() ||
        row.request->options.prompt_logits) {
      continue;
    }
    const int64_t count = chunk_size(row, cap);
    if (count == 0) continue;
    const int64_t t = std::max(T, count), l = std::min(lo, i), h = std::max(hi, i);
    const int64_t padded = (h - l + 1) * t;
    if (padded > std::min(budget, options_.pass_rows) || 2 * padded > 3 * (real + count)) {
      continue;
    }
    group.emplace_back(i, count);
    T = t;
    real += count;
    lo = l;
    hi = h;
  }
  if (group.size() < 2) return 0;

  const int64_t n = hi - lo + 1;
  std::vector<int64_t> ids(n * T, 0), positions(n * T), lengths(n, 0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t j = 0; j < T; ++j) positions[b * T + j] = rows_[lo + b].position + j;
  }
  bool any_final = false;
  for (const auto& [i, count] : group) {
    const Row& row = rows_[i];
    const auto& prompt = row.request->prompt;
    std::copy_n(prompt.begin() + row.read, count, ids.begin() + (i - lo) * T);
    lengths[i - lo] = count;
    any_final |= row.read + count == static_cast<int64_t>(prompt.size());
  }
  const auto device = engine_.options().device;
  auto rings = rings_.rows(lo, n);
  at::Tensor hidden;
  const auto logits = engine_.model().forward(
      long_tensor(ids, {n, T}, device), long_tensor(positions, {n, T}, device), &rings,
      /*last_only=*/true, /*no_logits=*/!any_final, /*soft=*/nullptr,
      long_tensor(lengths, {n}, device), keep_hidden(hidden), lora_rows(lo, n));
  ++prompt_passes_;
  for (const auto& [i, count] : group) {
    Row& row = rows_[i];
    const bool last = row.read + count == static_cast<int64_t>(row.request->prompt.size());
    if (last && hidden.defined()) row.hidden = hidden.narrow(0, i - lo, 1);
    after_chunk(row, i, count, last ? logits[i - lo].view({-1}) : at::Tensor(), finished);
  }
  return n * T;
}

void Batch::after_chunk(Row& row, int64_t index, int64_t count, const at::Tensor& logits,
                        std::vector<int64_t>& finished) {
  const auto& prompt = row.request->prompt;
  const auto n = static_cast<int64_t>(prompt.size());
  prompt_tokens_ += count;
  row.read += count;
  row.position = row.read;
  // Saved where chunk_size ends chunks, and at the prompt's end, a reuse point too: a chat's next
  // turn repeats this prompt, then the reply as the template renders it, which need not be the
  // tokens the model fed back.
  const auto& reuse = row.request->options.reuse_points;
  const auto at = [&](const std::vector<int64_t>& points) {
    return std::find(points.begin(), points.end(), row.read) != points.end();
  };
  if (cache_ &&
      (row.read % cache_->block() == 0 || row.read == n || at(row.save_at) || at(reuse))) {
    const auto& key = row.request->cache_key;
    cache_->save({key.begin(), key.begin() + row.read}, rings_, index);
  }
  if (row.read == n) {
    // The row joins the sampler with its first logits: until then a decode step samples it as
    // padding (greedy, drawing nothing from its generator).
    sampler_.set(index, row.request->options.sampling, prompt);
    before_sampling(row, index, logits);
    row.token = sampler_.next(logits.view({1, -1}), index);
    accept(row, index, row.token.item<int64_t>(), finished);
  }
}

void Batch::decode_rows(std::vector<int64_t>& finished) {
  int64_t last = -1;
  for (int64_t i = 0; i < options_.rows; ++i) {
    if (rows_[i].decoding()) last = i;
  }
  if (last < 0) return;
  const int64_t n = fixed_shape_ ? options_.rows : last + 1;
  const auto start = std::chrono::steady_clock::now();
  int64_t rows = 0;
  bool drafting = false, always = false;
  for (const auto& row : rows_) {
    if (!row.decoding()) continue;
    ++rows;
    drafting |= row.draft_room > 0;
    always |= row.draft_room > 0 && row.request->options.draft.always;
  }
  // The passes of rows that draft teach the gate, with the row count it decides for.
  auto record = [&](bool drafted, int64_t tokens) {
    if (!drafting) return;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    gate_.record(rows, drafted, tokens, took.count());
  };
  // The assistant's drafts cost passes of their own, so the gate is asked before they are made;
  // prompt lookup's cost next to nothing, and it is asked once some are found.
  const bool assistant = engine_.has_drafter();
  if (drafting && (!assistant || always || gate_.draft(rows))) {
    const auto drafts = look_up_drafts(n);
    if (!drafts.empty() && (assistant || always || gate_.draft(rows))) {
      return record(/*drafted=*/true, check_drafts(n, drafts, finished));
    }
  }
  std::vector<at::Tensor> tokens;
  std::vector<int64_t> positions, decoding;
  for (int64_t i = 0; i < n; ++i) {
    const Row& row = rows_[i];
    if (row.decoding()) decoding.push_back(i);
    tokens.push_back(row.decoding() ? row.token : pad_token_);
    positions.push_back(row.position);
  }
  const auto ids = at::cat(tokens).view({n, 1});
  const auto at_positions = long_tensor(positions, {n, 1}, engine_.options().device);
  auto rings = rings_.rows(0, n);
  at::Tensor hidden;
  const auto logits = engine_.model()
                          .forward(ids, at_positions, &rings, /*last_only=*/false,
                                   /*no_logits=*/false, /*soft=*/nullptr, /*lengths=*/{},
                                   keep_hidden(hidden), lora_rows(0, n))
                          .view({n, -1});
  at::Tensor sampled;
  {
    RECORD_USER_SCOPE("engine::sample");
    // Host-driven per row (the ops follow the rows that ask): logprobs and grammars.
    for (const int64_t i : decoding) {
      Row& row = rows_[i];
      if (row.request->on_logits || row.output->masked()) {
        before_sampling(row, i, logits[i]);
      }
    }
    // Every row of the step, padding included, in one call: with fixed shapes the same ops
    // whichever rows are live and however they sample.
    sampled = sampler_.next(logits);
  }
  const auto row_tokens = sampled.split(1);
  const auto host = sampled.to(at::kCPU);
  for (const int64_t i : decoding) {
    Row& row = rows_[i];
    row.fed.push_back(row.token_id);
    row.token = row_tokens[i];
    if (hidden.defined()) row.hidden = hidden.narrow(0, i, 1);
    ++row.position;
    accept(row, i, host.data_ptr<int64_t>()[i], finished);
  }
  record(/*drafted=*/false, rows);
}

std::vector<std::vector<int64_t>> Batch::look_up_drafts(int64_t n) {
  // With fixed shapes every pass that checks drafts has the longest room of the rows (one more
  // program beside the step's, for a server whose requests share their draft settings).
  const int64_t room =
      fixed_shape_ ? std::numeric_limits<int64_t>::max()
                   : std::max<int64_t>(kDraftPassPositions / n - 1, 0);
  std::vector<std::vector<int64_t>> drafts(n);
  // The assistant drafts for runs of neighbouring rows at once: a row between them that does not
  // draft may hold no keys for its attention to see.
  std::vector<int64_t> run;
  auto end_run = [&](int64_t next) {
    if (!run.empty()) assistant_drafts(next - static_cast<int64_t>(run.size()), run, drafts);
    run.clear();
  };
  const bool assistant = engine_.has_drafter();
  for (int64_t i = 0; i < n; ++i) {
    const Row& row = rows_[i];
    const int64_t limit = row.decoding() && row.draft_length > 0
                              ? std::min({row.draft_length, room, row.budget - row.sampled - 1})
                              : 0;
    if (assistant && limit > 0) {
      run.push_back(limit);
      continue;
    }
    end_run(i);
    if (!assistant && limit > 0) {
      drafts[i] = lookup_draft(row.request->prompt, row.output->result().tokens,
                               row.request->options.draft, limit);
    }
  }
  end_run(n);
  if (std::all_of(drafts.begin(), drafts.end(), [](const auto& d) { return d.empty(); })) {
    drafts.clear();
  }
  return drafts;
}

void Batch::assistant_drafts(int64_t lo, const std::vector<int64_t>& limits,
                             std::vector<std::vector<int64_t>>& drafts) {
  const auto count = static_cast<int64_t>(limits.size());
  std::vector<at::Tensor> tokens, hidden;
  std::vector<int64_t> positions;
  for (int64_t b = 0; b < count; ++b) {
    const Row& row = rows_[lo + b];
    tokens.push_back(row.token);
    hidden.push_back(row.hidden);
    positions.push_back(row.position);
  }
  auto rings = rings_.rows(lo, count);
  const auto guessed =
      engine_.draft(rings, at::cat(tokens), at::cat(hidden), positions,
                    *std::max_element(limits.begin(), limits.end()));
  for (int64_t b = 0; b < count; ++b) {
    const auto* ids = guessed[b].data_ptr<int64_t>();
    drafts[lo + b].assign(ids, ids + limits[b]);
  }
}

int64_t Batch::check_drafts(int64_t n, const std::vector<std::vector<int64_t>>& drafts,
                            std::vector<int64_t>& finished) {
  RECORD_USER_SCOPE("engine::draft");
  int64_t T = 1;
  for (int64_t i = 0; i < n; ++i) {
    const Row& row = rows_[i];
    if (!row.decoding()) continue;
    T = std::max(T, 1 + (fixed_shape_ ? row.draft_room : static_cast<int64_t>(drafts[i].size())));
  }
  std::vector<int64_t> ids(n * T, 0), positions(n * T), lengths(n, 0);
  std::vector<RingEntries> saved(n);
  for (int64_t i = 0; i < n; ++i) {
    const Row& row = rows_[i];
    for (int64_t j = 0; j < T; ++j) positions[i * T + j] = row.position + j;
    if (!row.decoding()) continue;
    const auto& draft = drafts[i];
    ids[i * T] = row.token_id;
    std::copy(draft.begin(), draft.end(), ids.begin() + i * T + 1);
    lengths[i] = 1 + static_cast<int64_t>(draft.size());
    if (!draft.empty()) {
      saved[i] = rings_.rows(i, 1).save(row.position + 1, row.position + lengths[i]);
    }
  }
  const auto device = engine_.options().device;
  auto rings = rings_.rows(0, n);
  at::Tensor hidden;
  const auto logits = engine_.model().forward(
      long_tensor(ids, {n, T}, device), long_tensor(positions, {n, T}, device), &rings,
      /*last_only=*/false, /*no_logits=*/false, /*soft=*/nullptr,
      long_tensor(lengths, {n}, device), keep_hidden(hidden), lora_rows(0, n));
  int64_t taken = 0;
  for (int64_t i = 0; i < n; ++i) {
    Row& row = rows_[i];
    if (!row.decoding()) continue;
    const auto& draft = drafts[i];
    const auto count = static_cast<int64_t>(draft.size());
    const int64_t fed = row.position;
    int64_t kept = 0;
    const char* reason = nullptr;
    for (int64_t j = 0; j <= count; ++j) {
      const auto at_j = logits[i][j];
      before_sampling(row, i, at_j);
      row.token = sampler_.next(at_j.view({1, -1}), i);
      const auto id = row.token.item<int64_t>();
      reason = take(row, id);
      if (reason || j == count || id != draft[j]) break;
      ++kept;
    }
    taken += kept + 1;
    row.fed.push_back(ids[i * T]);
    row.fed.insert(row.fed.end(), draft.begin(), draft.begin() + kept);
    row.position = fed + 1 + kept;
    if (hidden.defined()) row.hidden = hidden.narrow(0, i, 1).narrow(1, kept, 1);
    if (count > 0) {
      rings_.rows(i, 1).restore(saved[i], row.position);
      row.drafted += count;
      row.accepted += kept;
      row.draft_length = next_draft_length(row.draft_length, row.draft_room, kept == count);
    }
    // After the rings are whole again: a finished row's state goes to the prefix cache.
    if (reason) finish(row, i, reason, finished);
  }
  return taken;
}

std::vector<int64_t> Batch::step() {
  c10::InferenceMode inference;
  ++steps_;
  std::vector<int64_t> finished;
  for (const int64_t id : std::exchange(cancels_, {})) {
    for (auto& row : rows_) {
      if (row.request && row.request->id == id) {
        finish(row, &row - rows_.data(), "cancelled", finished);
      }
    }
    const auto queued =
        std::find_if(queue_.begin(), queue_.end(), [&](const Request& r) { return r.id == id; });
    if (queued != queue_.end()) {
      DecodeResult result;
      result.finish = "cancelled";
      result.prompt_tokens = static_cast<int64_t>(queued->prompt.size());
      results_[id] = std::move(result);
      finished.push_back(id);
      queue_.erase(queued);
    }
  }
  std::vector<int64_t> wanted;
  for (const auto& request : queue_) wanted.push_back(request.options.row);
  const auto placed = place_in_rows(wanted, free_rows());
  std::deque<Request> waiting;
  for (size_t k = 0; k < placed.size(); ++k) {
    if (placed[k] < 0) {
      waiting.push_back(std::move(queue_[k]));
    } else {
      admit(rows_[placed[k]], placed[k], std::move(queue_[k]));
    }
  }
  queue_ = std::move(waiting);

  // Prompt chunks take what the decoding rows leave of the budget, the oldest sequence first.
  // While no row decodes, no one waits on the step: it reads a whole prefill chunk at least.
  const auto decoding =
      std::count_if(rows_.begin(), rows_.end(), [](const Row& r) { return r.decoding(); });
  int64_t budget = decoding > 0
                       ? options_.step_tokens - decoding
                       : std::max(options_.step_tokens, engine_.options().prefill_chunk);
  std::vector<int64_t> reading;
  for (int64_t i = 0; i < options_.rows; ++i) {
    if (rows_[i].request && !rows_[i].decoding()) reading.push_back(i);
  }
  std::sort(reading.begin(), reading.end(),
            [&](int64_t a, int64_t b) { return rows_[a].request->id < rows_[b].request->id; });
  reading = start_or_wait(reading);
  for (int64_t used; budget > 0 && (used = read_together(reading, budget, finished)) > 0;) {
    budget -= used;
  }
  for (const int64_t i : reading) {
    while (budget > 0 && rows_[i].request && !rows_[i].decoding()) {
      budget -= read_chunk(rows_[i], i, budget, finished);
    }
  }
  decode_rows(finished);
  return finished;
}

}  // namespace torchtpu
