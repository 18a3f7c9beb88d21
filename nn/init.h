#pragma once
// Materializing parameters: filling placeholders (nn/parameter.h) with data.
//
//   function              every rank holds              communication
//   MaterializeParameters this rank's piece only: fn     none
//                         reads spec.Ranges() (loaders)
//   LoadFullTensors       the full tensor; each rank     none (DTensor::Distribute with
//                         cuts its own piece             src_rank = nullopt)
//   InitRandom            nothing: counter-based RNG     none (DTensor::Rand: equal to cutting
//                         gives any piece of the full    the full random tensor)
//                         random tensor
//   GatherParameters      -                              FullTensor() per parameter (collective)
//
// InitRandom is for tests and demos: a tensor-parallel module and its unparallelized twin
// initialized with the same seed hold the same global weights, whatever their placements.
// Values: parameters of 2+ dims uniform in ±1/sqrt(last dim); 1-D parameters uniform in [0.5, 1.5)
// (norm weights near 1). Each parameter's stream is seeded by (seed, its dotted name).

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

// Returns this rank's local piece of parameter `name` (shape spec.LocalShape(), dtype
// spec.dtype()).
using LocalPieceFn =
    std::function<absl::StatusOr<Tensor>(absl::string_view name, const DTensorSpec& spec)>;
// Returns the full tensor of parameter `name` (shape and dtype of the parameter).
using FullTensorFn =
    std::function<absl::StatusOr<Tensor>(absl::string_view name, const Parameter& param)>;

// Every placed parameter below `module` (names relative to it); FailedPrecondition for a parameter
// that is not placed yet (ParallelizeModule or ReplicateModule first).
absl::Status MaterializeParameters(Module& module, const LocalPieceFn& fn);
absl::Status LoadFullTensors(Module& module, const FullTensorFn& fn);
absl::Status InitRandom(Module& module, uint64_t seed);

// (name, full tensor) of every parameter; collective over each parameter's mesh.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> GatherParameters(Module& module);

// The seed InitRandom uses for parameter `name` (stable across processes and runs).
uint64_t ParameterSeed(uint64_t seed, absl::string_view name);

}  // namespace dt::nn
