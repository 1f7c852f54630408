// The generation pipeline: a request's prompt and jobs, their tokens on the engine thread, and
// the answers of the chat, completions, Responses, Messages, Ollama and audio routes.
#include "server/server_internal.h"

#include <algorithm>
#include <deque>
#include <string_view>

#include "common/utf8.h"
#include "io/config.h"
#include "server/anthropic.h"
#include "server/media_load.h"
#include "server/stop_strings.h"
#include "server/transcription.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"

namespace torchtpu::server {

// What the engine thread hands the HTTP thread: text parts, the logprobs of the tokens they came
// from, and a warning for output the parser could not read (returned as content).
struct Piece : OutputDelta {
  std::vector<TokenLogprob> logprobs;
  // The prompt's tokens after its first, scored (Job::prompt_top()), with the first tokens' piece.
  std::vector<TokenLogprob> prompt_logprobs;
  std::string warning;
  bool empty() const {
    return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty() &&
           prompt_logprobs.empty() && warning.empty();
  }
};

// Where the engine thread leaves a request's output for its HTTP thread: one per request, shared
// by its choices' jobs, so that thread can wait for whichever choice has something.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<bool> cancel_counted{false};  // the request's cancel is in the metrics
};

// One sequence of a generation request (one of its `n` choices), shared by the HTTP thread that
// answers it and the engine thread.
struct Job {
  // Set before the job is queued, read-only afterwards.
  std::vector<int64_t> prompt;  // placeholders expanded: one id per soft token of each medium
  std::vector<Media> media;     // in the order of their soft tokens in the prompt
  DecodeOptions decode;
  std::vector<std::string> stop;
  bool parse_output = false;  // chat: split reasoning and tool calls out of the content
  // Text already in the prompt that the output continues (tool_choice "required" or a named
  // function prefill the call's opening), fed to the parser first.
  std::string parser_prefix;
  std::set<std::string> callable;  // GenerationRequest's
  bool one_call = false;  // parallel_tool_calls false: the first call is kept, later ones dropped
  int64_t top_logprobs = -1;                   // -1: no logprobs
  // Completions' echo: the prompt's text, which the answer's text starts with.
  std::optional<std::string> echo;
  // false (max_tokens 0 with echo): the one token the engine decodes is dropped, so the answer is
  // the prompt alone, ending for its "length".
  bool generates = true;
  int64_t prompt_logprobs = -1;  // vLLM's prompt_logprobs: alternatives per token; -1: none
  // A later choice of an answer whose prompt is scored: choice 0 scores it and this one shows its
  // entries (answer_whole; streamed, stream_response holds this choice's chunks until choice 0's
  // first has gone), reading the prompt as any sequence does.
  bool shares_prompt_scores = false;
  std::optional<std::vector<int64_t>> forced;  // the test hook's tokens
  int fd = -1;                                 // the client's connection, watched for disconnects
  int64_t choice = 0;  // its index among its prompt's choices (completions may list prompts)
  Clock::time_point queued_at = Clock::now();
  int64_t ticket = -1;  // the scheduler's, set once submitted

  std::atomic<bool> cancelled{false};  // the client went away

  std::shared_ptr<Mailbox> box = std::make_shared<Mailbox>();  // guards what follows
  Piece pending;  // produced and not yet taken by the HTTP thread
  bool done = false;
  bool reported = false;  // the HTTP thread took its end (take)
  std::string finish;         // stop | length | tool_calls | cancelled
  std::string stop_sequence;  // the stop sequence that ended it, "" for none
  DecodeResult result;
  double queue_s = 0;
  std::optional<ApiError> error;

  // Alternatives scored per prompt token (for echo's logprobs and prompt_logprobs, the larger);
  // -1: the prompt is not scored.
  int64_t prompt_top() const {
    return std::max(echo && top_logprobs >= 0 ? top_logprobs : int64_t{-1}, prompt_logprobs);
  }

  bool client_gone() {
    if (!cancelled && peer_closed(fd)) cancelled = true;
    return cancelled;
  }

  // Choice `index` of the same request: the same prompt and settings and the same mailbox, and
  // with a seed, the seed plus `index`, so each choice draws its own tokens and a choice can be
  // reproduced alone. A constraint steps through one sequence, so the sibling takes a fresh one
  // of the same grammar (none when this job has none).
  std::shared_ptr<Job> sibling(int64_t index, std::shared_ptr<Constraint> constraint) const {
    auto job = std::make_shared<Job>();
    job->prompt = prompt;
    job->media = media;
    job->decode = decode;
    job->decode.constraint = std::move(constraint);
    if (decode.sampling.seed) job->decode.sampling.seed = *decode.sampling.seed + index;
    job->stop = stop;
    job->parse_output = parse_output;
    job->parser_prefix = parser_prefix;
    job->callable = callable;
    job->one_call = one_call;
    job->top_logprobs = top_logprobs;
    job->echo = echo;
    job->generates = generates;
    job->prompt_logprobs = prompt_logprobs;
    job->forced = forced;
    job->fd = fd;
    job->choice = index;
    job->box = box;
    return job;
  }
};

struct Taken {
  size_t choice = 0;  // which of the request's jobs
  Piece delta;
  bool done = false;
};

// Counts one generation request as active for as long as it lives.
class Active {
 public:
  Active(std::mutex& mutex, std::condition_variable& changed, int64_t& count)
      : mutex_(mutex), changed_(changed), count_(count) {
    std::lock_guard lock(mutex_);
    ++count_;
  }
  ~Active() {
    {
      std::lock_guard lock(mutex_);
      --count_;
    }
    changed_.notify_all();
  }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;

 private:
  std::mutex& mutex_;
  std::condition_variable& changed_;
  int64_t& count_;
};

namespace {

// A prompt past the context: the 400 context_length_exceeded of the OpenAI routes (which LiteLLM
// and LangChain key on), with the counts for a route that words it its own way.
struct PromptTooLong : ApiError {
  PromptTooLong(const std::string& message, const std::string& param, int64_t tokens,
                int64_t context)
      : ApiError(400, message, "invalid_request_error", param, "context_length_exceeded"),
        tokens(tokens),
        context(context) {}
  int64_t tokens;
  int64_t context;
};

// Where a chat prompt's turns begin that other prompts part from, for the prefix cache: the
// second turn, after the system prompt and tools that every conversation of a client starts with,
// and the last turn the client sent, which an edit or another question replaces. The generation
// prompt's own turn ends the prompt, where a state is saved anyway.
std::vector<int64_t> turn_reuse_points(const std::vector<int64_t>& prompt, int64_t turn_open) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] == turn_open) starts.push_back(static_cast<int64_t>(i));
  }
  if (!starts.empty()) starts.pop_back();
  std::vector<int64_t> points;
  if (starts.size() >= 2) points.push_back(starts[1]);
  if (starts.size() >= 3) points.push_back(starts.back());
  return points;
}

void append(OutputDelta& into, OutputDelta&& more) {
  into.content += more.content;
  into.reasoning += more.reasoning;
  for (auto& call : more.tool_calls) into.tool_calls.push_back(std::move(call));
}

void append(Piece& into, Piece&& more) {
  append(static_cast<OutputDelta&>(into), std::move(more));
  for (auto& lp : more.logprobs) into.logprobs.push_back(std::move(lp));
  for (auto& lp : more.prompt_logprobs) into.prompt_logprobs.push_back(std::move(lp));
  if (!more.warning.empty()) into.warning += (into.warning.empty() ? "" : " ") + more.warning;
}

// A job's output as the engine thread produces it: raw model text -> stop sequences cut ->
// (chat) reasoning and tool calls split out. Only the engine thread touches it.
class JobOutput {
 public:
  JobOutput(const Tokenizer& tokenizer, const Job& job)
      : detokenizer(tokenizer, /*show_special_tokens=*/true), stops(job.stop) {
    if (!job.parser_prefix.empty()) parser_.push(job.parser_prefix);
  }

  // The piece `kept`, text the stop sequences let through, adds to the answer; `last` after the
  // final text.
  Piece route(const Job& job, std::string kept, bool last, std::vector<TokenLogprob>&& logprobs) {
    if (last && !stops.stopped()) kept += stops.finish();
    Piece delta;
    delta.logprobs = std::move(logprobs);
    if (!job.parse_output) {
      delta.content = std::move(kept);
      return delta;
    }
    OutputDelta parsed = parser_.push(kept);
    if (last || stops.stopped()) append(parsed, parser_.finish());
    delta.content = std::move(parsed.content);
    delta.reasoning = std::move(parsed.reasoning);
    for (auto& call : parsed.tool_calls) {
      const bool allowed = job.callable.count(call.name) > 0;
      if (allowed && job.one_call && called) continue;
      if (allowed) {
        delta.tool_calls.push_back(std::move(call));
        called = true;
        continue;
      }
      refuse(delta, call.text,
             "the model called '" + call.name +
                 "', which is not among the functions this request lets it call (its tools, "
                 "as tool_choice allows them); the call is returned as text.");
    }
    const std::string unparsed = parser_.raw_unparsed();
    if (unparsed.size() > unparsed_seen_) {
      refuse(delta, unparsed.substr(unparsed_seen_),
             parser_.cut_off_call() && last
                 ? "the output ended inside a tool call; its text is returned as content."
                 : "the model's tool call could not be parsed; its text is returned as content.");
      unparsed_seen_ = unparsed.size();
    }
    return delta;
  }

  Detokenizer detokenizer;
  StopStrings stops;
  bool started = false;  // the job got a row
  bool called = false;   // a tool call was handed to the client
  // `text` of the output as the stop sequences let it through: never matched inside a tool call.
  std::string through_stops(std::string_view text) { return stops.push(text, in_call); }
  bool in_call = false;  // the output is inside <|tool_call> ... <tool_call|>
  // log_softmax rows of steps whose token has not reached the host yet, oldest first.
  std::deque<at::Tensor> logprob_rows;
  std::vector<TokenLogprob> prompt_logprobs;  // scored, not yet handed over
  size_t position = 0;  // tokens returned so far
  std::optional<Clock::time_point> last_tokens_at;  // when the engine last handed tokens over

 private:
  // A call the client cannot take is handed back as the text it was, with a warning.
  static void refuse(Piece& delta, const std::string& text, const std::string& why) {
    delta.content += text;
    delta.warning += (delta.warning.empty() ? "" : " ") + why;
  }

  OutputParser parser_;
  size_t unparsed_seen_ = 0;
};

}  // namespace

void Server::deliver(Job& job, Piece&& delta) {
  if (delta.empty()) return;
  {
    std::lock_guard lock(job.box->mutex);
    append(job.pending, std::move(delta));
  }
  job.box->changed.notify_all();
}

void Server::finish_job(Job& job, const std::string& finish, std::optional<ApiError> error) {
  if (finish == "cancelled" && !job.box->cancel_counted.exchange(true)) {
    metrics_.count_cancelled();  // once a request
  }
  {
    std::lock_guard lock(job.box->mutex);
    job.finish = finish;
    job.error = std::move(error);
    job.done = true;
  }
  job.box->changed.notify_all();
  std::lock_guard lock(live_mutex_);
  live_.erase(&job);
}

// One request's place in Server's LoRA counts: waiting from its submission, running from its
// row, counted out when it ends (before its caller hears, as the load gauges drop it), or when
// the scheduler lets its callbacks go without an end (a refused submission).
class Server::LoraUse {
 public:
  LoraUse(Server& server, const std::optional<std::map<std::string, double>>& scales)
      : server_(server) {
    if (scales) {
      for (const auto& [name, scale] : *scales) {
        if (scale != 0) adapters_.push_back(name);
      }
    } else {
      for (const auto& a : server.adapters()) {
        if (a.spec.scale != 0) adapters_.push_back(a.spec.name);
      }
    }
    count(server_.lora_waiting_, +1);
  }
  ~LoraUse() { end(); }
  LoraUse(const LoraUse&) = delete;
  LoraUse& operator=(const LoraUse&) = delete;
  void start() {
    count(server_.lora_waiting_, -1);
    count(server_.lora_running_, +1);
    started_ = true;
  }
  void end() {
    if (std::exchange(ended_, true)) return;
    count(started_ ? server_.lora_running_ : server_.lora_waiting_, -1);
  }

 private:
  void count(std::map<std::string, int64_t>& counts, int64_t step) {
    if (adapters_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(server_.lora_mutex_);
      for (const auto& name : adapters_) {
        if ((counts[name] += step) == 0) counts.erase(name);
      }
    }
    server_.lora_changed_.notify_all();
  }

  Server& server_;
  std::vector<std::string> adapters_;
  bool started_ = false, ended_ = false;
};

Submission Server::submission(const std::shared_ptr<Job>& job) {
  auto out = std::make_shared<JobOutput>(*tokenizer_, *job);
  Submission submission;
  submission.prompt = job->prompt;
  submission.media = job->media;
  submission.options = job->decode;
  auto lora = std::make_shared<LoraUse>(*this, job->decode.lora);
  submission.on_start = [job, out, lora] {
    out->started = true;
    lora->start();
    job->queue_s = seconds_between(job->queued_at, Clock::now());
  };
  if (job->top_logprobs >= 0) {
    submission.on_logits = [out](const at::Tensor& logits) {
      out->logprob_rows.push_back(at::log_softmax(logits.to(at::kFloat), 0));
    };
  }
  if (const int64_t top = job->prompt_top(); top >= 0 && !job->shares_prompt_scores) {
    submission.options.prompt_logits = [job, out, top](const at::Tensor& logits, int64_t first) {
      append_prompt_logprobs(logits, first, job->prompt, top, out->prompt_logprobs);
    };
  }
  submission.on_tokens = [this, job, out](const std::vector<int64_t>& batch) {
    const auto now = Clock::now();
    if (out->last_tokens_at) {
      metrics_.observe_inter_token_latency(seconds_between(*out->last_tokens_at, now));
    }
    out->last_tokens_at = now;
    std::string text;
    std::vector<TokenLogprob> logprobs;
    for (int64_t id : batch) {
      // A batch (read_every above 1, accepted drafts) may go on past a stop string's end: the
      // answer, its logprobs and its usage end there.
      if (!job->generates || out->stops.stopped()) break;
      if (job->forced) id = (*job->forced)[out->position];
      ++out->position;
      // Stop sequences match the answer's text, never inside a marker ("call" in <|tool_call>)
      // or a tool call: either would hand the client half of the markup as content.
      if (!special_[id]) {
        text += out->through_stops(out->detokenizer.push(id));
      } else if (job->parse_output && parser_markers_.count(id) > 0) {
        std::string piece = out->detokenizer.push(id);
        const std::string& marker = tokenizer_->id_to_token(id);
        const size_t before = piece.size() - std::min(piece.size(), marker.size());
        text += out->through_stops(std::string_view(piece).substr(0, before));
        text += out->stops.push(std::string_view(piece).substr(before), /*opaque=*/true);
        if (tool_call_tokens_ && id == tool_call_tokens_->open) out->in_call = true;
        if (tool_call_tokens_ && id == tool_call_tokens_->close) out->in_call = false;
      }
      if (job->top_logprobs < 0) continue;
      const at::Tensor row = std::move(out->logprob_rows.front());
      out->logprob_rows.pop_front();
      logprobs.push_back(token_logprob(row, id, job->top_logprobs, false));
    }
    Piece piece = out->route(*job, text, false, std::move(logprobs));
    piece.prompt_logprobs = std::move(out->prompt_logprobs);
    out->prompt_logprobs.clear();
    deliver(*job, std::move(piece));
    if (out->stops.stopped()) return false;
    return !job->client_gone();
  };
  submission.on_done = [this, job, out, lora](DecodeResult result, std::exception_ptr error) {
    lora->end();
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const ValueError& e) {
        finish_job(*job, "error", ApiError(400, e.what()));
      } catch (const std::exception& e) {
        finish_job(*job, "error", internal_error("the engine failed: ", e, "engine_error"));
      }
      return;
    }
    if (!out->started) {  // cancelled while it waited
      finish_job(*job, "cancelled");
      return;
    }
    auto& r = job->result = std::move(result);
    if (out->stops.stopped()) r.tokens.resize(std::min(r.tokens.size(), out->position));
    if (!job->generates) {
      r.tokens.clear();
      r.finish = "length";
    }
    if (job->forced) {
      const bool all = r.finish == "length" && r.tokens.size() == job->forced->size();
      r.tokens.assign(job->forced->begin(), job->forced->begin() + r.tokens.size());
      if (all) r.finish = "stop";
    }
    metrics_.count_tokens(r.prompt_tokens, static_cast<int64_t>(r.tokens.size()));
    metrics_.count_drafts(r.drafted, r.accepted);
    metrics_.observe_request({.queue_s = job->queue_s,
                              .prefill_s = r.read_s,
                              .decode_s = r.decode_s,
                              .e2e_s = seconds_between(job->queued_at, Clock::now()),
                              .tokens = static_cast<int64_t>(r.tokens.size())});
    std::string finish = r.finish;
    if (finish == "cancelled" && out->stops.stopped()) finish = "stop";
    job->stop_sequence = out->stops.matched();
    if (finish != "cancelled") {
      if (!out->stops.stopped()) {
        deliver(*job, out->route(*job, out->through_stops(out->detokenizer.finish()), true, {}));
      }
      if (finish == "stop" && out->called) finish = "tool_calls";
    }
    finish_job(*job, finish);
  };
  return submission;
}
void Server::enqueue(const Choices& jobs) {
  std::vector<Submission> submissions;
  for (const auto& job : jobs) {
    job->queued_at = Clock::now();
    submissions.push_back(submission(job));
  }
  // Known before they are submitted: one may end before submit() returns.
  {
    std::lock_guard lock(live_mutex_);
    for (const auto& job : jobs) live_[job.get()] = job;
  }
  try {
    const auto tickets = scheduler_.submit(std::move(submissions));
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i]->ticket = tickets[i];
  } catch (const QueueFull& e) {
    std::lock_guard lock(live_mutex_);
    for (const auto& job : jobs) live_.erase(job.get());
    throw ApiError(429,
                   std::string("the server is busy: ") + e.what() + "; retry later (--max-queue)",
                   "rate_limit_error", "", "queue_full");
  }
}

void Server::abandon(const Choices& jobs) {
  for (const auto& job : jobs) {
    {
      std::lock_guard lock(job->box->mutex);
      if (job->done) continue;
    }
    job->cancelled = true;
    scheduler_.cancel(job->ticket);
  }
}

void Server::abandon_all() {
  abandoned_all_ = true;
  Choices jobs;
  {
    std::lock_guard lock(live_mutex_);
    for (const auto& [key, job] : live_) {
      if (auto held = job.lock()) jobs.push_back(std::move(held));
    }
  }
  abandon(jobs);
}

void Server::throw_cancelled() const {
  if (abandoned_all_) {
    throw ApiError(503,
                   "the server is stopping: a second stop cancelled the requests still being "
                   "answered",
                   "server_error", "", "shutting_down");
  }
  throw ApiError(499,
                 "the client closed the connection before its answer was complete (one that "
                 "only shuts down its sending side is taken as gone too)",
                 "invalid_request_error", "", "client_closed_request");
}

void Server::wait_done(Job& job) {
  std::unique_lock lock(job.box->mutex);
  job.box->changed.wait(lock, [&] { return job.done; });
}

Taken Server::take(const Choices& jobs, size_t from, const std::function<bool(size_t)>& held) {
  Mailbox& box = *jobs.front()->box;
  std::unique_lock lock(box.mutex);
  std::optional<size_t> ready;
  auto find = [&] {
    for (size_t k = 0; k < jobs.size() && !ready; ++k) {
      const size_t i = (from + k) % jobs.size();
      if (held && held(i)) continue;
      const Job& job = *jobs[i];
      if (!job.pending.empty() || (job.done && !job.reported)) ready = i;
    }
    return ready.has_value();
  };
  while (!box.changed.wait_for(lock, std::chrono::milliseconds(50), find)) {
    const Job& first = *jobs.front();
    if (!first.cancelled && peer_closed(first.fd)) {
      lock.unlock();
      abandon(jobs);
      lock.lock();
    }
  }
  Job& job = *jobs[*ready];
  Taken taken{*ready, std::exchange(job.pending, {}), job.done};
  job.reported = job.done;
  return taken;
}

ojson Server::timings_json(const Job& job) const {
  const auto& r = job.result;
  ojson t = {{"queue_s", job.queue_s}, {"read_s", r.read_s}, {"decode_s", r.decode_s}};
  t["decode_tokens_per_second"] = r.tokens.size() > 1 && r.decode_s > 0
                                      ? ojson(static_cast<double>(r.tokens.size() - 1) / r.decode_s)
                                      : ojson(nullptr);
  // llama-server's names for the draft tokens checked and kept.
  if (job.decode.draft.tokens > 0) {
    t["draft_n"] = r.drafted;
    t["draft_n_accepted"] = r.accepted;
  }
  return t;
}

namespace {

// The token's text, where bytes that are not whole UTF-8 characters show as U+FFFD as in
// OpenAI's answers, and its exact bytes (a byte token's own byte), which joined rebuild the text.
ojson token_entry(const Tokenizer& tokenizer, int64_t id, double logprob) {
  const std::string bytes = tokenizer.token_bytes(id);
  return {{"token", tokenizer.decode({id})},
          {"logprob", logprob},
          {"bytes", std::vector<uint8_t>(bytes.begin(), bytes.end())}};
}

}  // namespace

ojson Server::chat_logprobs_json(const std::vector<TokenLogprob>& entries) const {
  ojson content = ojson::array();
  for (const auto& e : entries) {
    ojson entry = token_entry(*tokenizer_, e.id, e.logprob);
    entry["top_logprobs"] = ojson::array();
    for (const auto& [id, logprob] : e.top) {
      entry["top_logprobs"].push_back(token_entry(*tokenizer_, id, logprob));
    }
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

ojson Server::completion_logprobs_json(const Job& job, const Piece& piece, bool echo,
                                       size_t& offset) const {
  ojson out = {{"tokens", ojson::array()},
               {"token_logprobs", ojson::array()},
               {"top_logprobs", ojson::array()},
               {"text_offset", ojson::array()}};
  // `e` null: the prompt's first token.
  auto add = [&](int64_t token, const TokenLogprob* e) {
    const std::string text = tokenizer_->decode({token});
    out["tokens"].push_back(text);
    // In characters of `text`, as OpenAI and vLLM count them.
    out["text_offset"].push_back(offset);
    offset += special_[token] ? 0 : utf8_characters(tokenizer_->token_bytes(token));
    if (!e) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      return;
    }
    out["token_logprobs"].push_back(e->logprob);
    ojson top = ojson::object();
    // A prompt token's alternatives may be more, for prompt_logprobs: the request's are the best.
    const auto shown = std::min<size_t>(e->top.size(), job.top_logprobs);
    for (size_t i = 0; i < shown; ++i) {
      top[tokenizer_->decode({e->top[i].first})] = e->top[i].second;
    }
    out["top_logprobs"].push_back(std::move(top));
  };
  if (echo) {
    add(job.prompt.front(), nullptr);
    for (const auto& e : piece.prompt_logprobs) add(e.id, &e);
  }
  for (const auto& e : piece.logprobs) add(e.id, &e);
  return out;
}

ojson Server::prompt_logprobs_json(const Job& job, const std::vector<TokenLogprob>& entries) const {
  auto entry = [&](int64_t id, double logprob, int64_t rank) {
    return ojson{{"logprob", logprob}, {"rank", rank}, {"decoded_token", tokenizer_->decode({id})}};
  };
  ojson out = ojson::array({nullptr});
  for (const auto& e : entries) {
    ojson tokens = ojson::object();
    tokens[std::to_string(e.id)] = entry(e.id, e.logprob, e.rank);
    const auto shown = std::min<size_t>(e.top.size(), job.prompt_logprobs);
    for (size_t i = 0; i < shown; ++i) {
      const auto& [id, logprob] = e.top[i];
      tokens[std::to_string(id)] = entry(id, logprob, static_cast<int64_t>(i) + 1);
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

ojson Server::completion_json(const std::string& id, const char* object, int64_t created,
                              ojson choices) const {
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", model_id_},
          {"system_fingerprint", fingerprint_},
          {"choices", std::move(choices)}};
}

namespace {

ojson tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    out.push_back(
        {{"index", first_index + i},
         {"id", new_completion_id("call_")},
         {"type", "function"},
         {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}}}});
  }
  return out;
}

// The usage of a request's choices: each prompt once (as its first choice found it in the prefix
// cache), the tokens of every choice.
ojson choices_usage(const Choices& jobs) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& job : jobs) {
    completion += static_cast<int64_t>(job->result.tokens.size());
    if (job->choice > 0) continue;
    prompt += job->result.prompt_tokens;
    cached += job->result.cached_tokens;
  }
  return usage_json(prompt, completion, cached);
}

}  // namespace

void Server::answer_whole(httplib::Response& res, const Choices& jobs, bool chat) {
  std::vector<Piece> all(jobs.size());
  for (size_t left = jobs.size(); left > 0;) {
    Taken taken = take(jobs);
    append(all[taken.choice], std::move(taken.delta));
    if (taken.done) --left;
  }
  for (const auto& job : jobs) {
    if (job->error) throw *job->error;
  }
  for (const auto& job : jobs) {
    if (job->finish == "cancelled") throw_cancelled();
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i]->shares_prompt_scores) {
      all[i].prompt_logprobs = all[i - jobs[i]->choice].prompt_logprobs;
    }
  }
  ojson choices = ojson::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = *jobs[i];
    const Piece& piece = all[i];
    ojson choice = {{"index", i}};
    if (chat) {
      ojson message = {{"role", "assistant"}};
      message["content"] = piece.content.empty() && !piece.tool_calls.empty()
                               ? ojson(nullptr)
                               : ojson(piece.content);
      if (!piece.reasoning.empty()) message["reasoning_content"] = piece.reasoning;
      if (!piece.tool_calls.empty()) message["tool_calls"] = tool_calls_json(piece.tool_calls, 0);
      choice["message"] = std::move(message);
      choice["logprobs"] =
          job.top_logprobs >= 0 ? chat_logprobs_json(piece.logprobs) : ojson(nullptr);
    } else {
      size_t offset = 0;
      choice["text"] = job.echo.value_or("") + piece.content;
      choice["logprobs"] = job.top_logprobs >= 0
                               ? completion_logprobs_json(job, piece, job.echo.has_value(), offset)
                               : ojson(nullptr);
      if (job.prompt_logprobs >= 0) {
        choice["prompt_logprobs"] = prompt_logprobs_json(job, piece.prompt_logprobs);
      }
    }
    choice["finish_reason"] = job.finish;
    if (!piece.warning.empty()) choice["warning"] = piece.warning;
    choices.push_back(std::move(choice));
  }
  ojson body = completion_json(new_completion_id(chat ? "chatcmpl-" : "cmpl-"),
                               chat ? "chat.completion" : "text_completion", unix_seconds(),
                               std::move(choices));
  // vLLM puts chat's prompt_logprobs beside the choices, since they share the prompt.
  if (chat && jobs.front()->prompt_logprobs >= 0) {
    body["prompt_logprobs"] = prompt_logprobs_json(*jobs.front(), all.front().prompt_logprobs);
  }
  body["usage"] = choices_usage(jobs);
  body["timings"] = timings_json(*jobs.front());
  res.set_content(dump(body), "application/json");
}

void Server::stream_response(httplib::Response& res, Choices jobs, bool chat, bool include_usage,
                             std::shared_ptr<Active> active) {
  struct Choice {
    size_t tool_calls = 0;
    size_t text_offset = 0;  // completions' logprobs
    bool echoed = false;     // completions' echo: the prompt went out
  };
  struct Stream {
    std::string id;
    int64_t created;
    bool started = false;
    std::vector<Choice> choices;
    size_t ended = 0;  // choices whose last chunk went out
    size_t next = 0;   // the choice take() looks at first, so no choice starves the others
    // Choice 0's prompt entries, once its first piece is taken, for the choices that share them.
    std::optional<std::vector<TokenLogprob>> prompt_scores;
  };
  auto s = std::make_shared<Stream>(Stream{new_completion_id(chat ? "chatcmpl-" : "cmpl-"),
                                           unix_seconds(), false,
                                           std::vector<Choice>(jobs.size())});
  // Every chunk of one completion carries the same id, created, model and fingerprint.
  auto chunk = [this, s, chat, include_usage](ojson choice) {
    ojson c = completion_json(s->id, chat ? "chat.completion.chunk" : "text_completion", s->created,
                              ojson::array({std::move(choice)}));
    if (include_usage) c["usage"] = nullptr;
    return c;
  };
  auto choice = [chat](size_t index, ojson delta_or_text, const ojson& finish) {
    ojson c = {{"index", index}};
    if (chat) {
      c["delta"] = std::move(delta_or_text);
    } else {
      c["text"] = std::move(delta_or_text);
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = finish;
    return c;
  };
  stream_events(
      res, "text/event-stream", jobs, std::move(active),
      [this, jobs, s, chat, include_usage, chunk, choice](std::string& out) {
        auto event = [&](const ojson& j) { out += "data: " + dump(j) + "\n\n"; };
        if (!s->started) {
          s->started = true;
          for (size_t i = 0; chat && i < jobs.size(); ++i) {
            event(chunk(choice(i, {{"role", "assistant"}, {"content", ""}}, nullptr)));
          }
        }
        Taken taken = take(jobs, s->next, [&](size_t i) {
          return jobs[i]->shares_prompt_scores && !s->prompt_scores;
        });
        s->next = (taken.choice + 1) % jobs.size();
        const size_t i = taken.choice;
        const Job& job = *jobs[i];
        Choice& state = s->choices[i];
        // Choice 0's first piece holds its prompt's entries: it is taken after the whole prompt
        // was read.
        if (i == 0 && !s->prompt_scores) s->prompt_scores = taken.delta.prompt_logprobs;
        if (job.shares_prompt_scores && !state.echoed) {
          taken.delta.prompt_logprobs = *s->prompt_scores;
        }
        const Piece& d = taken.delta;
        // A choice's first chunk echoes the prompt (completions asked to), before its text.
        const bool echo = job.echo && !std::exchange(state.echoed, true);
        // The logprobs of this piece's tokens ride on its first chunk (on a chunk of their own when
        // the text is still held back by the parser or the stop strings), the warning likewise.
        ojson logprobs = nullptr;
        if (job.top_logprobs >= 0 && (!d.logprobs.empty() || echo)) {
          logprobs = chat ? chat_logprobs_json(d.logprobs)
                          : completion_logprobs_json(job, d, echo, state.text_offset);
        }
        auto send = [&](ojson delta_or_text) {
          ojson c = choice(i, std::move(delta_or_text), nullptr);
          c["logprobs"] = std::move(logprobs);
          logprobs = nullptr;
          if (!d.warning.empty() && d.content.size() > 0 &&
              (chat ? c["delta"].contains("content") : true)) {
            c["warning"] = d.warning;
          }
          event(chunk(std::move(c)));
        };
        if (chat) {
          if (!d.reasoning.empty()) send({{"reasoning_content", d.reasoning}});
          if (!d.content.empty()) send({{"content", d.content}});
          if (!d.tool_calls.empty()) {
            send({{"tool_calls", tool_calls_json(d.tool_calls, state.tool_calls)}});
            state.tool_calls += d.tool_calls.size();
          }
          if (!logprobs.is_null()) send(ojson::object());
        } else if (const std::string text = (echo ? *job.echo : "") + d.content;
                   !text.empty() || !logprobs.is_null()) {
          send(text);
        }
        bool over = false;
        if (taken.done) {
          if (job.finish == "cancelled") {
            abandon(jobs);
            return StreamStep::kCut;
          }
          if (job.error) {
            // One choice failing ends the response: the stream has no error of a single choice.
            abandon(jobs);
            event(error_body(*job.error));
            over = true;
          } else {
            ojson last = chunk(choice(i, chat ? ojson::object() : ojson(""), job.finish));
            last["timings"] = timings_json(job);
            event(last);
            over = ++s->ended == jobs.size();
            if (over && include_usage) {
              ojson usage = chunk(nullptr);
              usage["choices"] = ojson::array();
              usage["usage"] = choices_usage(jobs);
              event(usage);
            }
          }
          if (over) out += "data: [DONE]\n\n";
        }
        return over ? StreamStep::kEnd : StreamStep::kMore;
      });
}

void Server::stream_events(httplib::Response& res, const std::string& content_type,
                           const Choices& jobs, std::shared_ptr<Active> active,
                           std::function<StreamStep(std::string&)> next) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      content_type,
      [this, jobs, next = std::move(next)](size_t, httplib::DataSink& sink) {
        std::string out;
        const StreamStep step = next(out);
        if (step == StreamStep::kCut) return false;
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          abandon(jobs);
          return false;
        }
        if (step == StreamStep::kEnd) sink.done();
        return true;
      },
      // Runs when the response ends, written or not: the engine must be done with the jobs (and
      // their socket) before the connection closes.
      [this, jobs, active](bool) {
        abandon(jobs);
        for (const auto& job : jobs) wait_done(*job);
      });
}

std::shared_ptr<Active> Server::admit() {
  auto active = std::make_shared<Active>(active_mutex_, active_changed_, active_);
  // Counted before this check, so shutdown either sees this request or it sees the shutdown.
  if (!takes_requests(state_)) {
    throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
  }
  return active;
}

std::string Server::render_chat(const GenerationRequest& r, std::string& parser_prefix) const {
  std::string prompt =
      template_->render(r.messages, r.tools, /*add_generation_prompt=*/true, r.template_kwargs);
  // After a tool response with thinking on, the template opens the reply's thinking channel
  // itself: the model continues inside it, so its output is parsed from the opening on. The
  // opening is the prompt's end (`<|channel>thought\n`); one in a message's text has the turn's
  // markup after it (`<turn|>`, `<tool_response|>`, every Gemma 4 marker holds "<|" or "|>").
  const size_t open = prompt.rfind(kChannelOpen);
  const bool thinking_open =
      open != std::string::npos &&
      prompt.find("<|", open + kChannelOpen.size()) == std::string::npos &&
      prompt.find("|>", open + kChannelOpen.size()) == std::string::npos;
  parser_prefix = thinking_open ? prompt.substr(open) : "";
  // "required" and a named function are honoured by writing the call's opening into the
  // prompt: the model can only continue it (thinking is skipped then, an open channel closed).
  std::string call;
  if (r.tool_choice == "required") call = "<|tool_call>call:";
  if (r.tool_choice == "function") call = "<|tool_call>call:" + r.tool_choice_function + "{";
  if (!call.empty()) {
    if (thinking_open) call = std::string(kChannelClose) + call;
    prompt += call;
    parser_prefix += call;
  }
  return prompt;
}

std::shared_ptr<Constraint> Server::constraint_for(const GenerationRequest& r, bool chat,
                                                   const std::string& parser_prefix) const {
  std::optional<Grammar> grammar;
  std::string param;
  const bool forced_call = r.tool_choice == "required" || r.tool_choice == "function";
  // allowed_tools (like a named function) leaves every tool in the prompt, so that a
  // conversation whose allowed set changes keeps its prefix cache, and holds the calls to the
  // ones it allows.
  const bool narrowed =
      r.tools.is_array() && !std::all_of(r.tools.begin(), r.tools.end(), [&](const ojson& tool) {
        return r.callable.contains(tool.at("function").at("name").get<std::string>());
      });
  if (chat && forced_call && tool_call_tokens_) {
    grammar = Grammar{GrammarKind::kLark,
                      tool_call_grammar(r.tools, r.callable, *tool_call_tokens_,
                                        r.tool_choice == "function" ? CallStart::kInsideArguments
                                                                    : CallStart::kAfterCallPrefix,
                                        !r.parallel_tool_calls)};
    param = "tools";
  } else if (r.response_format) {
    grammar = r.response_format;
    param = grammar->kind == GrammarKind::kJsonSchema ? "response_format.json_schema.schema"
                                                      : "response_format";
  } else if (chat && (options_.constrain_tools || narrowed) && r.tool_choice == "auto" &&
             !r.callable.empty() && tool_call_tokens_) {
    grammar = Grammar{GrammarKind::kLark, tool_call_grammar(r.tools, r.callable, *tool_call_tokens_,
                                                            CallStart::kReply)};
    param = "tools";
  }
  if (!grammar) return nullptr;
  if (r.ignore_eos) {
    throw ApiError(400,
                   "'ignore_eos' cannot be combined with '" + param +
                       "': the grammar decides where the output ends",
                   "invalid_request_error", "ignore_eos", "invalid_value");
  }
  // The reply may think first when thinking is on; a forced call's prompt skips thinking.
  std::optional<ThinkingMarkers> thinking;
  const auto enable = r.template_kwargs.find("enable_thinking");
  if (chat && !forced_call && enable != r.template_kwargs.end() && *enable == true) {
    thinking = thinking_markers_;
  }
  try {
    std::call_once(grammar_vocabulary_once_, [&] {
      grammar_vocabulary_ = std::make_shared<const GrammarVocabulary>(*tokenizer_, reply_end_ids_);
    });
    return std::make_shared<Constraint>(grammar_vocabulary_, *grammar, thinking,
                                        parser_prefix.starts_with(kChannelOpen));
  } catch (const ValueError& e) {
    throw ApiError(400, "'" + param + "' cannot be enforced: " + e.what(), "invalid_request_error",
                   param, "unsupported_schema");
  }
}

void Server::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto active = admit();
  const ojson body = parse_body(req.body);
  GenerationRequest r = chat ? parse_chat_request(body) : parse_completion_request(body);
  Choices jobs = chat ? start_jobs(r, true, "messages") : start_completions(r);
  if (r.stream) {
    stream_response(res, std::move(jobs), chat, r.include_usage, std::move(active));
  } else {
    answer_whole(res, jobs, chat);
  }
}

std::vector<Media> Server::read_media(const std::vector<MediaSource>& sources) const {
  std::vector<Media> media;
  const auto image_options = [this](int64_t tokens) { return engine_->image_options(tokens); };
  const auto gone = [fd = connection_socket()] { return peer_closed(fd); };
  for (const MediaPart& part : load_media(sources, options_.media, modalities_, image_options,
                                          engine_->audio_options(), image_decode_budget(), gone)) {
    media.push_back(part.kind == MediaKind::kImage ? image_media(part.patches)
                                                   : audio_media(part.audio));
  }
  return media;
}

std::vector<int64_t> Server::with_media(std::vector<int64_t> ids,
                                        const std::vector<Media>& media) const {
  const ModelConfig& config = engine_->config();
  for (const auto& [kind, token] : {std::pair{MediaKind::kImage, config.image_token_id},
                                    std::pair{MediaKind::kAudio, config.audio_token_id}}) {
    if (token < 0) continue;
    const auto markers = std::count(ids.begin(), ids.end(), token);
    const auto parts = std::count_if(media.begin(), media.end(),
                                     [kind = kind](const Media& m) { return m.kind == kind; });
    if (markers > parts) {
      const std::string marker = tokenizer_->id_to_token(token);
      const char* part = kind == MediaKind::kImage ? "image" : "audio";
      throw ValueError("the text holds " + marker + ", which marks an " + part + " part; " +
                       "a message cannot write it as text (" + std::to_string(markers) +
                       " in the prompt, " + std::to_string(parts) + " " + part + " parts)");
    }
  }
  return media.empty() ? ids : expand_media_placeholders(ids, media, config);
}

Server::ChatPrompt Server::chat_prompt(const GenerationRequest& r,
                                       std::vector<Media>& media) const {
  const auto encode = [&](const GenerationRequest& g, const std::vector<Media>& m) {
    ChatPrompt p;
    p.text = render_chat(g, p.parser_prefix);
    p.ids = with_media(tokenizer_->encode(p.text, /*add_special_tokens=*/false), m);
    return p;
  };
  ChatPrompt whole = encode(r, media);
  const int64_t room = std::max<int64_t>(r.max_tokens.value_or(1), 1);
  const auto fits = [&](const ChatPrompt& p) {
    return static_cast<int64_t>(p.ids.size()) + room <= options_.engine.context;
  };
  if (!r.drop_old_turns || fits(whole)) return whole;
  const ojson& messages = r.messages;
  const auto role = [&](size_t i) { return messages[i].value("role", ""); };
  size_t opening = 0;
  while (opening < messages.size() && (role(opening) == "system" || role(opening) == "developer")) {
    ++opening;
  }
  std::vector<size_t> cuts;  // the user turns a prompt may start at, leaving one turn out or more
  for (size_t i = opening + 1; i < messages.size(); ++i) {
    if (role(i) == "user") cuts.push_back(i);
  }
  if (cuts.empty()) return whole;
  // The media parts of messages [from, to), in the order `media` holds them.
  const auto media_in = [&](size_t from, size_t to) {
    int64_t n = 0;
    for (size_t i = from; i < to; ++i) {
      const ojson& content = messages[i].contains("content") ? messages[i]["content"] : ojson();
      if (!content.is_array()) continue;
      for (const auto& part : content) {
        n += part.is_object() &&
             (part.value("type", "") == "image" || part.value("type", "") == "audio");
      }
    }
    return n;
  };
  GenerationRequest g = r;
  g.media.clear();
  const int64_t first_dropped = media_in(0, opening);
  const auto cut_at = [&](size_t cut, std::vector<Media>& kept) {
    g.messages = ojson::array();
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i < opening || i >= cut) g.messages.push_back(messages[i]);
    }
    kept = media;
    kept.erase(kept.begin() + first_dropped, kept.begin() + first_dropped + media_in(opening, cut));
    return encode(g, kept);
  };
  // Fewer turns make a shorter prompt: the earliest cut that fits is a binary search away.
  size_t lo = 0, hi = cuts.size() - 1;
  std::vector<Media> kept;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (fits(cut_at(cuts[mid], kept))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  ChatPrompt cut = cut_at(cuts[lo], kept);
  media = std::move(kept);
  return cut;
}

void Server::check_room(int64_t sequences, const std::string& param,
                        const std::string& what) const {
  const int64_t room = options_.parallel + options_.max_queue;
  if (sequences > room) {
    throw ApiError(400,
                   what + ", but this server decodes " + std::to_string(options_.parallel) +
                       " sequences at once and queues " + std::to_string(options_.max_queue) +
                       " more (--parallel, --max-queue): at most " + std::to_string(room) +
                       " choices",
                   "invalid_request_error", param, "invalid_value");
  }
}

Choices Server::start_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param) {
  Choices jobs = prepare_jobs(r, chat, prompt_param);
  enqueue(jobs);
  return jobs;
}

Choices Server::start_completions(const GenerationRequest& r) {
  if (r.more_prompts.empty()) return start_jobs(r, false, "prompt");
  const auto prompts = static_cast<int64_t>(r.more_prompts.size()) + 1;
  check_room(prompts * r.n, "prompt",
             "'prompt' lists " + std::to_string(prompts) + " prompts of " + std::to_string(r.n) +
                 " choices each ('n')");
  GenerationRequest one = r;
  one.more_prompts.clear();
  Choices jobs = prepare_jobs(one, false, at_index("prompt", 0));
  for (size_t i = 0; i < r.more_prompts.size(); ++i) {
    one.prompt = r.more_prompts[i].text;
    one.prompt_ids = r.more_prompts[i].ids;
    for (auto& job : prepare_jobs(one, false, at_index("prompt", i + 1), jobs.front()->box)) {
      jobs.push_back(std::move(job));
    }
  }
  enqueue(jobs);
  return jobs;
}

Choices Server::prepare_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param,
                             std::shared_ptr<Mailbox> box) {
  check_model(r.model);
  check_room(r.n, "n", "'n' is " + std::to_string(r.n));
  if (r.id_slot >= options_.parallel) {
    throw ApiError(400,
                   "'id_slot' " + std::to_string(r.id_slot) + " does not exist: the slots are 0 "
                       "to " + std::to_string(options_.parallel - 1) + " (--parallel)",
                   "invalid_request_error", "id_slot", "invalid_value");
  }
  if (r.id_slot >= 0 && r.n > 1) {
    throw ApiError(400, "'id_slot' runs one sequence in one slot: 'n' must be 1 with it, got " +
                            std::to_string(r.n),
                   "invalid_request_error", "n", "invalid_value");
  }
  auto job = std::make_shared<Job>();
  if (box) job->box = std::move(box);
  job->media = read_media(r.media);
  std::string rendered = r.prompt;
  try {
    if (chat) {
      ChatPrompt p = chat_prompt(r, job->media);
      rendered = std::move(p.text);
      job->prompt = std::move(p.ids);
      job->parser_prefix = std::move(p.parser_prefix);
    } else if (r.prompt_ids) {
      job->prompt = *r.prompt_ids;
    } else {
      // A prompt already opening with the BOS token (one /apply-template rendered, Ollama's raw
      // prompts) gets no second one: Gemma reads a doubled BOS as text it never saw in training.
      const int64_t bos = engine_->config().bos_token_id;
      const bool has_bos = bos >= 0 && r.prompt.rfind(tokenizer_->decode({bos}), 0) == 0;
      job->prompt = tokenizer_->encode(r.prompt, /*add_special_tokens=*/!has_bos);
    }
    if (!chat) job->prompt = with_media(std::move(job->prompt), job->media);
    engine_->check_prompt(job->prompt, job->media);
  } catch (const ValueError& e) {
    const auto tokens = static_cast<int64_t>(job->prompt.size());
    if (tokens > options_.engine.context) {
      throw PromptTooLong(e.what(), prompt_param, tokens, options_.engine.context);
    }
    throw ApiError(400, e.what(), "invalid_request_error", prompt_param, "invalid_value");
  }
  job->decode.max_new = r.max_tokens.value_or(options_.engine.context);
  if (job->decode.max_new == 0) {
    job->generates = false;
    job->decode.max_new = 1;  // the engine reads a prompt for its next token
  }
  job->decode.read_every = options_.read_every;
  job->decode.draft = options_.draft;
  job->decode.draft.tokens = r.draft_max.value_or(options_.draft.tokens);
  job->decode.cache_salt = r.cache_salt;
  job->decode.row = r.id_slot;
  job->decode.lora = lora_for(r);
  job->decode.ignore_eos = r.ignore_eos;
  job->decode.stop_ids = reply_end_ids_;
  job->decode.constraint = constraint_for(r, chat, job->parser_prefix);
  if (const int64_t thinking = r.thinking_budget.value_or(options_.reasoning_budget);
      thinking >= 0 && thinking_markers_) {
    job->decode.thinking_budget =
        ThinkingBudget{thinking, *thinking_markers_, reasoning_budget_message_};
  }
  job->decode.sampling =
      sampling_params(r.sampling, generation_defaults_, engine_->config().vocab_size);
  if (chat && turn_open_) job->decode.reuse_points = turn_reuse_points(job->prompt, *turn_open_);
  job->stop = r.stop;
  job->parse_output = chat;
  job->callable = r.callable;
  job->one_call = !r.parallel_tool_calls;
  if (r.logprobs) job->top_logprobs = r.top_logprobs;
  if (r.echo) {
    std::vector<int64_t> shown;  // the prompt as completions show text: special tokens left out
    for (const int64_t id : job->prompt) {
      if (!special_[id]) shown.push_back(id);
    }
    job->echo = tokenizer_->decode(shown);
  }
  job->prompt_logprobs = r.prompt_logprobs.value_or(-1);
  for (const auto& rule : forced_outputs_) {
    if (rendered.find(rule.prompt_contains) == std::string::npos) continue;
    job->forced = tokenizer_->encode(rule.output, /*add_special_tokens=*/false);
    if (job->forced->empty()) throw ApiError(500, "TORCHTPU_TEST_FORCED_OUTPUT: empty output");
    job->decode.max_new = std::min<int64_t>(job->decode.max_new, job->forced->size());
    job->decode.ignore_eos = true;
    job->decode.constraint.reset();  // the rule's output replaces whatever the grammar allowed
    break;
  }
  job->fd = connection_socket();
  Choices jobs{job};
  for (int64_t i = 1; i < r.n; ++i) {
    jobs.push_back(job->sibling(
        i, job->decode.constraint ? constraint_for(r, chat, job->parser_prefix) : nullptr));
    jobs.back()->shares_prompt_scores = job->prompt_top() >= 0;
  }
  return jobs;
}

GenerationOutcome Server::outcome(const Choices& jobs, const std::string& reasoning) const {
  const Job& last = *jobs.back();
  GenerationOutcome out{last.finish, last.stop_sequence};
  out.context_full = last.finish == "length" && last.generates &&
                     static_cast<int64_t>(last.result.tokens.size()) < last.decode.max_new;
  for (const auto& job : jobs) {
    out.prompt_tokens += job->result.prompt_tokens;
    out.completion_tokens += static_cast<int64_t>(job->result.tokens.size());
    out.cached_tokens += job->result.cached_tokens;
    out.read_s += job->result.read_s;
    out.decode_s += job->result.decode_s;
  }
  out.reasoning_tokens = static_cast<int64_t>(tokenizer_->encode(reasoning, false).size());
  return out;
}

void Server::pass_logprobs(const Job& job, const Piece& piece, Renderer& renderer) const {
  if (job.top_logprobs >= 0 && !piece.logprobs.empty()) {
    renderer.logprobs(chat_logprobs_json(piece.logprobs)["content"]);
  }
}

void Server::answer_rendered(httplib::Response& res, Choices jobs,
                             std::shared_ptr<Renderer> renderer, bool stream,
                             std::shared_ptr<Active> active) {
  if (!stream) {
    renderer->start();
    std::string reasoning;
    for (const auto& job : jobs) {
      while (true) {
        Taken taken = take({job});
        reasoning += taken.delta.reasoning;
        pass_logprobs(*job, taken.delta, *renderer);
        renderer->add(taken.delta);
        if (taken.done) break;
      }
      if (job->error || job->finish == "cancelled") abandon(jobs);  // the pieces after it
      if (job->error) throw *job->error;
      if (job->finish == "cancelled") throw_cancelled();
    }
    renderer->finish(outcome(jobs, reasoning));
    res.set_content(dump(renderer->body()), "application/json");
    return;
  }
  struct Stream {
    bool started = false;
    size_t at = 0;  // the job being sent
    std::string reasoning;
  };
  auto s = std::make_shared<Stream>();
  stream_events(res, renderer->content_type(), jobs, std::move(active),
                [this, jobs, renderer, s](std::string& out) {
                  bool ended = false;
                  // The opening events go out at once, before the first token is decoded.
                  if (!s->started) {
                    s->started = true;
                    out = renderer->start();
                  } else {
                    const auto& job = jobs[s->at];
                    Taken taken = take({job});
                    s->reasoning += taken.delta.reasoning;
                    pass_logprobs(*job, taken.delta, *renderer);
                    out = renderer->add(taken.delta);
                    if (taken.done) {
                      if (job->finish == "cancelled") return StreamStep::kCut;
                      if (job->error) {
                        out += renderer->error(*job->error);
                        ended = true;
                      } else if (++s->at == jobs.size()) {
                        out += renderer->finish(outcome(jobs, s->reasoning));
                        ended = true;
                      }
                    }
                  }
                  return ended ? StreamStep::kEnd : StreamStep::kMore;
                });
}

void Server::handle_responses(const httplib::Request& req, httplib::Response& res) {
  auto active = admit();
  const ResponsesRequest r = parse_responses_request(parse_body(req.body), responses_);
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, true, "input").front();
  } catch (const ApiError& e) {
    throw as_responses_error(e);  // a text.format schema the grammar cannot enforce
  }
  answer_rendered(res, {job}, std::make_shared<ResponsesRenderer>(model_id_, r, &responses_),
                  r.generation.stream, std::move(active));
}

void Server::handle_messages(const httplib::Request& req, httplib::Response& res) {
  auto active = admit();
  const MessagesRequest r = parse_messages_request(parse_body(req.body));
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, true, "messages").front();
  } catch (const PromptTooLong& e) {
    // Anthropic's words, which Claude Code recognizes to compact the conversation.
    throw ApiError(400,
                   "prompt is too long: " + std::to_string(e.tokens) + " tokens > " +
                       std::to_string(e.context) + " maximum",
                   e.type, e.param, e.code);
  } catch (const ApiError& e) {
    throw as_messages_error(e);  // an output_config.format schema the grammar cannot enforce
  }
  const auto prompt_tokens = static_cast<int64_t>(job->prompt.size());
  answer_rendered(res, {job}, std::make_shared<MessagesRenderer>(model_id_, prompt_tokens, r),
                  r.generation.stream, std::move(active));
}

void Server::handle_ollama(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto received = Clock::now();
  const ojson body = parse_body(req.body);
  const OllamaRequest r = chat ? parse_ollama_chat(body) : parse_ollama_generate(body);
  check_model(server_model_name(r.model));  // a load request has no generation to name it
  // keep_alive holds from this request on: a load's at once, a generation's once its sequence is
  // queued (whose submission ends the one before), so a limit of 0 sleeps after the answer.
  if (r.load_only) {
    if (r.unload()) {
      scheduler_.sleep_when_idle();
    } else {
      scheduler_.wake_up();
    }
    scheduler_.keep_alive(r.keep_alive);
    res.set_content(dump(ollama_loaded(r)), "application/json");
    return;
  }
  auto active = admit();
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, r.templated, chat ? "messages" : "prompt").front();
  } catch (const ApiError& e) {
    throw as_ollama_error(e);  // a format schema the grammar cannot enforce
  }
  scheduler_.keep_alive(r.keep_alive);
  answer_rendered(res, {job}, std::make_shared<OllamaRenderer>(r, received), r.generation.stream,
                  std::move(active));
}

void Server::handle_transcription(const httplib::Request& req, httplib::Response& res,
                                  bool translate) {
  if (!req.is_multipart_form_data()) {
    throw ApiError(400, "the body must be multipart/form-data with the clip in 'file', as "
                   "OpenAI's audio API takes it", "invalid_request_error", "file");
  }
  FormParts form;
  for (const auto& [name, part] : req.files) {
    form.emplace(name, FormPart{part.content, part.filename});
  }
  auto active = admit();
  const TranscriptionRequest r = parse_transcription_request(form, translate);
  // The pieces queue together (side by side in the batch); a refusal of one drops those before.
  Choices jobs;
  try {
    for (const auto& piece : r.pieces) jobs.push_back(start_jobs(piece, true, "file").front());
  } catch (const ApiError& e) {
    abandon(jobs);
    throw as_transcription_error(e);
  } catch (...) {
    abandon(jobs);
    throw;
  }
  const bool stream = r.stream;
  answer_rendered(res, jobs, std::make_shared<TranscriptionRenderer>(stream), stream,
                  std::move(active));
  if (r.text && !stream) {
    res.set_content(parse_json(res.body)["text"].get<std::string>(), "text/plain; charset=utf-8");
  }
}

int64_t Server::prompt_tokens(const GenerationRequest& r, const std::string& param) {
  check_model(r.model);
  // Images count as the soft tokens the model reads for them, so they are read and preprocessed
  // as for a generation: the count is the prompt's usage.input_tokens.
  auto media = read_media(r.media);
  try {
    return static_cast<int64_t>(chat_prompt(r, media).ids.size());
  } catch (const ValueError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", param, "invalid_value");
  }
}

void Server::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  const MessagesRequest r = parse_messages_request(parse_body(req.body), /*for_count=*/true);
  res.set_content(dump({{"input_tokens", prompt_tokens(r.generation, "messages")}}),
                  "application/json");
}

void Server::handle_input_tokens(const httplib::Request& req, httplib::Response& res) {
  const ResponsesRequest r = parse_responses_request(parse_body(req.body), responses_);
  res.set_content(dump({{"object", "response.input_tokens"},
                        {"input_tokens", prompt_tokens(r.generation, "input")}}),
                  "application/json");
}

}  // namespace torchtpu::server
