#pragma once
// DTensor: a global tensor laid out over a DeviceMesh by one placement per mesh dim; each rank
// holds its local piece (PyTorch's torch.distributed.tensor.DTensor).
//
//   auto mesh = InitDeviceMesh(world, {2, 4}, {"dp", "tp"}).value();
//   auto x = DTensor::Distribute(full, mesh, ParsePlacements("S(0),R").value()).value();
//   auto y = x.Redistribute(ParsePlacements("R,S(1)").value()).value();  // planned, cached
//   Tensor mine = y.ToLocal();                                          // this rank's piece
//   Tensor all = y.FullTensor().value();                                // every rank: `full`
//
// Invariants: ToLocal().shape() == spec().LocalShape() and dtype() == spec().dtype() on every
// member; a rank outside the mesh holds an empty tensor [0] and takes part in no communication.
// Every function that communicates is collective over the mesh: all members call it in the same
// order with the same arguments (placements, shapes, options).
//
//   function             communication
//   Distribute           per mesh dim: scatter (Shard) or broadcast (Replicate/Partial) from
//                        group rank src_rank; none with src_rank = nullopt
//   FromLocal            none; run_check: one all_gather of shapes, a broadcast per Replicate dim
//   Zeros/Ones/Full/Rand none (counter-based RNG: equal to distributing the full random tensor)
//   Redistribute         the plan's collectives (dtensor/planner.h)
//   FullTensor           Redistribute to all-Replicate

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/plan_cache.h"
#include "dtensor/dtensor/planner.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/mesh/device_mesh.h"

namespace dt {

struct FromLocalOptions {
  // The global shape. Without it the layout is assumed even: every sharded dim is the local size
  // times the number of ranks splitting it (PyTorch's rule); uneven layouts must pass it.
  std::optional<Shape> shape;
  // Verify across the mesh that every rank's local shape and dtype fit the layout and that the
  // ranks of every Replicate mesh dim hold equal data (bitwise); any mismatch is an error on
  // every rank.
  bool run_check = false;
};

struct RedistributeOptions {
  // Strategy, merging, cost model and allow_partial (Replicate -> Partial, internal use as in
  // PyTorch) of the plan; see dtensor/planner.h.
  PlannerOptions planner;
};

class DTensor {
 public:
  DTensor() = default;

  // distribute_tensor: `full` (the same global shape and dtype on every rank; only group rank
  // `src_rank` of each mesh dim supplies data) -> its pieces. src_rank nullopt: every rank holds
  // `full` and cuts its own piece without communicating.
  static absl::StatusOr<DTensor> Distribute(const Tensor& full, const DeviceMesh& mesh,
                                            absl::Span<const Placement> placements,
                                            std::optional<int> src_rank = 0);
  // from_local: wraps this rank's piece.
  static absl::StatusOr<DTensor> FromLocal(Tensor local, const DeviceMesh& mesh,
                                           absl::Span<const Placement> placements,
                                           const FromLocalOptions& options = {});

  // Creation functions: equal to distributing the full tensor (Partial placements per
  // Note [Partial from Replicate]); no communication.
  static absl::StatusOr<DTensor> Full(IntSpan shape, double value, const DeviceMesh& mesh,
                                      absl::Span<const Placement> placements,
                                      DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<DTensor> Zeros(IntSpan shape, const DeviceMesh& mesh,
                                       absl::Span<const Placement> placements,
                                       DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<DTensor> Ones(IntSpan shape, const DeviceMesh& mesh,
                                      absl::Span<const Placement> placements,
                                      DType dtype = DType::kF32, Device device = kCPU);
  // Uniform [0, 1) / standard normal, equal to Tensor::Rand(shape, seed) distributed.
  static absl::StatusOr<DTensor> Rand(IntSpan shape, uint64_t seed, const DeviceMesh& mesh,
                                      absl::Span<const Placement> placements,
                                      DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<DTensor> Randn(IntSpan shape, uint64_t seed, const DeviceMesh& mesh,
                                       absl::Span<const Placement> placements,
                                       DType dtype = DType::kF32, Device device = kCPU);

  // Internal: a DTensor from a validated spec and a local piece of the right shape.
  DTensor(DTensorSpec spec, Tensor local) : spec_(std::move(spec)), local_(std::move(local)) {}

  bool defined() const { return local_.defined(); }
  const DTensorSpec& spec() const { return spec_; }
  const DeviceMesh& mesh() const { return spec_.mesh(); }
  const Placements& placements() const { return spec_.placements(); }
  const Shape& shape() const { return spec_.shape(); }
  DType dtype() const { return spec_.dtype(); }

  // This rank's piece (shares storage with the DTensor).
  const Tensor& ToLocal() const { return local_; }
  // The global tensor on every member (empty on non-members).
  absl::StatusOr<Tensor> FullTensor() const;

  // Moves the data to `placements` on the same mesh. The rvalue form may reuse this DTensor's
  // buffer (e.g. all_reduce in place). The result may share storage with this DTensor.
  absl::StatusOr<DTensor> Redistribute(absl::Span<const Placement> placements,
                                       const RedistributeOptions& options = {}) const&;
  absl::StatusOr<DTensor> Redistribute(absl::Span<const Placement> placements,
                                       const RedistributeOptions& options = {}) &&;
  // Across meshes: only the same mesh is supported (a clear error otherwise).
  absl::StatusOr<DTensor> Redistribute(const DeviceMesh& mesh,
                                       absl::Span<const Placement> placements,
                                       const RedistributeOptions& options = {}) const&;

  // "DTensor(f32[13, 2] [S(0), R] on mesh(dp=2, tp=4), local f32[7, 2] cpu)".
  std::string ToString() const;

 private:
  absl::StatusOr<DTensor> RedistributeImpl(Tensor local, bool may_modify,
                                           absl::Span<const Placement> placements,
                                           const RedistributeOptions& options) const;

  DTensorSpec spec_;
  Tensor local_;
};

}  // namespace dt
