#pragma once
// Loading a module from a checkpoint. Every model's FromPretrained (CausalLM, Flux2) runs one path,
// LoadPretrained (Note [One loading path]), built from these calls:
//
//   CheckBlockCount   the config's block count against the checkpoint's names, before any module
//                     is built (Note [Config against checkpoint]).
//   ValidatePlan      the plan against the module and the mesh (nn/plan.h), nothing placed.
//   CheckCheckpoint   every parameter's tensor present with its shape and a float dtype; a tensor
//                     the model does not use refused (or warned about, or ignored: Note
//                     [Every tensor is used]). Reads no weight.
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
//
// Note [One loading path]
//   1. the plan validated against the module and the mesh (ValidatePlan): nothing placed or read;
//   2. the parameters placed: by the plan, or Replicate (load_whole; a one-rank mesh: Note [One
//      rank runs without the plan's hooks]);
//   3. the checkpoint checked against the placed module (names, shapes, dtypes; the model's own
//      checks): nothing read;
//   4. each rank reads its own ranges (load_whole: everything);
//   5. load_whole on more than one rank only: the model sharded in place (ShardLoaded).
// So a plan or a checkpoint that cannot work is refused before any weight is read, on either
// path; the config's own checks (CheckBlockCount, a model's sizes) come before the module exists.
//
// Note [One rank runs without the plan's hooks]
// On a 1-D mesh of one rank (tp = 1, no expert plan) the plan is validated in step 1 as on any
// mesh (a plan that cannot work is refused at tp = 1 too), but not applied: every parameter is
// placed Replicate, which is what any shard is on one rank, and no style's forward is installed.
// A style is a placement transform (its hooks redistribute, reduce partial sums and hand on local
// pieces), and on one rank every one of those is the identity, so the modules' own forwards
// compute the same values, without a DTensor wrapped and unwrapped around every projection
// (decode of SmolLM2 Q4_1 at tp = 1, 2 threads: about 9% faster, docs/llama.md). The load report
// therefore shows R for every weight at tp = 1, and the plan's rules are not recorded on the
// parameters. Models placed through ParallelizeModule directly keep the plan on any mesh.
//
// Note [Every tensor is used]
// A checkpoint tensor that no parameter reads is a model that computes something else: a custom
// model that forgot its post_feedforward_layernorm ran with logits off by 20.7, a relabelled
// Gemma 2 ran as another family, and both only warned (issue 47). So the library's default
// (PretrainedLoad::unused_tensors, CausalLMLoadOptions' and Flux2LoadOptions') is kError: the load
// is refused on every rank before any weight is read, naming how many tensors are unused and the
// first few. A warning (kWarn, from the mesh's first rank) or nothing (kIgnore) must be asked for:
// the ready programs' --allow-unused-weights, or a library user who knows the extra tensors are
// not part of the forward (an MTP head, a vision tower beside the text model). Strict is the
// library default, not only the programs', because the library is where custom models are built
// and where the silent case was found; a wrong model that runs is worse than a load that stops.
//
// Note [Config against checkpoint]
// The config decides how many modules are built, so its sizes are checked against the
// checkpoint's headers before any module exists: a config.json claiming 10^9 layers is refused in
// microseconds instead of allocating for hours.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/plan.h"

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
  // What the model's plan did that the placements alone do not say, one line each ("2 KV heads on
  // 4 ranks: ..."), for the programs to print.
  std::vector<std::string> notes;
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

// `model` names the model in messages ("LlamaForCausalLM"). Checkpoint tensors no parameter reads
// are, by `unused` (Note [Every tensor is used]): an InvalidArgument naming the first few
// (kError), a warning through nn/log.h (kWarn: pass it on one rank only), or nothing (kIgnore).
// `config_tensors`: tensors the model's config was read from (a GGUF's longrope factors), used
// though no parameter reads them.
absl::Status CheckCheckpoint(const Module& module, const loaders::Checkpoint& checkpoint,
                             absl::string_view model, PlanCheck unused = PlanCheck::kError,
                             const SourceNameFn& source = {},
                             const std::vector<std::string>& config_tensors = {});

// The checkpoint tensors neither a parameter of `module` nor the config reads, in the
// checkpoint's order.
std::vector<std::string> UnusedTensors(const Module& module, const loaders::Checkpoint& checkpoint,
                                       const SourceNameFn& source = {},
                                       const std::vector<std::string>& config_tensors = {});

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

// The block indices after `prefix` ("model.layers.") in the checkpoint's names are exactly
// 0 .. want - 1; InvalidArgument naming the config `field`, both counts and any gap otherwise.
absl::Status CheckBlockCount(const loaders::Checkpoint& checkpoint, absl::string_view prefix,
                             absl::string_view field, int64_t want);

// How LoadPretrained loads a model (Note [One loading path]).
struct PretrainedLoad {
  std::string model;  // its name in messages ("Qwen3ForCausalLM")
  ParallelPlan plan;
  // The expert-parallel plan (nn/expert_parallel.h): on a 2-D (ep, tp) mesh, or on the 1-D mesh
  // ep and tp share when non-empty; `plan` applies to the tp dim.
  ParallelPlan ep_plan;
  ParallelizeOptions parallelize;
  bool load_whole = false;  // read everything, then shard (nn/distributed.h ShardLoaded)
  // Checkpoint tensors the model does not use (Note [Every tensor is used]): refused by default;
  // kWarn warns from the mesh's first rank.
  PlanCheck unused_tensors = PlanCheck::kError;
  loaders::ReadOptions read;
  SourceNameFn source;
  // Tensors the config was read from (loaders::GgufConfigTensors): not unused.
  std::vector<std::string> config_tensors;
  // The model's checks of the checkpoint beyond names and shapes (step 3); reads no weight.
  std::function<absl::Status(const loaders::Checkpoint&)> check;
  // KeepQuantized before step 2 and FitQuantized after it (`compute`: the dtype a misfit weight
  // takes); refused with load_whole.
  bool keep_quantized = false;
  QuantizedMisfit quantized_misfit = QuantizedMisfit::kDequantize;
  DType compute = DType::kF32;
};

// Steps 1-5 of Note [One loading path] on a freshly built, unplaced `module`, collective over the
// 1-D tensor-parallel `mesh`, or with how.ep_plan over it or a 2-D (ep, tp) mesh
// (ParallelizeModuleWithEP; load_whole is refused there).
absl::Status LoadPretrained(Module& module, const DeviceMesh& mesh,
                            const loaders::Checkpoint& checkpoint, const PretrainedLoad& how,
                            LoadReport* report = nullptr);

}  // namespace dt::nn
