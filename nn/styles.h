#pragma once
// The built-in tensor-parallel styles (registered under transformers' and diffusers' names in
// nn/style_registry.h). T = tensor-parallel size; "local" = the output is this rank's piece as a
// plain tensor (use_local_output, transformers' default).
//
//   class                        params (weight | 1-D)           input -> forward -> output
//   ColwiseParallel(in, out)     S(ndim-2) | S(0);               in -> R; y S(-1) -> out
//                                Embedding: S(1)
//   RowwiseParallel(in, out)     S(ndim-1) | R (bias added       in -> S(-1); y P(sum) -> out (R:
//                                once); Embedding: S(0)          all_reduce, S(d): reduce_scatter)
//   PackedColwiseParallel(b)     _S(ndim-2, blocks) | the same   as colwise; the output stays the
//                                blocks (Note [Packed bias])     interleaved shard _S(-1, blocks)
//   PackedRowwiseParallel(b)     _S(ndim-1, blocks) | R          in -> _S(-1, blocks); P -> R
//   EmbeddingParallel(0)         table S(0) (vocab)              ids R; masked lookup P(sum) -> R
//   EmbeddingParallel(1)         table S(1) (hidden)             ids R; S(-1) -> R (all_gather)
//   SequenceParallel(d)          R                               in -> S(d); output as computed
//   AllReduceParallel            (none)                          output P(sum) -> R
//   ReplicateParallel(info)      R (replicated on purpose)       unchanged; also
//                                                                transformers' replicated_with_
//                                                                grad_allreduce, mla_kv_a_proj
//                                                                (Note [Inference only])
//   LocalParamsParallel          own plan entries                forward on local tensors
//   MoEExpertsParallel           own plan entries                in -> R -> local; P(sum) -> R
//   MoEIdentityParallel          (none)                          in R -> P(sum), i.e. x / T
//   uneven colwise / rowwise     as colwise / rowwise, split in  as colwise / rowwise, the
//   (whole_units)                whole units: S(0,unit=u) /      shards S(-1,unit=u)
//                                S(1,unit=u) (Note [Uneven heads])
//   UnitParallel(col)            [S(0), R] on the unit mesh      in -> R; y [S(-1), R] local
//   UnitParallel(row)            [S(1), R] | [R, R]              in -> [S(-1), R]; y [P, R] ->
//                                (Note [Unit meshes])            [R, R] local (all_reduce over
//                                                                the unit dim)
//
// Note [Packed blocks]
// A packed weight concatenates logical blocks along one dim (gate | up; q | k | v | gate | up).
// Its placement is an interleaved block shard `_S(d, [b0, b1, ...])` (transformers' split factor
// 2 is the blocks [n/2, n/2]), so that each rank holds its slice of every block, local
// chunk()/split() by the block ratio stay aligned, and FullTensor() returns the checkpoint layout
// (diffusers labels these shards Shard(0) and gathers them permuted). Block sizes come from the
// plan as proportions (diffusers' PackedColwiseParallel([1, 1, 1, 3, 3])) or, when the plan gives
// none, from the module (Module::PackedBlocks: Linear's packed_col_blocks / packed_row_blocks,
// diffusers' `_tp_packed_*_blocks`); with neither it is an error, never a guess (Note [Packed
// blocks must be declared]; transformers' two equal halves are the plan proportions {1, 1}).
// Every block must be divisible by T on its own: a block split unevenly would leave ranks with
// unequal pieces of q/k/v or gate/up.
//
// Note [Packed bias]
// transformers G3 gives a packed 1-D parameter a plain Shard(-1), which slices a packed bias
// across block boundaries (harmless only because its packed projections have no bias). Here a
// packed_colwise bias follows its weight's blocks (as diffusers slices it), so a fused gate|up
// bias stays aligned with the weight rows.
//
// Note [DTensor forwards]
// transformers G3 gives plain nn.Linear layers a local fast path under no_grad (its DTensor
// dispatch is slow in Python) with an explicit dist.all_reduce and the rowwise bias stashed and
// added after it. Here the built-in styles run their module on DTensors (dt::ops on DTensors: the
// choice of strategy is cached, the rowwise bias is added once by the Linear rule) and every
// reduction is a Redistribute(P(sum) -> R); only local_params and moe_tp_experts compute on local
// tensors, and they turn local partial sums into DTensors (FromLocal as P(sum)) before reducing
// them.
//
// Note [Embedding colwise]
// transformers G2 coded embedding_colwise (hidden dim sharded) with an all-reduce of the output,
// which sums disjoint column slices into the wrong values; its docs (and PyTorch's
// ColwiseParallel on an Embedding) gather them. Here the output S(-1) is redistributed to R: one
// all_gather.
//
// Note [Annotating local inputs]
// PyTorch annotates a local input as its declared layout assuming an even split. A Linear knows
// its global in_features, so row-wise styles annotate with the exact global shape: a colwise ->
// rowwise pair over an uneven split (10 features on 4 ranks: 3, 3, 3, 1) works with local
// hand-offs. Styles without such knowledge (sequence_parallel) keep PyTorch's even assumption;
// pass a DTensor for uneven sequence shards.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dtensor/placement.h"
#include "dtensor/nn/style.h"

namespace dt::nn {

// Note [Uneven heads]
// colwise / rowwise with whole_units (registered as uneven_colwise / uneven_rowwise) split a
// projection in whole units — the unit the module declares (Module::ShardUnit: head_dim on
// nn::Attention's projections) — as torch.chunk over the units: the parameter is S(0,unit=u)
// (rowwise S(1,unit=u); a colwise bias S(0,unit=u)), so SmolLM2's 9 query heads on 2 ranks are 5
// + 4 and at tp 4 3 + 3 + 3 + 0 (torch.chunk leaves the last rank idle). The forwards are
// colwise's and rowwise's: the sharded output / input is S(-1,unit=u), read from the placed
// weight (Note [Unit shards] in dtensor/placement.h), so a colwise -> rowwise pair hands its
// uneven pieces on locally. With units divisible by tp they place exactly what colwise / rowwise
// place, in other words. The load imbalance (ranks computing more heads than others) is the
// price: the slowest rank sets the pace, which the model's load report states.

// What colwise and rowwise share: the layouts declared for the module's input and output,
// use_local_output, and whether the split keeps the module's units whole (Note [Uneven heads]).
class LayoutParallel : public TensorParallelLayer {
 protected:
  LayoutParallel(Placement input_layout, Placement output_layout, bool use_local_output,
                 bool whole_units)
      : input_layout_(std::move(input_layout)),
        output_layout_(std::move(output_layout)),
        use_local_output_(use_local_output),
        whole_units_(whole_units) {}
  // S(dim), or with whole_units S(dim,unit=u) for the unit the module declares (an error naming
  // the module when it declares none, or when the dim is not whole units).
  absl::StatusOr<Placement> Split(const Module& module, const Parameter& param, int dim,
                                  bool col) const;

  Placement input_layout_;
  Placement output_layout_;
  bool use_local_output_;
  bool whole_units_;
};

class ColwiseParallel : public LayoutParallel {
 public:
  explicit ColwiseParallel(Placement input_layout = Placement::Replicate(),
                           Placement output_layout = Placement::Shard(-1),
                           bool use_local_output = true, bool whole_units = false)
      : LayoutParallel(std::move(input_layout), std::move(output_layout), use_local_output,
                       whole_units) {}
  StyleInfo Info() const override;
  bool ShardsOutput() const override { return output_layout_.is_any_shard(); }
  // With a replicated output (the gathered vocab of lm_head), the sharded size must divide by T:
  // "The output size of `lm_head` (10) must be divisible by the tensor parallel size (4) when
  //  gathering a colwise output." (transformers' wording). With a sharded output, a layer with
  // packed output blocks needs packed_colwise (Note [Plain styles on packed layers]).
  DT_STYLE_PARAM_HOOKS;
  DT_STYLE_FORWARD_HOOKS;
};

class RowwiseParallel : public LayoutParallel {
 public:
  explicit RowwiseParallel(Placement input_layout = Placement::Shard(-1),
                           Placement output_layout = Placement::Replicate(),
                           bool use_local_output = true, bool whole_units = false)
      : LayoutParallel(std::move(input_layout), std::move(output_layout), use_local_output,
                       whole_units) {}
  StyleInfo Info() const override;
  // A layer with packed input blocks needs packed_rowwise (Note [Plain styles on packed layers]).
  DT_STYLE_PARAM_HOOKS;
  DT_STYLE_FORWARD_HOOKS;
};

// What packed_colwise and packed_rowwise share (Note [Packed blocks]): the blocks — proportions
// from the plan ({1, 1}: halves), or when empty the module's declared blocks (Module::PackedBlocks,
// Linear::set_packed_col_blocks), else an error (Note [Packed blocks must be declared]) — and the
// parameters' interleaved block shards along the output rows (col) or the input columns.
class PackedParallel : public TensorParallelLayer {
 public:
  DT_STYLE_PARAM_HOOKS;

 protected:
  PackedParallel(const char* name, bool col, std::vector<int64_t> blocks, bool use_local_output)
      : name_(name), col_(col), blocks_(std::move(blocks)), use_local_output_(use_local_output) {}
  // The weight column of Info(): "_S(d,[declared blocks])" or "_S(d,[blocks] scaled)".
  std::string WeightInfo() const;

  const char* name_;  // the style's name, for errors
  bool col_;
  std::vector<int64_t> blocks_;
  bool use_local_output_;
};

class PackedColwiseParallel : public PackedParallel {
 public:
  explicit PackedColwiseParallel(std::vector<int64_t> blocks = {}, bool use_local_output = true)
      : PackedParallel("packed_colwise", /*col=*/true, std::move(blocks), use_local_output) {}
  StyleInfo Info() const override;
  bool ShardsOutput() const override { return true; }
  DT_STYLE_FORWARD_HOOKS;
};

// diffusers' semantics (row-wise hooks: all_reduce of the output); transformers G3's
// PackedRowwiseParallel places parameters only.
class PackedRowwiseParallel : public PackedParallel {
 public:
  explicit PackedRowwiseParallel(std::vector<int64_t> blocks = {}, bool use_local_output = true)
      : PackedParallel("packed_rowwise", /*col=*/false, std::move(blocks), use_local_output) {}
  StyleInfo Info() const override;
  DT_STYLE_FORWARD_HOOKS;
};

// shard_dim 0: vocab rows (embedding_rowwise: each rank looks up the ids it owns, zero rows for
// the others, then all_reduce); 1: hidden columns (embedding_colwise: all_gather).
class EmbeddingParallel : public TensorParallelLayer {
 public:
  explicit EmbeddingParallel(int shard_dim, bool use_local_output = true);
  StyleInfo Info() const override;
  DT_STYLE_PARAM_HOOKS;
  DT_STYLE_FORWARD_HOOKS;

 private:
  int shard_dim_;
  bool use_local_output_;
};

class SequenceParallel : public TensorParallelLayer {
 public:
  explicit SequenceParallel(int sequence_dim = 1, bool use_local_output = true);
  StyleInfo Info() const override;
  DT_STYLE_FORWARD_HOOKS;

 private:
  int sequence_dim_;
  bool use_local_output_;
};

// Reduces a module whose outputs are partial sums: every output (a local tensor is taken as this
// rank's P(sum) term) -> R.
class AllReduceParallel : public TensorParallelLayer {
 public:
  explicit AllReduceParallel(bool use_local_output = true) : use_local_output_(use_local_output) {}
  StyleInfo Info() const override;
  absl::StatusOr<Values> TransformOutputPostForward(Module& module, Values outputs,
                                                    const DeviceMesh& mesh) const override;

 private:
  bool use_local_output_;
};

// Runs the forward on local tensors: the module's own parameters (sharded by their own plan
// entries) as local pieces, DTensor inputs as their local pieces. For owners of bare parameters
// (attention sinks) whose forward is written for local shards.
class LocalParamsParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  bool ShouldUseLocalTensors(const Module&) const override { return true; }
  absl::StatusOr<Values> TransformInputsPreForward(Module& module, Values inputs,
                                                   const DeviceMesh& mesh) const override;
};

// Replicated on purpose: parameters R, the forward unchanged. A `replicate` rule covers the
// module's parameters, so they are not reported as "not sharded by the TP plan", and the plan
// says what the model means (norms, small embeddings, AdaLN modulation). `info` is what the
// style table says of it: transformers' styles that differ from replication only in backward are
// this style under their own names (Note [Inference only]).
class ReplicateParallel : public TensorParallelLayer {
 public:
  explicit ReplicateParallel(StyleInfo info = {"R", "R", "unchanged", "unchanged",
                                               "none (replicated on purpose)"})
      : info_(std::move(info)) {}
  StyleInfo Info() const override { return info_; }
  absl::Status InstallForward(Module& module, const DeviceMesh& mesh) const override;

 private:
  StyleInfo info_;
};

// Note [Inference only]
// The runtime has no autograd. Two of transformers' styles differ from replication only in
// backward, and are ReplicateParallel here (parameters Replicate, the forward unchanged), so that
// plans written for transformers load and run and nothing claims to synchronize gradients:
// - replicated_with_grad_allreduce (ReplicatedWithGradAllReduce) all-reduces the parameters'
//   gradients in a backward hook (q/k norms between colwise and rowwise projections);
// - mla_kv_a_proj (MlaKvAProjParallel) is on DeepSeek's kv_a_proj_with_mqa (nn/latent_attention.h),
//   whose output is split into the compressed KV and the RoPE key every head shares, so it stays
//   whole on every rank; transformers all-reduces the RoPE key's gradient in backward (each
//   rank's heads see only their share of it).

// The experts of a mixture of experts, tensor-parallel inside each expert: parameters come from
// their own entries (gate_up_proj packed_colwise, down_proj rowwise); the forward runs on local
// tensors (inputs replicated first) and, when any parameter is sharded, the partial output is
// reduced (P(sum) -> R).
class MoEExpertsParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  bool ShouldUseLocalTensors(const Module&) const override { return true; }
  DT_STYLE_FORWARD_HOOKS;
};

// Note [Unit meshes]
// transformers' unit_colwise / unit_rowwise split a projection by whole units (attention heads)
// also when tp does not divide them: the T tp ranks are viewed as a (G, T/G) mesh, G =
// gcd(units, T), named (tp, unit_replicate) (transformers' get_unit_mesh), and the parameter is
// [S(d), R] on it: each of the G groups of consecutive ranks holds one block of units / G whole
// heads, the same on the T/G ranks of its group.
//
//   2 KV heads on 4 ranks (G = 2)      rank 0: h0   rank 1: h0   rank 2: h1   rank 3: h1
//   6 KV heads on 4 ranks (G = 2)      h0-h2        h0-h2        h3-h5        h3-h5
//   8 KV heads on 4 ranks (G = 4)      h0-h1        h2-h3        h4-h5        h6-h7 (colwise)
//
// unit_colwise (q, k, v) takes its input replicated and hands on this rank's units, a piece of
// [S(-1), R] on the unit mesh; Attention pairs its query heads with the KV heads they use (Note
// [Replicated KV heads] in nn/attention.cc), which a rank's unit block always contains when the
// query heads are split into at least as many groups. unit_rowwise (o_proj) takes this rank's
// units of its input and reduces the partial sums over the unit dim only ([P, R] -> [R, R]: one
// all_reduce among the ranks of one replica index; the replicas hold the same sum and are not
// added twice); its bias is added once. With G = T they compute what colwise / rowwise compute.
// The unit size comes from the module (Module::ShardUnit: Attention declares head_dim on its
// projections, 2 · head_dim on a gated q|gate), never from a guess; a module that declares none
// is refused. Every style's mesh is the 1-D tp mesh, so the unit mesh is made from it
// (UnitMesh), over the same ranks: its groups are the World's cached groups of those ranks.
class UnitParallel : public TensorParallelLayer {
 public:
  explicit UnitParallel(bool col, bool use_local_output = true)
      : col_(col), use_local_output_(use_local_output) {}
  StyleInfo Info() const override;
  bool ShardsOutput() const override { return col_; }
  absl::StatusOr<Placement> ParamPlacement(const Module& module,
                                           const Parameter& param) const override;
  absl::Status ShardParam(Module& module, Parameter& param, const DeviceMesh& mesh) const override;
  int64_t ParamPieces(const Module& module, const Parameter& param, int64_t tp) const override;
  DT_STYLE_FORWARD_HOOKS;

 private:
  // The units of `param` along the split dim, or an error naming the module.
  absl::StatusOr<int64_t> Units(const Module& module, const Parameter& param) const;

  bool col_;
  bool use_local_output_;
};

// The (G, T/G) unit view of the 1-D mesh `tp` for `units` units, G = gcd(units, T) (Note [Unit
// meshes]); dims named (tp's name, "unit_replicate").
absl::StatusOr<DeviceMesh> UnitMesh(const DeviceMesh& tp, int64_t units);

// An identity ("zero computation") expert inside moe_tp_experts: its input becomes a P(sum) of x
// (Replicate -> Partial divides by T), so the experts' reduction adds x exactly once.
class MoEIdentityParallel : public TensorParallelLayer {
 public:
  StyleInfo Info() const override;
  DT_STYLE_FORWARD_HOOKS;
};

}  // namespace dt::nn
