#pragma once
// CheckParallel: the way to validate a tensor-parallel plan for a new model. It builds the model
// twice from a factory, parallelizes one with the plan and replicates the other, gives both the
// same seeded weights (InitRandom is placement-independent: nn/init.h), runs both on the same
// inputs and reports, per output, the largest difference over every rank of the mesh.
//
//   auto make = [&] { return std::make_unique<GPT2>(config); };
//   auto report = nn::CheckParallel(make, tp_mesh, GPT2::Plan(), {ids}).value();
//   std::puts(report.ToString().c_str());     // tp=2: output 0 f32[2, 12, 256] max |diff| 2.4e-06 ok
//   if (!report.ok()) return report.status();
//
// A plan that runs but computes something else (a fused projection cut with plain colwise, a
// rowwise layer fed the wrong slices, a missing all_reduce) shows up here as a large difference;
// what the plan checks catch before any weight is read is listed in docs/nn.md ("What is
// checked"). Collective: every rank of `mesh` calls it with the same arguments. The outputs of the
// parallel model are compared whole: DTensor outputs are gathered (FullTensor), and so is a root's
// output that is a piece (a colwise lm_head: Module::Call gathers it with a warning).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/core/shape.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/plan.h"
#include "dtensor/ops/value.h"

namespace dt::nn {

// Builds a fresh, unplaced model (the same architecture on every call and every rank).
using ModelFactory = std::function<std::unique_ptr<Module>()>;

struct CheckParallelOptions {
  uint64_t seed = 0;  // InitRandom's seed for both models
  double atol = 1e-5;
  double rtol = 1e-5;  // an element passes when |tp - ref| <= atol + rtol * |ref|
  ParallelizeOptions parallelize;  // for the tensor-parallel model
};

struct OutputCheck {
  int index = 0;
  std::string describe;     // the reference output: "f32[2, 12, 256]"
  double max_abs_diff = 0;  // over every element and every rank (inf for NaN)
  bool ok = false;          // every element within atol + rtol * |ref|
};

struct ParallelCheck {
  int64_t tp_size = 0;
  std::string mesh;  // "mesh(tp=2)"
  double atol = 0, rtol = 0;
  std::vector<OutputCheck> outputs;

  bool ok() const;
  double max_abs_diff() const;
  // One line per output: "tp=2 mesh(tp=2): output 0 f32[2, 12, 256] max |diff| 2.4e-06 ok".
  std::string ToString() const;
  // OK, or Internal naming every output out of tolerance and its difference.
  absl::Status status() const;
};

absl::StatusOr<ParallelCheck> CheckParallel(const ModelFactory& make_model, const DeviceMesh& mesh,
                                            const ParallelPlan& plan, const Values& inputs,
                                            const CheckParallelOptions& options = {});

}  // namespace dt::nn
