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
// Quantized weights (Note [Quantized dtypes] in core/quant.h) take two more calls around the
// placement, both before any weight is read:
//
//   KeepQuantized      before placing: every Linear weight and Embedding table whose checkpoint
//                      tensor is quantized (a GGUF's Q4_1 ...) takes that dtype, so that it is
//                      read and kept as its blocks.
//   FitQuantized       after placing: a quantized weight whose column shards are not whole blocks
//                      on every rank (a rowwise o_proj of 576 columns at tp=4: 144 each, not
//                      whole 32-element blocks) is refused, naming it, the block and the mesh,
//                      or given back its compute dtype (dequantized on read), as the caller
//                      chooses; the load report says which (LoadReport::dequantized).
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
    DType dtype = DType::kF32;  // as held (a quantized dtype when kept quantized)
  };
  std::vector<Param> params;
  // Weights FitQuantized gave back their compute dtype, with the reason.
  std::vector<std::pair<std::string, std::string>> dequantized;
  loaders::ReadStats stats;
  int64_t full_bytes = 0;          // every parameter, full
  int64_t sharded_full_bytes = 0;  // parameters the plan shards, full
  int64_t replicated_bytes = 0;    // parameters every rank holds whole
  int64_t local_bytes = 0;         // this rank's pieces
  double seconds = 0;

  // "210 weights kept quantized (q4_1 x 210), 1 as q8_0 ..." : which weights stay quantized, in
  // which dtypes, and which were dequantized and why; "" when none is quantized.
  std::string QuantizedSummary() const;
};

using SourceNameFn = std::function<std::string(absl::string_view param_name)>;

// `model` names the model in messages ("LlamaForCausalLM"); warnings go to nn/log.h when `warn`.
absl::Status CheckCheckpoint(const Module& module, const loaders::Checkpoint& checkpoint,
                             absl::string_view model, bool warn, const SourceNameFn& source = {});

// See the file comment. Returns how many weights became quantized.
absl::StatusOr<int64_t> KeepQuantized(Module& module, const loaders::Checkpoint& checkpoint,
                                      const SourceNameFn& source = {});

// What FitQuantized does with a quantized weight whose shards are not whole blocks.
enum class QuantizedMisfit : uint8_t { kRefuse, kDequantize };
// See the file comment. `compute` is the dtype a dequantized weight takes; `report` (optional)
// records it in LoadReport::dequantized.
absl::Status FitQuantized(Module& module, QuantizedMisfit misfit, DType compute,
                          LoadReport* report = nullptr);

// `progress`: show the bar (pass true on one rank only).
absl::Status LoadCheckpoint(Module& module, const loaders::Checkpoint& checkpoint,
                            const loaders::ReadOptions& read, bool progress,
                            LoadReport* report = nullptr, const SourceNameFn& source = {});

}  // namespace dt::nn
