#pragma once
// Parameter: one named weight of a module, kept as a DTensor that may be a placeholder.
//
//   state          spec()  value()  how it gets there
//   declared       -       -        Module::RegisterParameter(name, shape, dtype)
//   placed         yes     -        Place(): a style's ShardParam, or Replicate for a parameter no
//                                   plan rule covers (ParallelizeModule, ReplicateModule)
//   materialized   yes     yes      Set(): a loader that reads only this rank's ranges
//                                   (spec().Ranges()), LoadFullTensors, InitRandom (nn/init.h)
//
// A placeholder is the spec alone (mesh, placements, global shape, dtype): transformers G3's
// "DTensor on meta". Styles place parameters before any weight is read, so a loader can cut every
// rank's piece straight from the checkpoint and no rank ever holds a full weight. Placing a
// parameter that is already materialized redistributes its data on the same mesh (Replicate ->
// Shard is a local cut: no communication).
//
// Example (tp = 2, q_proj of a Linear 8 -> 8 under "colwise"):
//   declared      f32[8, 8]
//   placed        f32[8, 8] [S(0)] on mesh(tp=2)        rank 1 will hold rows [4, 8)
//   materialized  same spec, local piece f32[4, 8]

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/mesh/device_mesh.h"

namespace dt::nn {

class Module;

class Parameter {
 public:
  Parameter(Module* owner, std::string name, Shape shape, DType dtype);
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  const std::string& name() const { return name_; }  // within its module: "weight"
  std::string FullName() const;                      // from the root: "layers.0.q_proj.weight"
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  DType dtype() const { return dtype_; }

  bool placed() const { return spec_.has_value(); }
  bool materialized() const { return value_.defined(); }
  const DTensorSpec& spec() const;  // placed() only
  const DTensor& value() const;     // materialized() only

  // Makes this parameter a placeholder laid out as `placements` on `mesh` (see the class comment).
  absl::Status Place(const DeviceMesh& mesh, absl::Span<const Placement> placements);
  // Changes the dtype of a parameter that holds no data yet (placed or not; the placements stay):
  // how a loader keeps a weight in its checkpoint's quantized dtype (Note [Quantized dtypes] in
  // core/quant.h), or gives it back its compute dtype. FailedPrecondition when materialized.
  absl::Status SetDType(DType dtype);
  // Materializes: `value` must have this parameter's shape and dtype, and its spec when placed.
  absl::Status Set(DTensor value);
  // Drops the data and keeps the spec.
  void Release() { value_ = DTensor(); }

  // The plan rule that placed this parameter ("model.layers.*.mlp.up_proj -> colwise"), set by
  // ParallelizeModule; empty when none did (no rule covers it, ReplicateModule, a manual Place).
  const std::string& plan_rule() const { return plan_rule_; }
  void set_plan_rule(std::string rule) { plan_rule_ = std::move(rule); }

  // "f32[8, 8] [S(0)] on mesh(tp=2)", "f32[8, 8] (not placed)"; "+ (placeholder)" when no data.
  std::string Describe() const;

 private:
  Module* owner_;
  std::string name_;
  Shape shape_;
  DType dtype_;
  std::optional<DTensorSpec> spec_;
  DTensor value_;
  std::string plan_rule_;
};

}  // namespace dt::nn
