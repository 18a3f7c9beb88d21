#include "dtensor/nn/expert_parallel.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/nn/moe.h"
#include "dtensor/ops/local/ops.h"

namespace dt::nn {
namespace {

// The experts `param` holds (its dim 0) must split evenly over the ep ranks.
absl::Status CheckExpertsDivide(absl::string_view style, const Parameter& param,
                                const DeviceMesh& mesh) {
  if (param.dim() >= 1 && param.shape()[0] % mesh.Size() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      style, ": Cannot evenly shard ", param.dim() >= 1 ? param.shape()[0] : 0, " experts across ",
      mesh.Size(), " expert-parallel ranks (parameter '", param.FullName(), "' ",
      param.Describe(), ")"));
}

absl::StatusOr<int64_t> EpRank(const DeviceMesh& mesh) {
  DT_ASSIGN_OR_RETURN(int r, mesh.LocalRank(0));
  return static_cast<int64_t>(r);
}

// The placement `param` has over the mesh dim named `dim` (Replicate when its mesh has none).
Placement PlacementOver(const Parameter& param, const std::string& dim) {
  const DTensorSpec& spec = param.spec();
  for (int d = 0; d < spec.mesh().ndim(); ++d) {
    if (spec.mesh().names()[d] == dim) return spec.placements()[d];
  }
  return Placement::Replicate();
}

// This rank's experts on `rows` (each picking local expert `local_ids`, weight 1), whatever forward
// the module has inside; the whole [rows, H] result.
absl::StatusOr<Tensor> RunOwnExperts(Module& m, const Tensor& rows, std::vector<int64_t> local_ids,
                                     const DeviceMesh& mesh, const ForwardFn& inner,
                                     const TensorParallelLayer& style, const std::string& name) {
  const int64_t count = static_cast<int64_t>(local_ids.size());
  DT_ASSIGN_OR_RETURN(Tensor local, Tensor::FromVector<int64_t>({count, 1}, local_ids));
  DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Ones({count, 1}, DType::kF32));
  absl::StatusOr<Values> out;
  {
    ForwardContext context = style.ContextAroundForward(m, mesh);
    Values in = {Value(rows), Value(local), Value(ones)};
    out = inner ? inner(m, std::move(in)) : m.RunForward(std::move(in));
  }
  if (!out.ok()) return std::move(out).status();
  if (out->empty()) return absl::InternalError(absl::StrCat(name, ": the experts gave no output"));
  DT_ASSIGN_OR_RETURN(Tensor results, WholeTensor((*out)[0]));
  return results.Contiguous();
}

// Note [Dispatch and combine] in expert_parallel.h, steps 1-6.
absl::StatusOr<Values> DispatchAndCombine(Module& m, Values inputs, const DeviceMesh& mesh,
                                          const ForwardFn& inner, int64_t experts,
                                          const TensorParallelLayer& style) {
  const std::string name = absl::StrCat("ep_dispatch_experts on '", m.FullName(), "'");
  if (inputs.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": takes {x [N, H], ids [N, k], weights [N, k]}, got ", inputs.size(), " inputs"));
  }
  DT_ASSIGN_OR_RETURN(const Tensor x, WholeTensor(inputs[0]));
  DT_ASSIGN_OR_RETURN(Tensor ids_t, WholeTensor(inputs[1]));
  DT_ASSIGN_OR_RETURN(Tensor w_t, WholeTensor(inputs[2]));
  if (x.dim() != 2 || ids_t.dim() != 2 || ids_t.size(0) != x.size(0) ||
      w_t.shape() != ids_t.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected x [N, H], ids and weights ",
                                                   "[N, k], got ", x.Describe(), ", ",
                                                   ids_t.Describe(), ", ", w_t.Describe()));
  }
  DT_ASSIGN_OR_RETURN(ids_t, ops::Cast(ids_t, DType::kI64));
  DT_ASSIGN_OR_RETURN(w_t, ops::Cast(w_t, DType::kF32));
  const std::vector<int64_t> ids = ids_t.ToVector<int64_t>();
  const std::vector<float> w = w_t.ToVector<float>();
  const int64_t n = x.size(0), h = x.size(1), k = ids_t.size(1), ep = mesh.Size();
  const int64_t per_rank = experts / ep;
  DT_ASSIGN_OR_RETURN(const int64_t me, EpRank(mesh));
  for (int64_t p = 0; p < n * k; ++p) {
    if (ids[p] < 0 || ids[p] >= experts) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expert id ", ids[p], " (token ",
                                                     p / k, ") is outside [0, ", experts, ")"));
    }
  }
  DT_ASSIGN_OR_RETURN(CommPtr comm, mesh.Comm(0));
  // Note [Fewer tokens than ranks]: this rank's experts on every token, one all_reduce.
  if (n < ep) {
    std::vector<int64_t> tokens, local_ids;
    std::vector<float> pair_weights;
    for (int64_t l = 0; l < per_rank; ++l) {  // by expert, then token: transformers' order
      for (int64_t p = 0; p < n * k; ++p) {
        if (ids[p] != me * per_rank + l) continue;
        tokens.push_back(p / k);
        local_ids.push_back(l);
        pair_weights.push_back(w[p]);
      }
    }
    const int64_t pairs = static_cast<int64_t>(tokens.size());
    DT_ASSIGN_OR_RETURN(Tensor token_ids, Tensor::FromVector<int64_t>({pairs}, tokens));
    DT_ASSIGN_OR_RETURN(Tensor rows, ops::Embedding(x, token_ids));
    DT_ASSIGN_OR_RETURN(Tensor results,
                        RunOwnExperts(m, rows, std::move(local_ids), mesh, inner, style, name));
    DT_ASSIGN_OR_RETURN(Tensor y, CombineByToken(results, tokens, pair_weights, n));
    DT_ASSIGN_OR_RETURN(y, y.Contiguous());
    DT_RETURN_IF_ERROR(comm->AllReduce(y, ReduceOp::kSum));
    return Values{Value(std::move(y))};
  }
  // 1. This rank's chunk of the tokens (torch.chunk), its pairs sorted by expert.
  const int64_t chunk = (n + ep - 1) / ep;
  const int64_t begin = std::min(n, me * chunk), end = std::min(n, begin + chunk);
  std::vector<std::vector<int64_t>> bucket(experts);
  for (int64_t p = begin * k; p < end * k; ++p) bucket[ids[p]].push_back(p);
  std::vector<int64_t> tokens, chunk_tokens;  // per sorted pair: global token, token in the chunk
  std::vector<float> pair_weights;
  std::vector<int64_t> counts(experts, 0);  // [owner, local expert]
  for (int64_t e = 0; e < experts; ++e) {
    counts[e] = static_cast<int64_t>(bucket[e].size());
    for (int64_t p : bucket[e]) {
      tokens.push_back(p / k);
      chunk_tokens.push_back(p / k - begin);
      pair_weights.push_back(w[p]);
    }
  }
  // 2. The sizes first: every rank's [ep, E/ep] counts, on every rank.
  DT_ASSIGN_OR_RETURN(Tensor mine, Tensor::FromVector<int64_t>({experts}, counts));
  DT_ASSIGN_OR_RETURN(Tensor all_t, Tensor::Empty({ep * experts}, DType::kI64));
  DT_RETURN_IF_ERROR(comm->AllGather(mine, all_t));
  const std::vector<int64_t> all = all_t.ToVector<int64_t>();  // [source, owner, local expert]
  auto count = [&](int64_t src, int64_t owner, int64_t local) {
    return all[(src * ep + owner) * per_rank + local];
  };
  std::vector<int64_t> send_counts(ep, 0), recv_counts(ep, 0), recv_ids;
  for (int64_t o = 0; o < ep; ++o) {
    for (int64_t l = 0; l < per_rank; ++l) send_counts[o] += count(me, o, l) * h;
  }
  for (int64_t s = 0; s < ep; ++s) {
    for (int64_t l = 0; l < per_rank; ++l) {
      recv_counts[s] += count(s, me, l) * h;
      recv_ids.insert(recv_ids.end(), count(s, me, l), l);
    }
  }
  const int64_t pairs = static_cast<int64_t>(tokens.size());
  const int64_t received = static_cast<int64_t>(recv_ids.size());
  // 3. Dispatch: each pair's row to its expert's rank.
  DT_ASSIGN_OR_RETURN(Tensor token_ids, Tensor::FromVector<int64_t>({pairs}, tokens));
  DT_ASSIGN_OR_RETURN(Tensor send, ops::Embedding(x, token_ids));  // [P, H], by expert
  DT_ASSIGN_OR_RETURN(Tensor recv, Tensor::Empty({received, h}, x.dtype(), x.device()));
  DT_ASSIGN_OR_RETURN(Tensor send_flat, send.View({pairs * h}));
  DT_ASSIGN_OR_RETURN(Tensor recv_flat, recv.View({received * h}));
  DT_RETURN_IF_ERROR(comm->AllToAllV(send_flat, send_counts, recv_flat, recv_counts));
  // 4. This rank's experts on what it received (top-1, weight 1), whatever forward it has inside.
  DT_ASSIGN_OR_RETURN(Tensor results,
                      RunOwnExperts(m, recv, std::move(recv_ids), mesh, inner, style, name));
  // 5. Combine: the results back to the ranks that sent the rows, weighted, summed per token.
  DT_ASSIGN_OR_RETURN(Tensor back, Tensor::Empty({pairs, h}, x.dtype(), x.device()));
  DT_ASSIGN_OR_RETURN(Tensor results_flat, results.View({received * h}));
  DT_ASSIGN_OR_RETURN(Tensor back_flat, back.View({pairs * h}));
  DT_RETURN_IF_ERROR(comm->AllToAllV(results_flat, recv_counts, back_flat, send_counts));
  DT_ASSIGN_OR_RETURN(Tensor mine_y, CombineByToken(back, chunk_tokens, pair_weights, end - begin));
  // 6. The chunks, gathered: y [N, H] on every rank.
  FromLocalOptions fo;
  fo.shape = Shape{n, h};
  DT_ASSIGN_OR_RETURN(DTensor chunks, DTensor::FromLocal(mine_y, mesh, {Placement::Shard(0)}, fo));
  DT_ASSIGN_OR_RETURN(DTensor whole, chunks.Redistribute({Placement::Replicate()}));
  return Values{Value(whole.ToLocal())};
}

}  // namespace

// ---- grouped_gemm ---------------------------------------------------------------------------------

StyleInfo GroupedGemmParallel::Info() const {
  return {"S(0) (experts)", "S(0)", "unchanged", "unchanged", "none (parameters only)"};
}

absl::Status GroupedGemmParallel::ValidateParam(const Module&, const Parameter& param,
                                                const DeviceMesh& mesh) const {
  return CheckExpertsDivide("grouped_gemm", param, mesh);
}

absl::StatusOr<Placement> GroupedGemmParallel::ParamPlacement(const Module&,
                                                              const Parameter& param) const {
  return param.dim() >= 1 ? Placement::Shard(0) : Placement::Replicate();
}

absl::Status GroupedGemmParallel::InstallForward(Module&, const DeviceMesh&) const {
  return absl::OkStatus();  // parameters only, as transformers' MoEParamShard
}

// ---- ep_router ------------------------------------------------------------------------------------

StyleInfo RouterParallel::Info() const {
  return {"R", "R", "unchanged", "off-rank ids -> E/ep, weight 0", "none"};
}

absl::Status RouterParallel::ValidateParam(const Module& module, const Parameter& param,
                                           const DeviceMesh& mesh) const {
  if (param.name() != "weight") return absl::OkStatus();
  return CheckExpertsDivide(absl::StrCat("ep_router on '", module.FullName(), "'"), param, mesh);
}

absl::StatusOr<Values> RouterParallel::TransformOutputPostForward(Module& module, Values outputs,
                                                                  const DeviceMesh& mesh) const {
  const Parameter* weight = module.FindParameter("weight");
  if (outputs.size() != 2 || weight == nullptr || weight->dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ep_router on '", module.FullName(),
        "': expects a router with a weight [E, H] that returns {weights, ids}, got ",
        outputs.size(), " outputs"));
  }
  const int64_t experts = weight->shape()[0], per_rank = experts / mesh.Size();
  DT_ASSIGN_OR_RETURN(const int64_t me, EpRank(mesh));
  DT_ASSIGN_OR_RETURN(Tensor w_t, WholeTensor(outputs[0]));
  DT_ASSIGN_OR_RETURN(Tensor ids_t, WholeTensor(outputs[1]));
  const DType dtype = w_t.dtype();
  DT_ASSIGN_OR_RETURN(Tensor wf, ops::Cast(w_t, DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor idl, ops::Cast(ids_t, DType::kI64));
  std::vector<float> w = wf.ToVector<float>();
  std::vector<int64_t> ids = idl.ToVector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] / per_rank == me) {
      ids[i] -= me * per_rank;
    } else {
      ids[i] = per_rank;  // the skip id
      w[i] = 0.0f;
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor new_w, Tensor::FromVector<float>(w_t.shape(), w));
  DT_ASSIGN_OR_RETURN(new_w, ops::Cast(new_w, dtype));
  DT_ASSIGN_OR_RETURN(Tensor new_ids, Tensor::FromVector<int64_t>(ids_t.shape(), ids));
  return Values{Value(std::move(new_w)), Value(std::move(new_ids))};
}

// ---- ep_dispatch_experts --------------------------------------------------------------------------

StyleInfo EpDispatchExpertsParallel::Info() const {
  return {"own entries", "own entries", "R -> chunk of tokens",
          "rows out and back -> R local",
          "all_to_all x2, all_gather x2 (< ep tokens: all_reduce)"};
}

absl::Status EpDispatchExpertsParallel::InstallForward(Module& module,
                                                       const DeviceMesh& mesh) const {
  const std::string name = absl::StrCat("ep_dispatch_experts on '", module.FullName(), "'");
  const auto* experts = dynamic_cast<const Experts*>(&module);
  if (experts == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the module is a ", module.type_name(), ", not Experts"));
  }
  if (experts->options().num_identity_experts > 0) {
    return absl::UnimplementedError(absl::StrCat(
        name, ": identity experts are in no rank's range; expert parallelism over them is not "
              "implemented"));
  }
  if (mesh.ndim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": needs the 1-D expert-parallel mesh, got ", mesh.ToString()));
  }
  for (const auto& p : module.parameters()) {
    if (!p->placed() || !PlacementOver(*p, mesh.names()[0]).is_any_shard(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": parameter '", p->FullName(), "' (", p->Describe(),
          ") is not split by its experts over '", mesh.names()[0],
          "'; give it grouped_gemm in the same plan"));
    }
  }
  std::shared_ptr<const TensorParallelLayer> self = weak_from_this().lock();
  if (self == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": the style must be owned by a std::shared_ptr"));
  }
  const int64_t count = experts->options().num_experts;
  ForwardFn inner = module.installed_forward();  // Note [Composed forwards]
  module.SetForward([self, mesh, inner, count](Module& m, Values inputs) {
    return DispatchAndCombine(m, std::move(inputs), mesh, inner, count, *self);
  });
  return absl::OkStatus();
}

}  // namespace dt::nn
