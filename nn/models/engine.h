#pragma once
// The serving engine's contract: many requests decoded together over the ranks of one model
// (continuous batching), driven by group rank 0 of the model's mesh, every rank stepping in
// lockstep. `dtensor serve` (tools/) puts an HTTP server in front of rank 0's engine; the other
// ranks only call Step until it says the engine stopped.
//
//   rank 0                                        every other rank
//   engine = MakeBatchingEngine(model, opts)      engine = MakeBatchingEngine(model, opts)
//   id = engine->Submit(request)   (any thread)
//   loop: events = engine->Step()                 loop: engine->Step() until stopped
//         hand each event to its request
//   engine->Stop()  (drain done or fatal)
//
// Invariants the implementation keeps:
//   - A request's tokens are those of running it alone with the same options (same prompt,
//     sampling seed and step counter): batching changes which sequences share a step, never what
//     a sequence computes beyond floating-point rounding (Note in the implementation on what
//     rounding can and cannot change).
//   - Sequences join and leave between steps; a step holds at most `max_running` sequences and
//     `step_tokens` tokens (prefill chunks of new sequences mixed with one decode token of each
//     running one).
//   - KV memory is fixed-size pages from one pool per rank, taken as a sequence grows and given
//     back when it finishes or is cancelled; a sequence never copies its cache to grow.
//   - Every wait has a deadline: a rank that dies makes Step fail on every live rank within the
//     collective timeout.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/nn/models/sampling.h"

namespace dt::nn {

class CausalLM;

struct EngineOptions {
  int64_t max_running = 16;    // sequences decoded together in a step
  int64_t max_waiting = 64;    // queued requests beyond the running ones; Submit refuses past it
  int64_t step_tokens = 256;   // tokens per step (decode tokens first, then prefill chunks)
  int64_t page_tokens = 16;    // positions per KV page
  // Pages in the pool per rank; 0: enough for max_running full contexts, but at most 4 GiB of
  // them per rank (at least one full context). The pool's memory is touched as pages are first
  // used. A request reserves the pages of prompt + max_new_tokens when it joins (it waits until
  // they are free); one that could never fit is refused at Submit.
  int64_t kv_pages = 0;
};

struct EngineRequest {
  std::vector<int64_t> prompt;  // token ids, already templated and tokenized; non-empty
  int64_t max_new_tokens = 16;  // >= 1; generation also ends at the model's context
  SamplingOptions sampling;     // greedy or temperature / top-k / top-p with its seed
  std::vector<int64_t> stop_ids;  // finish after producing one of these (e.g. the EOS ids)
};

enum class FinishReason : uint8_t {
  kNone,       // still running: more events follow
  kStop,       // produced one of stop_ids (the event carries it)
  kLength,     // max_new_tokens reached
  kContext,    // the model's context is full
  kCancelled,  // Cancel, e.g. the client went away
  kError,      // this request failed (its message in EngineEvent::error); the others go on
};
// "stop", "length", "context", "cancelled", "error" ("" for kNone): OpenAI's finish_reason words
// where they exist.
const char* FinishReasonName(FinishReason r);

// What one step produced for one request.
struct EngineEvent {
  int64_t id = 0;
  int64_t token = -1;  // the new token, or -1 for a finish without one (cancelled, error)
  FinishReason finish = FinishReason::kNone;
  std::string error;   // kError only
};

struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t kv_pages_used = 0, kv_pages_total = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals since the engine started
  int64_t steps = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Rank 0, any thread: queues a request and returns its id (> 0). InvalidArgument naming the field
  // for a bad request (empty prompt, a token id outside the vocab, a prompt at or over the context,
  // max_new_tokens < 1, bad sampling options); ResourceExhausted when max_waiting requests wait;
  // FailedPrecondition after Stop or on another rank.
  virtual absl::StatusOr<int64_t> Submit(EngineRequest request) = 0;
  // Rank 0, any thread: the request finishes (kCancelled) at the next step and gives back its
  // pages; unknown or finished ids are ignored.
  virtual void Cancel(int64_t id) = 0;
  // Every rank, one thread each, in lockstep: one step of the batch. Rank 0 decides the batch
  // and tells the other ranks; every rank runs the forward. Rank 0 gets the step's events (empty
  // when there was no work: the call then waits a little for a Submit before it returns); the
  // other ranks get none. After Stop, returns Cancelled on every rank.
  virtual absl::StatusOr<std::vector<EngineEvent>> Step() = 0;
  // Rank 0: the running and waiting requests finish as kCancelled, and the next Step tells the
  // other ranks to stop.
  virtual void Stop() = 0;
  // Rank 0 (others: zeros but for kv_pages_total).
  virtual EngineStats stats() const = 0;
};

// The continuous-batching engine over `model`, which must outlive it (its KV pages live in the
// model's attention layers: one engine per model at a time; Generate and Logits may run between
// steps). Every rank of the model's mesh makes one with the same options (checked: a collective).
// InvalidArgument naming the field for bad options (step_tokens must be >= max_running).
absl::StatusOr<std::unique_ptr<Engine>> MakeBatchingEngine(CausalLM& model, const EngineOptions& options);

}  // namespace dt::nn
