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

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dt::nn {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
  // "greedy" or "temperature 0.8, top-k 40, top-p 1, seed 1".
  std::string ToString() const;
};

// InvalidArgument for bad options or empty / non-finite-only logits.
absl::StatusOr<int64_t> SampleToken(absl::Span<const float> logits, const SamplingOptions& options,
                                    int64_t step);

}  // namespace dt::nn
