#pragma once
// Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p
// (transformers' order: temperature, then top-k, then top-p, then a draw from the softmax).
//
//   options                                  token
//   greedy                                   argmax (the lowest index among equal maxima)
//   temperature t, top_k k, top_p p, seed s  draw with u = UniformAt(s, step) (core/random.h)
//                                            from softmax(logits / t) restricted to the k
//                                            largest, then to the smallest prefix (by
//                                            probability) whose mass reaches p
//
// The draw depends only on (logits, options, step), so any process reproduces it exactly.
//
// Note [Logits must be finite]
// A NaN or an infinity among the logits means the forward went wrong (a NaN weight, an overflow);
// no token chosen from them is an answer, and NaN has no place in an order (a `>` sort over NaN
// breaks partial_sort's contract, and two ranks could then pick differently). So every non-finite
// logit is refused, naming the first ("logit 7 of 384 is NaN"), greedy or sampled. Among finite
// logits the order is total: larger first, equal ones by lower id, which makes the k largest, the
// top-p prefix and the token a function of (logits, options, step) alone.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/mesh/communicator.h"

namespace dt::nn {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // > 0, finite
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
  // "greedy" or "temperature 0.8, top-k 40, top-p 1, seed 1".
  std::string ToString() const;
  // InvalidArgument naming the bad field unless greedy or temperature > 0 (finite), top_k >= 0,
  // 0 < top_p <= 1.
  absl::Status Validate() const;
};

// InvalidArgument for bad options, no logits or a non-finite logit (Note [Logits must be finite]).
absl::StatusOr<int64_t> SampleToken(absl::Span<const float> logits, const SamplingOptions& options,
                                    int64_t step);

// The token every rank of `comm` takes from its copy of the same (gathered) logits, or the same
// error on every rank (Note [Agreeing on tokens]): each rank checks its copy is finite, group rank
// 0 samples, and one all_reduce (min) of two int64s hands every rank the verdict and rank 0's
// token. Errors: a bad option or no logits (without communicating: the options and the vocab are
// the same on every rank), or "the logits are not finite: logit 7 of 384 is NaN" naming the
// lowest such id any rank saw. `comm` null (one rank): the same token and messages as any
// number of ranks.
absl::StatusOr<int64_t> AgreeOnToken(absl::Span<const float> logits,
                                     const SamplingOptions& options, int64_t step,
                                     Communicator* comm);

}  // namespace dt::nn
