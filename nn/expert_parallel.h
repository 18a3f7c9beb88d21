#pragma once
// Expert parallelism: the experts of every MoE layer (nn/moe.h) split across ranks by the expert
// dim, each rank holding and reading only its E / ep whole experts (transformers'
// base_model_ep_plan, DistributedConfig::ep_size). Two layouts (Note [Expert-parallel layouts] in
// nn/distributed.h): ep over the same ranks as tp (one 1-D mesh: the dense layers split by the tp
// plan, the experts whole), or a 2-D mesh (ep, tp) whose tp dim splits what the tensor-parallel
// plan splits — attention heads, dense MLPs and, inside each rank's own experts, their
// intermediate size — each dim with its own communicator.
//
//   style                params                      forward
//   grouped_gemm         S(0) over ep (the experts)  — (parameters only)
//   ep_router            R                           the router's output: the ids of other ranks'
//                                                    experts become E / ep (skipped) with weight
//                                                    0, this rank's become its local ids
//   ep_dispatch_experts  (its parameters' rules)     Note [Dispatch and combine]
//
// A MoE family offers two plans (nn/models/decoder_family.h):
//   ep_plan             transformers': experts.gate_up_proj and experts.down_proj grouped_gemm,
//                       experts ep_dispatch_experts (tokens move to their experts' ranks)
//   ep_all_reduce_plan  gate ep_router, the same grouped_gemm, experts moe_tp_experts: every rank
//                       runs its experts (local pieces) on every token routed to them and one
//                       all_reduce over ep sums (transformers' AllReduceEP with its v4 plans'
//                       ep_router; on the shared 1-D mesh it is the experts' only style)
//
// Placements: on (ep, tp) a parameter that a rule of the ep plan shards is placed on the 2-D mesh
// as [ep placement, tp placement] — the experts' gate_up_proj [S(0), _S(1,[I,I])], down_proj
// [S(0), S(2)] — so a rank reads exactly its experts' rows of its tp share and nothing of the
// others (LoadReport proves it); everything else stays on the tp dim, replicated over ep. On one
// shared dim the experts are [S(0)] and the tp plan's rules of the same keys are dropped.
//
// Note [Dispatch and combine]
// The ranks of an ep group hold the same tokens (the dense layers are replicated over ep). So that
// no (token, expert) pair is computed twice, each rank takes its chunk of the N tokens (as
// torch.chunk cuts them: in decode one rank has the token and the others have none) and
//   1. sorts its chunk's (token, slot) pairs by expert; ranks own contiguous expert ranges (rank
//      r: r·E/ep .. (r+1)·E/ep - 1), so the pairs come grouped by owner and, within, by the
//      owner's local expert;
//   2. exchanges the sizes first: an all_gather of each rank's [ep, E/ep] counts gives every rank
//      the whole matrix, so it knows what it receives from whom and in which order;
//   3. dispatch: one all_to_all (uneven, empty slices allowed) sends each pair's row to the owner;
//   4. the owner runs its experts' own forward on the rows it received (top-1, weight 1;
//      tensor-parallel inside when tp > 1: one all_reduce over tp);
//   5. combine: a second all_to_all brings each result back to the rank that sent the row, which
//      weighs it with its routing weight and sums each token's rows in ascending expert order
//      (CombineByToken, transformers' index_add_ order);
//   6. an all_gather (uneven) over ep puts the chunks together: every rank holds y [N, H].
// Per sparse layer (N >= ep tokens): two all_to_alls (rows out, results back), two all_gathers
// (the counts, the chunks), and the experts' all_reduce over tp when tp > 1. transformers' AllToAllEP exchanges the
// sizes with a third all_to_all and learns the receive order from it; the count matrix gives every
// rank the same without it.
//
// Note [Fewer tokens than ranks]
// With fewer tokens than ep ranks (decode: one token), torch.chunk leaves ranks without a chunk
// and the four collectives above each carry a row or nothing: they cost latency, not bandwidth.
// As every rank already holds all N tokens, each rank instead runs its own experts on every pair
// routed to them (by expert, then token) and one all_reduce over ep sums the partial y [N, H]
// (what the ep_router layout does for every batch; vLLM's "naive" all2all backend likewise
// all-reduces small batches): one collective per sparse layer instead of four, the same values up
// to the order in which the ranks' partial sums are added (tests: transformers' tokens and logits
// through the KV cache's one-token steps; MoeEpCollectives.PerSparseLayer counts them). From ep
// tokens on, the dispatch above runs.

#include <cstdint>

#include "absl/status/status.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/style.h"

namespace dt::nn {

// grouped_gemm: a stacked experts tensor sharded by its expert dim. The experts must divide:
// "Cannot evenly shard 6 experts across 4 expert-parallel ranks (parameter '...' f32[6, 96, 64])".
class GroupedGemmParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  absl::Status ValidateParam(const Module& module, const Parameter& param,
                             const DeviceMesh& mesh) const override;
  absl::StatusOr<Placement> ParamPlacement(const Module& module,
                                           const Parameter& param) const override;
  absl::Status InstallForward(Module& module, const DeviceMesh& mesh) const override;
};

// ep_router: on a router (TopKRouter: {x} -> {weights, ids}) whose weight is [E, H].
class RouterParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  absl::Status ValidateParam(const Module& module, const Parameter& param,
                             const DeviceMesh& mesh) const override;
  absl::StatusOr<Values> TransformOutputPostForward(Module& module, Values outputs,
                                                    const DeviceMesh& mesh) const override;
};

// ep_dispatch_experts: on an Experts module whose parameters grouped_gemm shards; Note [Dispatch
// and combine]. Identity experts are refused (they are not anyone's to own).
class EpDispatchExpertsParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  bool ShouldUseLocalTensors(const Module&) const override { return true; }
  absl::Status InstallForward(Module& module, const DeviceMesh& mesh) const override;
};

}  // namespace dt::nn
