// The continuous-batching engine (engine.h): rank 0's scheduler, the step plan every rank runs,
// the page pool every rank keeps alike.

#include "dtensor/nn/models/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <set>
#include <utility>

#include <tbb/parallel_for.h>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

namespace {

// Note [Continuous batching]
// Rank 0 keeps the requests: a queue of waiting ones (Submit, at most max_waiting) and the running
// ones (at most max_running), each of which holds a slot (an index into every rank's table of
// sequences) and its pages. Every step it plans, in this order:
//   1. cancelled requests leave (waiting ones at once, running ones with their pages);
//   2. every running sequence past its prompt decodes one token (its last one);
//   3. running sequences still in their prompt take the next chunk of it, oldest first, as far as
//      step_tokens allows;
//   4. waiting requests join, first come first served, while a slot is free, tokens are left in
//      the step and the pool's pages cover them: a request reserves, when it joins, the pages of
//      every position it may reach (prompt + max_new_tokens - 1, up to the context), so that a
//      running sequence never waits for a page and nothing is ever preempted; it takes them one
//      at a time as it grows, and all go back when it ends. A request that does not fit waits
//      (and the ones behind it: no request overtakes another), however long.
// A sequence samples at the step that feeds its last prompt token, and at every step after it;
// its k-th token is drawn as Generate draws it (SampleToken with step k - 1, Note [Agreeing on
// tokens]), and it finishes as Generate stops: a stop id (kStop), max_new_tokens (kLength), or
// prompt + tokens reaching the positions a sequence may reach (kContext: CausalLM::
// position_limit, Note [The context limit]). The last token is never fed, so a finished sequence
// holds prompt + tokens - 1 positions.

// Note [Step plans]
// Every rank runs every step's forward (its collectives need all of them), so every rank must know
// the step: rank 0 decides it and broadcasts it through the mesh's communicator, one fixed-size
// buffer of int64 (4 + 5 · max_running + step_tokens: the slots freed since the last step, one
// entry per sequence in the step {slot, first position, tokens, samples}, and the step's token
// ids: prompt chunks and each decoding sequence's last token), so that a step costs one small
// broadcast besides the forward. Every rank then applies it alike: frees the listed slots' pages,
// lets each entry's sequence take the pages its positions now reach (lowest free page first, the
// same on every rank, so their pools agree page for page), and runs CausalLM::StepLogits. Only
// rank 0 samples: the other ranks learn the tokens from the next plan, which carries them, so the
// ranks agree on every token with no collective beyond the broadcast (where Generate all_reduces
// each token: Note [Agreeing on tokens]; a backend whose logits differed across ranks could not
// make the ranks disagree either). An idle rank 0 waits up to kIdleWait for a request and then
// broadcasts an idle plan, so a waiting rank never sits in a broadcast longer than that while rank
// 0 lives; a dead rank fails the broadcast or a collective of the forward on every live rank
// within the communicator's timeout, and Step returns that error there, and from then on.
constexpr auto kIdleWait = std::chrono::milliseconds(20);

// Note [Batching and rounding]
// A request computes in the engine what it computes alone, in another floating-point order: its
// rows share each GEMM with the other sequences' rows, and the GEMM picks its kernel by the rows
// M of the call (the skinny f32 kernels for M <= 8 and packed ones beyond, Note [GEMM kernels];
// the quantized Dot for M <= 8 and panels beyond, Note [Quantized GEMM]), which sum each row's
// products in different orders; its prompt is prefilled in chunks of step_tokens where Generate
// takes it whole; and its decode attention reads its keys page run by page run where Generate's
// reads them in one run (Note [Paged attention]). Each of these moves a logit by a
// rounding error, and the difference carries into the sequence's KV pages. Measured on the test
// fixtures (tests/models/engine_test.cc, a fresh batched step against each sequence alone):
// f32 weights 2e-6 to 5e-6 on logits up to 7 (1e-6 relative); the quantized tiny GGUF 0.016-0.039
// on logits up to 304 (1.3e-4 relative: its random weights make large sums that cancel); bf16
// 0.031 on logits up to 4 (two bf16 steps at that size).
// What is guaranteed: a request's token is the one it gets alone wherever the alone run's choice
// is not within that rounding (greedy: the top logit leads the second by more; sampled: the draw
// and the top-k / top-p cuts are as far from their boundaries), up to its first step where it is;
// a choice within rounding of a tie may go either way, and from then on the request continues
// from another token. The engine test checks exactly that on every fixture (tokens up to the
// first step whose alone margin is within 10 times the measured difference), and that on the f32
// fixtures every greedy step is far outside it (least margins 5e-5 to 2e-4 against 3e-6), so
// there every token is the alone run's. On real checkpoints ties within 1e-6 of relative rounding
// are rare in f32; in bf16 logits ties are common (the bf16 fixture has exact ones) and batched
// greedy text can part from Generate's at the first of them; quantized weights sit in between.
// Why not make the serving path's rows independent of the batch: the rows of a prefill chunk
// would have to be computed as Generate computes the whole prompt (one call of M = the prompt's
// length, which a chunked, shared step cannot be), and a decode row as an M = 1 call: that is
// running every sequence alone, the throughput batching exists for (bench/serve_engine.cc: 16
// sequences decode several times faster together than one after another). Generate itself is
// not invariant either: a prompt prefilled in one call or token by token rounds differently.

// EngineOptions::kv_pages = 0: enough for max_running full sequences, at most this many bytes of
// pages per rank (at least one full sequence).
constexpr int64_t kDefaultKvBytes = int64_t{4} << 30;

// The plan of one step (Note [Step plans]).
struct Plan {
  enum Kind : int64_t { kIdle = 0, kStep = 1, kStop = 2 };
  struct Entry {
    int64_t slot = 0, start = 0, tokens = 0, samples = 0;
  };
  int64_t kind = kIdle;
  std::vector<int64_t> frees;
  std::vector<Entry> entries;
  std::vector<int64_t> ids;
};

int64_t PlanCapacity(const EngineOptions& o) { return 4 + 5 * o.max_running + o.step_tokens; }

absl::StatusOr<Tensor> Encode(const Plan& p, int64_t capacity) {
  std::vector<int64_t> v = {p.kind, static_cast<int64_t>(p.frees.size()),
                            static_cast<int64_t>(p.entries.size()),
                            static_cast<int64_t>(p.ids.size())};
  v.insert(v.end(), p.frees.begin(), p.frees.end());
  for (const Plan::Entry& e : p.entries) v.insert(v.end(), {e.slot, e.start, e.tokens, e.samples});
  v.insert(v.end(), p.ids.begin(), p.ids.end());
  if (static_cast<int64_t>(v.size()) > capacity) {
    return absl::InternalError(absl::StrCat("a step plan of ", v.size(),
                                            " numbers exceeds its buffer of ", capacity));
  }
  v.resize(static_cast<size_t>(capacity), 0);
  return Tensor::FromVector<int64_t>({capacity}, v);
}

absl::StatusOr<Plan> Decode(const Tensor& t, const EngineOptions& o) {
  const std::vector<int64_t> v = t.ToVector<int64_t>();
  Plan p;
  p.kind = v[0];
  const int64_t frees = v[1], entries = v[2], ids = v[3];
  if (p.kind < Plan::kIdle || p.kind > Plan::kStop || frees < 0 || frees > o.max_running ||
      entries < 0 || entries > o.max_running || ids < 0 || ids > o.step_tokens) {
    return absl::InternalError(absl::StrCat("a malformed step plan: kind ", p.kind, ", ", frees,
                                            " frees, ", entries, " entries, ", ids, " ids"));
  }
  size_t at = 4;
  for (int64_t i = 0; i < frees; ++i) p.frees.push_back(v[at++]);
  for (int64_t i = 0; i < entries; ++i, at += 4) {
    p.entries.push_back({v[at], v[at + 1], v[at + 2], v[at + 3]});
  }
  p.ids.assign(v.begin() + static_cast<int64_t>(at), v.begin() + static_cast<int64_t>(at) + ids);
  return p;
}

// The pages of one rank's pools (every layer's pool has the same pages): handed out lowest first,
// so that the memory touched stays the low end of the pools.
class PagePool {
 public:
  explicit PagePool(int64_t pages) : total_(pages) {
    for (int64_t i = 0; i < pages; ++i) free_.insert(free_.end(), static_cast<int32_t>(i));
  }
  // Takes pages until `pages` covers `positions` positions.
  absl::Status Cover(std::vector<int32_t>& pages, int64_t positions, int64_t page_tokens) {
    const int64_t need = (positions + page_tokens - 1) / page_tokens;
    while (static_cast<int64_t>(pages.size()) < need) {
      if (free_.empty()) {  // the reservations of Note [Continuous batching] exclude it
        return absl::InternalError(absl::StrCat("the KV pool's ", total_,
                                                " pages are all taken (a reservation was broken)"));
      }
      pages.push_back(*free_.begin());
      free_.erase(free_.begin());
    }
    return absl::OkStatus();
  }
  void Free(std::vector<int32_t>& pages) {
    free_.insert(pages.begin(), pages.end());
    pages.clear();
  }
  int64_t used() const { return total_ - static_cast<int64_t>(free_.size()); }
  int64_t total() const { return total_; }

 private:
  int64_t total_;
  std::set<int32_t> free_;
};

class BatchingEngine : public Engine {
 public:
  BatchingEngine(CausalLM& model, const EngineOptions& options, CommPtr comm, int64_t pool_pages)
      : model_(model),
        options_(options),
        comm_(std::move(comm)),
        lead_(comm_ == nullptr || comm_->rank() == 0),
        limit_(model.position_limit()),
        pool_(pool_pages),
        slot_pages_(static_cast<size_t>(options.max_running)) {
    for (int64_t s = options.max_running - 1; s >= 0; --s) free_slots_.push_back(s);
    stats_.kv_pages_total = pool_pages;
  }
  ~BatchingEngine() override { model_.ReleasePagedKV(); }

  absl::StatusOr<int64_t> Submit(EngineRequest request) override;
  void Cancel(int64_t id) override;
  absl::StatusOr<std::vector<EngineEvent>> Step() override;
  void Stop() override;
  EngineStats stats() const override;

 private:
  // Rank 0's view of a request.
  struct Sequence {
    int64_t id = 0;
    EngineRequest request;
    int64_t budget = 0;    // tokens it may produce: max_new_tokens, fewer at the context
    int64_t reserved = 0;  // pages
    int64_t slot = -1;
    int64_t fed = 0;  // positions in its KV pages
    std::vector<int64_t> tokens;
    int64_t prompt() const { return static_cast<int64_t>(request.prompt.size()); }
  };

  // Rank 0, holding mu_: the next step's plan (Note [Continuous batching]); events for the
  // requests cancelled.
  Plan MakePlan(std::vector<EngineEvent>& events);
  // Every rank: frees, pages and the forward of `plan`; the logits of its sampling rows.
  absl::StatusOr<Tensor> RunPlan(const Plan& plan);
  // Rank 0: tokens for the sampling rows of `plan`, and the events they make.
  void Sample(const Plan& plan, const Tensor& logits, std::vector<EngineEvent>& events);
  // Rank 0, holding mu_: a running sequence's end; its slot's pages go with the next plan.
  void Finish(size_t index);
  absl::StatusOr<std::vector<EngineEvent>> Fail(absl::Status s);

  CausalLM& model_;
  const EngineOptions options_;
  const CommPtr comm_;  // null on one rank
  const bool lead_;
  const int64_t limit_;  // positions a sequence may reach
  // Every rank: the pages of each slot's sequence.
  PagePool pool_;
  std::vector<std::vector<int32_t>> slot_pages_;
  bool stopped_ = false;
  absl::Status failed_;

  // Rank 0.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Sequence> waiting_;
  std::vector<Sequence> running_;  // in the order they joined
  std::set<int64_t> cancels_;
  std::vector<int64_t> free_slots_;
  std::vector<int64_t> pending_frees_;  // slots of sequences ended since the last plan
  int64_t reserved_ = 0;                // pages reserved by the running sequences
  int64_t next_id_ = 1;
  bool stop_requested_ = false;
  EngineStats stats_;
  // Sample's buffers, kept between steps.
  std::vector<Sequence*> sample_seqs_, sample_rows_;
  std::vector<int64_t> sample_done_;
  std::vector<absl::StatusOr<int64_t>> sample_tokens_;
};

absl::StatusOr<int64_t> BatchingEngine::Submit(EngineRequest r) {
  if (!lead_) {
    return absl::FailedPreconditionError("Submit: requests go to group rank 0 of the model's mesh");
  }
  const int64_t vocab = model_.config().vocab_size;
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt == 0) return absl::InvalidArgumentError("prompt: empty");
  for (int64_t i = 0; i < prompt; ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: position ", i, ": token id ",
                                                     r.prompt[i], " is outside the vocab [0, ",
                                                     vocab, ")"));
    }
  }
  if (prompt >= limit_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: ", prompt, " tokens leave no room in the model's context of ", limit_,
        " positions (Note [The context limit])"));
  }
  if (r.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 1, got ", r.max_new_tokens));
  }
  if (absl::Status s = r.sampling.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  Sequence seq;
  seq.budget = std::min(r.max_new_tokens, limit_ - prompt);
  // The positions it may feed: all but its last token.
  seq.reserved = (prompt + seq.budget - 1 + options_.page_tokens - 1) / options_.page_tokens;
  if (seq.reserved > pool_.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens: ", prompt, " prompt tokens + ", seq.budget, " new ones need ",
        seq.reserved, " KV pages of ", options_.page_tokens, " positions, more than the pool's ",
        pool_.total(), " (EngineOptions::kv_pages)"));
  }
  seq.request = std::move(r);
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_requested_ || stopped_) return absl::FailedPreconditionError("the engine stopped");
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat(
        waiting_.size(), " requests wait already (EngineOptions::max_waiting)"));
  }
  seq.id = next_id_++;
  const int64_t id = seq.id;
  waiting_.push_back(std::move(seq));
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  wake_.notify_all();
  return id;
}

void BatchingEngine::Cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.insert(id);
  wake_.notify_all();
}

void BatchingEngine::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  wake_.notify_all();
}

EngineStats BatchingEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BatchingEngine::Finish(size_t index) {
  Sequence& s = running_[index];
  pending_frees_.push_back(s.slot);
  free_slots_.push_back(s.slot);
  reserved_ -= s.reserved;
  running_.erase(running_.begin() + static_cast<int64_t>(index));
}

Plan BatchingEngine::MakePlan(std::vector<EngineEvent>& events) {
  Plan plan;
  if (stop_requested_) {
    plan.kind = Plan::kStop;
    return plan;
  }
  // 1. Cancelled requests leave.
  if (!cancels_.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (!cancels_.count(it->id)) {
        ++it;
        continue;
      }
      events.push_back({it->id, -1, FinishReason::kCancelled, ""});
      it = waiting_.erase(it);
    }
    for (size_t i = 0; i < running_.size();) {
      if (!cancels_.count(running_[i].id)) {
        ++i;
        continue;
      }
      events.push_back({running_[i].id, -1, FinishReason::kCancelled, ""});
      Finish(i);
    }
    cancels_.clear();
  }
  plan.frees = std::move(pending_frees_);
  pending_frees_.clear();
  int64_t budget = options_.step_tokens;
  auto add = [&](Sequence& s, int64_t n) {
    const bool samples = s.fed + n == s.prompt() + static_cast<int64_t>(s.tokens.size());
    plan.entries.push_back({s.slot, s.fed, n, samples ? 1 : 0});
    if (s.fed < s.prompt()) {
      plan.ids.insert(plan.ids.end(), s.request.prompt.begin() + s.fed,
                      s.request.prompt.begin() + s.fed + n);
    } else {
      plan.ids.push_back(s.tokens.back());
    }
    budget -= n;
  };
  // 2. One decode token of every sequence past its prompt (step_tokens >= max_running).
  for (Sequence& s : running_) {
    if (s.fed >= s.prompt()) add(s, 1);
  }
  // 3. The next chunks of prompts under way.
  for (Sequence& s : running_) {
    if (s.fed < s.prompt() && budget > 0) add(s, std::min(s.prompt() - s.fed, budget));
  }
  // 4. New sequences.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < options_.max_running &&
         reserved_ + waiting_.front().reserved <= pool_.total()) {
    Sequence s = std::move(waiting_.front());
    waiting_.pop_front();
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    reserved_ += s.reserved;
    running_.push_back(std::move(s));
    add(running_.back(), std::min(running_.back().prompt(), budget));
  }
  plan.kind = plan.entries.empty() && plan.frees.empty() ? Plan::kIdle : Plan::kStep;
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running_.size());
  return plan;
}

absl::StatusOr<Tensor> BatchingEngine::RunPlan(const Plan& plan) {
  for (const int64_t slot : plan.frees) {
    if (slot < 0 || slot >= options_.max_running) {
      return absl::InternalError(absl::StrCat("a step plan frees slot ", slot));
    }
    pool_.Free(slot_pages_[slot]);
  }
  if (plan.entries.empty()) return Tensor();
  const int64_t page = options_.page_tokens;
  BatchStep step;
  step.ids = plan.ids;
  int64_t max_pages = 1;
  std::vector<int64_t> starts = {0}, lengths;
  for (const Plan::Entry& e : plan.entries) {
    if (e.slot < 0 || e.slot >= options_.max_running || e.start < 0 || e.tokens < 1) {
      return absl::InternalError(absl::StrCat("a malformed step plan entry: slot ", e.slot,
                                              ", start ", e.start, ", ", e.tokens, " tokens"));
    }
    std::vector<int32_t>& pages = slot_pages_[e.slot];
    if (e.start == 0 && !pages.empty()) {
      return absl::InternalError(absl::StrCat("a step plan starts a sequence in slot ", e.slot,
                                              ", which still holds ", pages.size(), " pages"));
    }
    DT_RETURN_IF_ERROR(pool_.Cover(pages, e.start + e.tokens, page));
    max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(pages.size()));
    for (int64_t p = e.start; p < e.start + e.tokens; ++p) step.positions.push_back(p);
    step.segments.push_back(e.tokens);
    starts.push_back(starts.back() + e.tokens);
    lengths.push_back(e.start + e.tokens);
    if (e.samples) step.logit_rows.push_back(starts.back() - 1);
  }
  const int64_t seqs = static_cast<int64_t>(plan.entries.size());
  if (starts.back() != static_cast<int64_t>(plan.ids.size())) {
    return absl::InternalError(absl::StrCat("a step plan has ", plan.ids.size(), " ids for ",
                                            starts.back(), " tokens"));
  }
  std::vector<int32_t> table(static_cast<size_t>(seqs * max_pages), 0);
  std::vector<int64_t> slots;
  slots.reserve(plan.ids.size());
  for (int64_t i = 0; i < seqs; ++i) {
    const Plan::Entry& e = plan.entries[i];
    const std::vector<int32_t>& pages = slot_pages_[e.slot];
    std::copy(pages.begin(), pages.end(), table.begin() + i * max_pages);
    for (int64_t p = e.start; p < e.start + e.tokens; ++p) {
      slots.push_back(int64_t{pages[p / page]} * page + p % page);
    }
  }
  step.paged.page_tokens = page;
  step.paged.pool_pages = pool_.total();
  DT_ASSIGN_OR_RETURN(step.paged.query_starts, Tensor::FromVector<int64_t>({seqs + 1}, starts));
  DT_ASSIGN_OR_RETURN(step.paged.kv_lengths, Tensor::FromVector<int64_t>({seqs}, lengths));
  DT_ASSIGN_OR_RETURN(step.paged.page_table, Tensor::FromVector<int32_t>({seqs, max_pages}, table));
  DT_ASSIGN_OR_RETURN(step.paged.slots,
                      Tensor::FromVector<int64_t>({static_cast<int64_t>(slots.size())}, slots));
  return model_.StepLogits(step);
}

// Note [Sampling rows in parallel]
// A step of 16 decoding sequences has 16 rows of logits to draw from, each a pass (greedy) or a
// few (sampled: Note [Candidates in order without sorting the vocabulary] in sampling.cc) over
// the vocabulary; drawn one after another on the step's thread they cost 0.3 ms (greedy) to
// 10 ms (sampled) a step of 16. They are independent, so the rows are drawn in parallel, outside
// the engine's lock (only the stepping thread changes the running sequences), and the events
// are made after, in plan order.
void BatchingEngine::Sample(const Plan& plan, const Tensor& logits,
                            std::vector<EngineEvent>& events) {
  absl::StatusOr<Tensor> f = logits.dtype() == DType::kF32 ? logits.Contiguous()
                                                             : ops::Cast(logits, DType::kF32);
  const int64_t vocab = model_.config().vocab_size;
  // The running sequence of each entry (every entry's slot is a running sequence's until the step
  // ends), and of each sampling row.
  std::vector<Sequence*>& seqs = sample_seqs_;
  std::vector<Sequence*>& rows = sample_rows_;
  seqs.clear();
  rows.clear();
  for (const Plan::Entry& e : plan.entries) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const Sequence& s) { return s.slot == e.slot; });
    seqs.push_back(&*it);
    if (e.samples) rows.push_back(&*it);
  }
  std::vector<absl::StatusOr<int64_t>>& tokens = sample_tokens_;
  tokens.assign(rows.size(), absl::StatusOr<int64_t>(0));
  auto draw = [&](size_t r) {
    const Sequence& s = *rows[r];
    tokens[r] = f.ok() ? SampleToken(absl::MakeConstSpan(f->data<float>() + r * vocab, vocab),
                                     s.request.sampling, static_cast<int64_t>(s.tokens.size()))
                       : absl::StatusOr<int64_t>(f.status());
  };
  if (rows.size() == 1) {
    draw(0);
  } else {
    tbb::parallel_for(size_t{0}, rows.size(), draw);
  }
  std::vector<int64_t>& done = sample_done_;  // the slots of the sequences that finish
  done.clear();
  size_t row = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const Plan::Entry& e = plan.entries[i];
    Sequence& s = *seqs[i];
    s.fed += e.tokens;
    if (s.fed <= s.prompt()) stats_.prompt_tokens += e.tokens;
    if (!e.samples) continue;
    const absl::StatusOr<int64_t>& token = tokens[row++];
    if (!token.ok()) {  // non-finite logits: this request fails, the others go on
      events.push_back({s.id, -1, FinishReason::kError,
                        absl::StrCat("step ", s.tokens.size(), ": ", token.status().message())});
      done.push_back(s.slot);
      continue;
    }
    s.tokens.push_back(*token);
    ++stats_.generated_tokens;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const std::vector<int64_t>& stop = s.request.stop_ids;
    EngineEvent ev{s.id, *token, FinishReason::kNone, ""};
    if (std::find(stop.begin(), stop.end(), *token) != stop.end()) {
      ev.finish = FinishReason::kStop;
    } else if (n == s.request.max_new_tokens) {
      ev.finish = FinishReason::kLength;
    } else if (n == s.budget) {
      ev.finish = FinishReason::kContext;
    }
    events.push_back(ev);
    if (ev.finish != FinishReason::kNone) done.push_back(s.slot);
  }
  // After the loop: Finish erases from running_, which moves the sequences seqs points at.
  for (const int64_t slot : done) {
    Finish(static_cast<size_t>(
        std::find_if(running_.begin(), running_.end(),
                     [&](const Sequence& s) { return s.slot == slot; }) -
        running_.begin()));
  }
  stats_.running = static_cast<int64_t>(running_.size());
}

absl::StatusOr<std::vector<EngineEvent>> BatchingEngine::Fail(absl::Status s) {
  failed_ = s;
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;  // Submit refuses from now on
  return s;
}

absl::StatusOr<std::vector<EngineEvent>> BatchingEngine::Step() {
  if (!failed_.ok()) return failed_;
  if (stopped_) return absl::CancelledError("the engine stopped");
  std::vector<EngineEvent> events;
  Plan plan;
  const int64_t capacity = PlanCapacity(options_);
  Tensor buffer;
  if (lead_) {
    std::unique_lock<std::mutex> lock(mu_);
    if (waiting_.empty() && running_.empty() && cancels_.empty() && pending_frees_.empty()) {
      wake_.wait_for(lock, kIdleWait, [&] {
        return !waiting_.empty() || !cancels_.empty() || stop_requested_;
      });
    }
    plan = MakePlan(events);
    if (comm_ != nullptr) {
      absl::StatusOr<Tensor> t = Encode(plan, capacity);
      if (!t.ok()) return Fail(t.status());
      buffer = *std::move(t);
    }
  } else {
    absl::StatusOr<Tensor> t = Tensor::Zeros({capacity}, DType::kI64);
    if (!t.ok()) return Fail(t.status());
    buffer = *std::move(t);
  }
  if (comm_ != nullptr) {
    if (absl::Status s = comm_->Broadcast(buffer, 0); !s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("a step plan's broadcast: ", s.message())));
    }
    if (!lead_) {
      absl::StatusOr<Plan> p = Decode(buffer, options_);
      if (!p.ok()) return Fail(p.status());
      plan = *std::move(p);
    }
  }
  if (plan.kind == Plan::kStop) {
    stopped_ = true;
    for (std::vector<int32_t>& pages : slot_pages_) pool_.Free(pages);
    model_.ReleasePagedKV();
    if (lead_) {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.clear();
      running_.clear();
      stats_.waiting = stats_.running = 0;
      stats_.kv_pages_used = 0;
    }
    return absl::CancelledError("the engine stopped");
  }
  absl::StatusOr<Tensor> logits = RunPlan(plan);
  if (!logits.ok()) return Fail(logits.status());
  if (!lead_) return events;
  if (!plan.entries.empty()) Sample(plan, *logits, events);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.kv_pages_used = pool_.used();
  if (!plan.entries.empty()) ++stats_.steps;
  return events;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> MakeBatchingEngine(CausalLM& model,
                                                           const EngineOptions& o) {
  auto bad = [](absl::string_view field, absl::string_view want, int64_t got) {
    return absl::InvalidArgumentError(
        absl::StrCat("EngineOptions::", field, " must be ", want, ", got ", got));
  };
  if (o.max_running < 1) return bad("max_running", ">= 1", o.max_running);
  if (o.max_waiting < 0) return bad("max_waiting", ">= 0", o.max_waiting);
  if (o.step_tokens < o.max_running) {
    return bad("step_tokens", absl::StrCat(">= max_running (", o.max_running, ")"), o.step_tokens);
  }
  if (o.page_tokens < 1) return bad("page_tokens", ">= 1", o.page_tokens);
  if (o.kv_pages < 0) return bad("kv_pages", ">= 0 (0: derived)", o.kv_pages);
  const int64_t limit = model.position_limit();
  const int64_t full = (limit + o.page_tokens - 1) / o.page_tokens;  // one full sequence
  int64_t pages = o.kv_pages;
  if (pages == 0) {
    const int64_t page_bytes = std::max<int64_t>(1, model.PagedKVBytesPerPosition() * o.page_tokens);
    pages = std::max(full, std::min(o.max_running * full, kDefaultKvBytes / page_bytes));
  }
  if (pages > std::numeric_limits<int32_t>::max()) {
    return bad("kv_pages", "< 2^31", pages);
  }
  DT_ASSIGN_OR_RETURN(CommPtr comm, model.MeshComm());
  if (comm != nullptr) {
    // Note [Step plans]: the ranks must plan with the same numbers.
    const std::vector<int64_t> mine = {o.max_running, o.step_tokens, o.page_tokens, pages};
    DT_ASSIGN_OR_RETURN(Tensor lo, Tensor::FromVector<int64_t>({4}, mine));
    DT_ASSIGN_OR_RETURN(Tensor hi, Tensor::FromVector<int64_t>({4}, mine));
    DT_RETURN_IF_ERROR(comm->AllReduce(lo, ReduceOp::kMin));
    DT_RETURN_IF_ERROR(comm->AllReduce(hi, ReduceOp::kMax));
    if (lo.ToVector<int64_t>() != hi.ToVector<int64_t>()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "MakeBatchingEngine: the ranks' options differ (max_running, step_tokens, page_tokens, "
          "KV pages here: ",
          mine[0], ", ", mine[1], ", ", mine[2], ", ", mine[3], ")"));
    }
  }
  return std::unique_ptr<Engine>(new BatchingEngine(model, o, std::move(comm), pages));
}

}  // namespace dt::nn
