#pragma once
// dt::ops on DTensors: the overloads of the public ops of ops/local/ops.h that take DTensors (the
// third overload, on Values, is in ops/value_ops.h; ops/ops.h includes all three). Each op looks at
// its inputs' placements, picks a sharding strategy (a placement list for every input and every
// output), moves only the inputs whose placements differ from the strategy's
// (DTensor::Redistribute), runs the local kernel on this rank's pieces and returns DTensors with
// the strategy's output placements. This is PyTorch's sharding propagation
// (torch.distributed.tensor._ops) in C++, with its known failures fixed (Note [Sharding
// propagation] in ops/dispatch.cc; which strategy the last op chose: ops::LastDecision there).
//
// Contract shared by every function here
//   - All DTensor inputs live on one mesh (DeviceMesh equality) and every member of the mesh calls
//     the op with the same arguments (shapes, placements, attributes), like any collective.
//   - Strategy choice: per mesh dim the op's rule lists candidate placements (table below); the
//     candidates are combined over mesh dims, filtered (valid for the shapes, uneven shards
//     included), and the one with the least redistribution cost (dtensor/planner.h's cost model)
//     wins; on a tie the one that moves fewer inputs, so no redistribution happens whenever a
//     strategy needing none exists. The choice is cached per thread by op, input specs (mesh shape,
//     placements, shape, dtype) and every attribute, scalars included (PyTorch #147180).
//   - Results are exact layouts: the FullTensor() of a result equals the local op applied to the
//     inputs' FullTensor()s (up to floating-point summation order where Partial sums are reduced).
//   - Partial inputs: ops linear in an input keep Partial(sum|avg) (table); every other op first
//     reduces them (all_reduce, or reduce_scatter when that is cheaper: the output is then sharded).
//   - Errors are InvalidArgument naming the op and the placements, never a silently wrong layout:
//       "Linear: x [S(0)] on mesh(tp=4) and w [S(1)] on mesh(dp=4): inputs are on different meshes"
//       "ScaledDotProductAttention: q [S(1)], k [S(1)] and v [S(1)] on mesh(tp=4) split the heads
//        inconsistently for GQA (q heads 8, kv heads 2): rank 1 (1) holds q heads [2, 4) but kv
//        heads [1, 2) (it needs [0, 1))"
//     Shape and dtype errors name the op and the global shapes, as in ops/local. Nothing throws.
//   - A rank outside the mesh gets outputs with the right specs and empty local tensors, and
//     communicates nothing. CUDA DTensors (local pieces on a GPU, mesh communicators on that device)
//     run the CUDA kernels of ops/local unchanged.
//   - Optional DTensor arguments are passed as DTensor() (undefined) to mean "none".
//
// Rule table, per mesh dim (k = that mesh dim's size; "S" also stands for interleaved shards
// _S(d, ...) carried by an input, whenever the op keeps the dim's size; R -> R always exists):
//
//   op                    input placements -> output                     communication if inputs fit
//   Matmul a·b            S(m),R -> S(m); R,S(n) -> S(n); S(batch) both  none
//                         S(k),S(k) -> P(sum)  (contracting dim)          none (result is Partial)
//                         P,R -> P; R,P -> P (linear in each operand)     none
//   Linear x·wᵀ+b         x R, w S(0), b S(0) -> S(-1)   (colwise)        none
//                         x S(-1), w S(1), b R -> P(sum) (rowwise; b is   none (result is Partial)
//                         added by group rank 0 only: exact, once)
//                         x S(batch), w R -> S(batch); x P -> P
//   Add Sub               same S on both (broadcast dims R) -> S          none
//                         P+P -> P; P+R, R+P -> P (sum: R added once,     none
//                         by group rank 0; avg: by every rank)
//   Mul Div (tensor)      same S -> S; P*R, R*P, P/R -> P                  none
//   Add Sub (scalar)      S -> S; P(sum): s added once; P(avg|max|min): s added everywhere
//   Mul Div (scalar)      S -> S; P(sum|avg) -> P; P(max|min) keeps (s > 0) or swaps (s < 0)
//   Neg                   S -> S; P(sum|avg) -> P; P(max) <-> P(min)
//   Gelu, DT_UNARY_OPS    S -> S (P is reduced first); DT_UNARY_OPS: Silu, Exp, ... (ops/local/ops.h)
//   Sqrt, Cast            S -> S; Cast float->float keeps P
//   Modulate              x, scale, shift S on a common dim -> S (broadcast dims R); P reduced
//   GatedActivation       gate, up S on a common dim -> S; gate R, up P -> P (linear in up)
//   Sum Mean (dim d)      S(d) -> P(sum) (Mean divides by the global size); S(e != d) -> S;
//                         P(sum|avg) -> P
//   Max (dim d)           S(d) -> P(max) (empty shards hold the lowest value); P(max) -> P(max)
//   Argmax (dim d)        S(e != d) -> S; d must be whole (R)
//   Softmax LogSoftmax    S(e != d) -> S; d must be whole
//   RmsNorm LayerNorm     x S(e != last) -> S; last dim whole; weight, bias R
//   ApplyRotary           x, cos, sin S on a common non-last dim -> S (broadcast dims R);
//                         x P(sum|avg) with cos, sin R -> P
//   ScaledDotProduct-     q, k, v, out S(0) (batch); q, k, v S(1) (heads, GQA-consistent:
//   Attention             checked); q S(1) with k, v R (kv heads picked locally); q S(2)
//                         (queries) with k, v R (causal offsets adjusted)
//   Embedding             table S(0) (vocab, contiguous), ids R -> P(sum) (masked lookup with
//                         the rank's row offset); table S(1) -> S(-1); ids S(d) -> S(d);
//                         table P -> P
//   View Reshape Flatten  S(d) -> S(d') when d maps to an output dim of the same size, or d is
//                         the outermost dim of a merged/split group and every rank's piece is
//                         the same elements before and after (checked for every rank, uneven
//                         shards included: PyTorch #179502); otherwise d is gathered first; P -> P
//   Transpose Permute     S(d) -> S(perm(d)); P -> P                     none, ever
//   Unsqueeze Squeeze     S(d) -> S(d') (a sharded size-1 dim is gathered before Squeeze); P -> P
//   Cat (dim d)           same placements on all inputs, S(e != d) -> S; P -> P;
//                         S(d) (one mesh dim) -> _S(d, [n0, n1, ...]) (each rank concatenates its
//                         pieces: exact, no communication)
//   Split Chunk (dim d)   S(e != d) -> S; P -> P; _S(d, blocks) -> _S(d, sub-blocks) when every
//                         piece is a run of whole blocks (Flux2's fused qkv|mlp split)
//   TopK (dim d)          S(e != d) -> S for values and indices; d must be whole
//
// Example (tp = 4, x [T, H] replicated, w_up [I, H] S(0), w_down [H, I] S(1)):
//   auto h = ops::Linear(x, w_up).value();              // [T, I]  S(1): no communication
//   auto a = ops::Silu(h).value();                      // [T, I]  S(1)
//   auto y = ops::Linear(a, w_down).value();            // [T, H]  P(sum)
//   auto z = y.Redistribute({Placement::Replicate()}).value();  // one all_reduce

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

// ---- the ops ------------------------------------------------------------------------------------

// One overload per row of DT_OPS and DT_DECLARED_OPS (ops/local/ops.h, where each op is
// described), DTensor for Tensor: Matmul(a, b, trans_a = false, trans_b = false), Linear(x, w,
// bias = DTensor()), Add(a, b), Add(x, s), Silu(x), Sum(x, dim, keepdim = false), Softmax(x, dim),
// RmsNorm(x, weight = DTensor(), eps = 1e-6), ScaledDotProductAttention(q, k, v, options = {}),
// Embedding(table, ids) (an id outside [0, V) yields a zero row, as on Tensors), Split(x, sizes,
// dim) -> std::vector<DTensor>, TopK(x, k, dim = -1, largest = true) -> TopKOf<DTensor> (indices
// global along dim), ...
#define DT_DTENSOR_PARAM_In(n) , const DTensor& n
#define DT_DTENSOR_PARAM_Opt(n) , const DTensor& n = DTensor()
#define DT_DTENSOR_PARAM_Attr(type, n, ...) , type n __VA_OPT__(= __VA_ARGS__)
#define DT_DTENSOR_OP_(name, params, call, ...) \
  absl::StatusOr<DT_ROW_RESULT(DTensor, __VA_ARGS__)> name(DT_ROW_LIST(DT_DTENSOR_PARAM_, params));
#define DT_DTENSOR_DECLARED_OP_(name, params) DT_DTENSOR_OP_(name, params, )
DT_OPS(DT_DTENSOR_OP_)
DT_DECLARED_OPS(DT_DTENSOR_DECLARED_OP_)

// ---- shape ops -----------------------------------------------------------------------------------

// The view ops, on DTensors only: a Tensor has them as methods (core/tensor.h), and the Value
// forms that layers use are written by hand (ops/value_ops.h). Rows as those of DT_OPS (grammar:
// ops/local/op_rows.h):
//   View Reshape(x, shape)   the same op: the local piece is reshaped, copying only when its
//                            strides require; one -1 allowed
//   Flatten(x, start_dim = 0, end_dim = -1), Transpose(x, dim0, dim1), Permute(x, dims),
//   Unsqueeze(x, dim), Squeeze(x, dim) (dim must have size 1)
#define DT_LAYOUT_OPS(X)                                                                          \
  X(View, (DT_IN(x), DT_ATTR(IntSpan, shape)), View("View", x, shape))                            \
  X(Reshape, (DT_IN(x), DT_ATTR(IntSpan, shape)), View("Reshape", x, shape))                      \
  X(Flatten, (DT_IN(x), DT_ATTR(int64_t, start_dim, 0), DT_ATTR(int64_t, end_dim, -1)),           \
    Flatten(x, start_dim, end_dim))                                                               \
  X(Transpose, (DT_IN(x), DT_ATTR(int64_t, dim0), DT_ATTR(int64_t, dim1)),                        \
    Transpose(x, dim0, dim1))                                                                     \
  X(Permute, (DT_IN(x), DT_ATTR(IntSpan, dims)), Permute("Permute", x, dims))                     \
  X(Unsqueeze, (DT_IN(x), DT_ATTR(int64_t, dim)), Unsqueeze(x, dim))                              \
  X(Squeeze, (DT_IN(x), DT_ATTR(int64_t, dim)), Squeeze(x, dim))
DT_LAYOUT_OPS(DT_DTENSOR_OP_)
#undef DT_DTENSOR_DECLARED_OP_
#undef DT_DTENSOR_OP_
#undef DT_DTENSOR_PARAM_In
#undef DT_DTENSOR_PARAM_Opt
#undef DT_DTENSOR_PARAM_Attr

// Concatenation along dim (a variable number of inputs, so no row).
absl::StatusOr<DTensor> Cat(absl::Span<const DTensor> tensors, int64_t dim);
// A braced list of DTensors picks this overload rather than the Value one (ops/local/ops.h, Cat).
inline absl::StatusOr<DTensor> Cat(std::initializer_list<DTensor> tensors, int64_t dim) {
  return Cat(absl::MakeConstSpan(tensors.begin(), tensors.size()), dim);
}

}  // namespace dt::ops
