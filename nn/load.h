#pragma once
// Loading a placed module from a checkpoint: every model's FromPretrained ends in these two calls.
//
//   CheckCheckpoint   every parameter's tensor present with its shape and a float dtype; warns
//                     about tensors the model does not use. Reads no weight.
//   LoadCheckpoint    each rank reads only its own ranges of every tensor (spec.Ranges()) and
//                     converts them to the parameter's dtype; a progress bar on the mesh's first
//                     rank when it takes over a second; LoadReport receives the loader's counts,
//                     so tests can prove that no rank read a full sharded weight.
//
// `source` maps a parameter's dotted name to the checkpoint tensor it is read from (a tied
// lm_head reads model.embed_tokens.weight); the identity when unset.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

// What one rank's load did (the loader's accounting, see loaders::ReadStats).
struct LoadReport {
  struct Param {
    std::string name;        // model parameter ("lm_head.weight")
    std::string checkpoint;  // tensor read ("model.embed_tokens.weight" for a tied lm_head)
    std::string spec;        // "[S(0)] on mesh(tp=4)"
    int64_t full_bytes = 0;  // the full tensor in the compute dtype
    int64_t local_bytes = 0;  // this rank's piece
    int64_t read_bytes = 0;  // bytes viewed or copied out of the file for it
    bool sharded = false;
  };
  std::vector<Param> params;
  loaders::ReadStats stats;
  int64_t full_bytes = 0;          // every parameter, full
  int64_t sharded_full_bytes = 0;  // parameters the plan shards, full
  int64_t replicated_bytes = 0;    // parameters every rank holds whole
  int64_t local_bytes = 0;         // this rank's pieces
  double seconds = 0;
};

using SourceNameFn = std::function<std::string(absl::string_view param_name)>;

// `model` names the model in messages ("LlamaForCausalLM"); warnings go to nn/log.h when `warn`.
absl::Status CheckCheckpoint(const Module& module, const loaders::Checkpoint& checkpoint,
                             absl::string_view model, bool warn, const SourceNameFn& source = {});

// `progress`: show the bar (pass true on one rank only).
absl::Status LoadCheckpoint(Module& module, const loaders::Checkpoint& checkpoint,
                            const loaders::ReadOptions& read, bool progress,
                            LoadReport* report = nullptr, const SourceNameFn& source = {});

}  // namespace dt::nn
