#pragma once
// Local (single-device) tensor operations: the kernels every higher layer runs on its shard.
// These are the Tensor overloads of the public op namespace dt::ops; the DTensor ones are in
// ops/dtensor_ops.h, the Value ones in ops/value_ops.h, and ops/ops.h includes all three.
//
// Every op that runs on DTensors too is one row of DT_OPS (below, section by section; the grammar
// is ops/local/op_rows.h): X(Name, its parameters, the call builder that makes its DTensor call).
// A row is the declaration of Name on Tensors here (defined in ops/local/<family>.cc) and its
// overloads on DTensors (ops/dtensor_ops.h) and on Values (ops/value_ops.h), which run the op's
// declaration (ops/op_decl.h). A row of DT_DECLARED_OPS (at the end) is all of that and more:
// its Tensor overload runs the declaration too, and its call builder, attributes and kernels'
// signatures come from the row (docs/ops.md, "Adding an op").
//
// Contract shared by every function here
//   - Inputs may be any strided view (transposed, narrowed, expanded); outputs are freshly allocated,
//     contiguous, on the inputs' device (all tensor inputs must share one device). Views-returning
//     ops (Split, Chunk) say so.
//   - Float ops accept f32, bf16 and f16; bf16/f16 are computed with f32 arithmetic and accumulation
//     and rounded once (round to nearest even) when stored. Tensor-tensor ops need equal dtypes (no
//     implicit promotion): cast first with Cast.
//   - Bad input (shapes, dtypes, dims, devices, undefined tensors) gives InvalidArgument naming the
//     op and the values: "Matmul: inner dims differ: a f32[2, 3] cpu, b f32[4, 5] cpu (3 vs 4)".
//     A cuda tensor in a build without CUDA gives FailedPrecondition. Nothing throws or aborts.
//   - Optional tensor arguments are passed as an undefined Tensor (Tensor()) to mean "none".
//   - Dims may be negative (counted from the end), as in PyTorch.
//
//   op                        dtypes                 notes
//   Matmul, Linear            f32 bf16 f16           batch dims broadcast; Linear's w may be
//                                                    quantized (q8_0 ... q6_k, CPU)
//   Add Sub Mul               all but bool           numpy broadcasting; integers wrap (two's complement)
//   Div                       f32 bf16 f16
//   Neg                       all but bool
//   Gelu, DT_UNARY_OPS rows   f32 bf16 f16           Silu, Exp, ...: the list below
//   Modulate                  f32 bf16 f16           x * (1 + scale) + shift, broadcast
//   SoftCap                   f32 bf16 f16           cap * tanh(x / cap) (ops/value_ops.h)
//   GatedActivation           f32 bf16 f16           act(gate) * up (SwiGLU)
//   Cast                      any -> any             quantized -> element dtypes dequantizes
//   Sum Max Argmax            all but bool           Sum of integers is i64; Argmax is i64
//   Mean                      f32 bf16 f16
//   Softmax LogSoftmax        f32 bf16 f16           f32 internally
//   RmsNorm LayerNorm         f32 bf16 f16           over the last dim
//   ApplyRotary               f32 bf16 f16
//   ScaledDotProductAttention f32 bf16 f16           GQA, causal, KV-cache prefix; k, v of
//                                                    their own dtype on the CPU
//   PagedAttentionInto        f32 bf16 f16           many sequences over KV pages (CPU)
//   Embedding                 any table; i64/i32 ids a quantized table gives f32 rows
//   Cat Split Chunk Pad       any
//   TopK                      all but bool
//
// Example
//   auto y = ops::Linear(x, w, b).value();                 // x [T, in], w [out, in] -> [T, out]
//   auto p = ops::Softmax(y, -1).value();
//   auto [v, i] = ops::TopK(p, 5, -1).value();

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/op_rows.h"

namespace dt::ops {

// ---- GEMM ----------------------------------------------------------------------------------------

// Matmul(a, b, trans_a, trans_b): a [..., M, K] · b [..., K, N] -> [..., M, N]; batch dims
// broadcast (numpy rules). trans_a means a is given as [..., K, M] (and is used transposed),
// likewise trans_b: b given as [..., N, K]. Both operands need at least 2 dims. GEMM runs in f32
// (bf16/f16 are converted, multiplied, rounded; on CPUs with AVX512_BF16, bf16 products read
// denormal inputs as zero and flush denormal sums: Note [bf16 dot products] in
// cpu/gemm_kernels.cc).
//
//   a          b          trans_a trans_b  out
//   [2, 3]     [3, 4]     no      no       [2, 4]
//   [8, 2, 3]  [3, 4]     no      no       [8, 2, 4]
//   [5, 1, 2, 3] [7, 4, 3] no     yes      [5, 7, 2, 4]
//
// Linear(x, w, bias): y = x · wᵀ + bias: x [..., in], w [out, in], bias [out] or undefined ->
// [..., out] (torch Linear). The bias is added in f32 before the single rounding. A quantized w
// (contiguous, on the CPU; Note [Quantized dtypes] in core/quant.h) is multiplied as it is stored,
// against x quantized to 16-bit integers per 32-element block (Note [Quantized GEMM] in
// cpu/qgemm.cc); the result has x's dtype.
#define DT_GEMM_OPS(X)                                                                          \
  X(Matmul, (DT_IN(a), DT_IN(b), DT_ATTR(bool, trans_a, false), DT_ATTR(bool, trans_b, false)), \
    Matmul(a, b, trans_a, trans_b))                                                             \
  X(Linear, (DT_IN(x), DT_IN(w), DT_OPT(bias)), Linear(x, w, bias))

// Note [Sibling projections]
// {Linear(x, ws[0]), Linear(x, ws[1]), ...}: the projections that read one x (q, k and v; gate and
// up), computed together and equal to those calls. When every w is quantized, x is quantized once
// and the rows of all the weights are split among the threads in one fork-join: at decode (one
// row of x) the threads join once instead of three times, and small products (SmolLM2's k_proj
// and v_proj read 69 KB each) share the threads with the large ones. Otherwise one Linear per w.
absl::StatusOr<std::vector<Tensor>> Linears(const Tensor& x, absl::Span<const Tensor> ws);

// ---- pointwise -----------------------------------------------------------------------------------

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };

// The float unary ops, each declared once: X(Name, its value at v, in f32). A row is the enumerator
// UnaryOp::kName, the CPU and CUDA kernels' formula (the argument v is a float; use the f32 C
// functions: expf, tanhf, erff, sqrtf), and a row of DT_OPS: the public op dt::ops::Name(x) on
// Tensors here, on DTensors (ops/dtensor_ops.h) and on Values (ops/value_ops.h). All of them run
// float dtypes only (f32, bf16, f16; computed in f32, rounded once), keep the shape, and on
// DTensors take a sharded x as it is and reduce a Partial one first. Adding one: CONTRIBUTING.md,
// "Adding a pointwise op".
#define DT_UNARY_OPS(X)                                                                          \
  X(Silu, v / (1.0f + expf(-v)))  /* x * sigmoid(x) */                                          \
  X(Exp, expf(v))                                                                                \
  X(Rsqrt, 1.0f / sqrtf(v))                                                                      \
  X(Sqrt, sqrtf(v))                                                                              \
  X(Relu, v < 0.0f ? 0.0f : v)  /* max(x, 0); `v < 0` is false for NaN, which stays NaN */       \
  X(Sigmoid, 1.0f / (1.0f + expf(-v)))  /* DeepSeek-V3's router scores, gated attention */     \
  X(Tanh, tanhf(v))  /* Gemma 2's logit soft-capping (SoftCap) */
// The two forms of Gelu, which Gelu(x, approx) picks between (no function of their own).
#define DT_GELU_OPS(X)                                                                          \
  X(GeluTanh, 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))))    \
  X(GeluErf, 0.5f * v * (1.0f + erff(v * 0.7071067811865476f)))

#define DT_UNARY_ENUMERATOR_(name, formula) k##name,
// kNeg also runs integers (wrapping); the others are the rows above.
enum class UnaryOp : uint8_t { kNeg, DT_GELU_OPS(DT_UNARY_ENUMERATOR_) DT_UNARY_OPS(DT_UNARY_ENUMERATOR_) };
#undef DT_UNARY_ENUMERATOR_
// Every UnaryOp, for tests and loops.
#define DT_UNARY_VALUE_(name, formula) UnaryOp::k##name,
inline constexpr std::array kAllUnaryOps = {UnaryOp::kNeg, DT_GELU_OPS(DT_UNARY_VALUE_)
                                             DT_UNARY_OPS(DT_UNARY_VALUE_)};
#undef DT_UNARY_VALUE_

// The op's name in messages: "Add", "Neg", "Silu", "Gelu(tanh)", "Gelu" (the erf form).
const char* BinaryOpName(BinaryOp op);
const char* UnaryOpName(UnaryOp op);
enum class GeluApproximation : uint8_t { kNone, kTanh };  // kNone: exact (erf), PyTorch's default

// Add Sub Mul Div(a, b): tensor-tensor with numpy broadcasting: [4, 1, 3] + [2, 1] -> [4, 2, 3].
// Add Sub Mul Div(x, s): tensor-scalar (x op s); the result keeps x's dtype. On integer tensors s
// must be integral. Binary(op, ...): either, the op an argument.
// Neg(x); the rows of DT_UNARY_OPS; Gelu(x, approx): kNone: 0.5 x (1 + erf(x/√2)); kTanh:
// 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))). Unary(op, x): any of them, the op an argument.
//
// Cast(x, dtype): x converted to `dtype`: round to nearest even into bf16/f16; float -> integer
// truncates toward zero (beyond the i64 range it saturates, NaN gives 0, then it wraps to the
// width: -1.5 -> u8 is 255); anything -> bool is x != 0. Contiguous; may return x itself when
// nothing changes.
//
// Modulate(x, scale, shift): Flux2's AdaLN modulation in one pass: x * (1 + scale) + shift, scale
// and shift broadcast to x (x [B, S, D] with scale, shift [B, 1, D]); one float dtype. Rounded to
// the dtype after each of the three steps, as the three separate ops (diffusers'
// `norm(x) * (1 + scale) + shift`) round, so the result is bit-identical to them in every dtype.
//
// GatedActivation(gate, up, act): act(gate) * up in one pass over both: SwiGLU (act kSilu), GeGLU
// (kGeluErf, kGeluTanh), ReGLU (kRelu); gate and up of one shape and float dtype, any layout (the
// two halves of a packed gate|up projection are read where they lie). act(gate) is rounded to the
// dtype before the product, as the two separate ops round, so the result equals
// Mul(Unary(act, gate), up) bit for bit in every dtype.
#define DT_POINTWISE_OPS(X)                                                                      \
  X(Add, (DT_IN(a), DT_IN(b)), Binary(ops::BinaryOp::kAdd, a, b))                               \
  X(Sub, (DT_IN(a), DT_IN(b)), Binary(ops::BinaryOp::kSub, a, b))                               \
  X(Mul, (DT_IN(a), DT_IN(b)), Binary(ops::BinaryOp::kMul, a, b))                               \
  X(Div, (DT_IN(a), DT_IN(b)), Binary(ops::BinaryOp::kDiv, a, b))                               \
  X(Binary, (DT_ATTR(BinaryOp, op), DT_IN(a), DT_IN(b)), Binary(op, a, b))                       \
  X(Add, (DT_IN(x), DT_ATTR(double, s)), BinaryScalar(ops::BinaryOp::kAdd, x, s))                \
  X(Sub, (DT_IN(x), DT_ATTR(double, s)), BinaryScalar(ops::BinaryOp::kSub, x, s))                \
  X(Mul, (DT_IN(x), DT_ATTR(double, s)), BinaryScalar(ops::BinaryOp::kMul, x, s))                \
  X(Div, (DT_IN(x), DT_ATTR(double, s)), BinaryScalar(ops::BinaryOp::kDiv, x, s))                \
  X(Binary, (DT_ATTR(BinaryOp, op), DT_IN(x), DT_ATTR(double, s)), BinaryScalar(op, x, s))       \
  X(Neg, (DT_IN(x)), Unary(ops::UnaryOp::kNeg, x))                                              \
  DT_ROW_CALL_EACH(X, DT_UNARY_OPS(DT_UNARY_ROW_))                                              \
  X(Gelu, (DT_IN(x), DT_ATTR(GeluApproximation, approx, GeluApproximation::kNone)),              \
    Gelu(x, approx))                                                                            \
  X(Unary, (DT_ATTR(UnaryOp, op), DT_IN(x)), Unary(op, x))                                       \
  X(Cast, (DT_IN(x), DT_ATTR(DType, dtype)), Cast(x, dtype))                                     \
  X(Modulate, (DT_IN(x), DT_IN(scale), DT_IN(shift)), Modulate(x, scale, shift))                 \
  X(GatedActivation, (DT_IN(gate), DT_IN(up), DT_ATTR(UnaryOp, act)),                            \
    GatedActivation(gate, up, act))
// A row of DT_UNARY_OPS as a row of DT_OPS.
#define DT_UNARY_ROW_(name, formula) , (name, (DT_IN(x)), Unary(ops::UnaryOp::k##name, x))

// ---- reductions along one dim --------------------------------------------------------------------

enum class Reduction : uint8_t { kSum, kMean, kMax, kArgmax };

// Sum Mean Max Argmax(x, dim, keepdim): x [2, 3, 4], dim 1 -> [2, 4] (keepdim: [2, 1, 4]). A
// zero-size reduced dim gives 0 for Sum, NaN for Mean, and InvalidArgument for Max/Argmax (like
// PyTorch). Max propagates NaN; Argmax returns the first maximal index (a NaN counts as the
// maximum). Reduce(op, ...): any of them, the reduction an argument.
#define DT_REDUCE_OPS(X)                                                                         \
  X(Sum, (DT_IN(x), DT_ATTR(int64_t, dim), DT_ATTR(bool, keepdim, false)),                       \
    Reduce(ops::Reduction::kSum, x, dim, keepdim))                                               \
  X(Mean, (DT_IN(x), DT_ATTR(int64_t, dim), DT_ATTR(bool, keepdim, false)),                      \
    Reduce(ops::Reduction::kMean, x, dim, keepdim))                                              \
  X(Max, (DT_IN(x), DT_ATTR(int64_t, dim), DT_ATTR(bool, keepdim, false)),                       \
    Reduce(ops::Reduction::kMax, x, dim, keepdim))                                               \
  X(Argmax, (DT_IN(x), DT_ATTR(int64_t, dim), DT_ATTR(bool, keepdim, false)),                    \
    Reduce(ops::Reduction::kArgmax, x, dim, keepdim))                                            \
  X(Reduce,                                                                                      \
    (DT_ATTR(Reduction, op), DT_IN(x), DT_ATTR(int64_t, dim), DT_ATTR(bool, keepdim, false)),    \
    Reduce(op, x, dim, keepdim))

// ---- normalisation and activations over a dim -----------------------------------------------------

// Softmax LogSoftmax(x, dim).
// RmsNorm(x, weight, eps): over the last dim H, Hugging Face Llama semantics: in f32,
// n = x * rsqrt(mean(x²) + eps); n is rounded to x's dtype, THEN multiplied by weight [H] (same
// dtype as x) and rounded again.
// LayerNorm(x, weight, bias, eps): over the last dim H: (x - mean) / sqrt(var + eps) * weight +
// bias (biased variance), in f32 and rounded once; weight and bias [H] optional, same dtype as x.
#define DT_NORM_OPS(X)                                                                           \
  X(Softmax, (DT_IN(x), DT_ATTR(int64_t, dim)), Softmax(x, dim, false))                          \
  X(LogSoftmax, (DT_IN(x), DT_ATTR(int64_t, dim)), Softmax(x, dim, true))                        \
  X(RmsNorm, (DT_IN(x), DT_OPT(weight), DT_ATTR(double, eps, 1e-6)), RmsNorm(x, weight, eps))    \
  X(LayerNorm, (DT_IN(x), DT_OPT(weight), DT_OPT(bias), DT_ATTR(double, eps, 1e-5)),             \
    LayerNorm(x, weight, bias, eps))

// ---- rotary embeddings ---------------------------------------------------------------------------

// kHalf (HF Llama, rotate_half): y = x*cos + cat(-x[D/2:], x[:D/2])*sin.
// kInterleaved (Flux2): pairs (x[2j], x[2j+1]): y[2j] = x[2j]*cos[2j] - x[2j+1]*sin[2j],
//                                              y[2j+1] = x[2j+1]*cos[2j+1] + x[2j]*sin[2j+1].
enum class RotaryStyle : uint8_t { kHalf, kInterleaved };

// ApplyRotary(x, cos, sin, style): x [..., D] with D even; cos and sin [..., D] broadcast to x
// (e.g. x [B, H, S, D] with cos [S, D] or [B, 1, S, D]); any float dtypes; computed in f32, result
// in x's dtype.
#define DT_ROTARY_OPS(X)                                                                         \
  X(ApplyRotary, (DT_IN(x), DT_IN(cos), DT_IN(sin), DT_ATTR(RotaryStyle, style)),                \
    Rotary(x, cos, sin, style))

// ApplyRotary(x, cos, sin, style) written into `out` instead of a new tensor: out of x's shape,
// dtype (on the CPU any float dtype, rounded to once) and device, writable, with a unit stride
// along its last dim (any others: a slot of a KV cache's buffer) and sharing no storage with x,
// cos or sin. A KV cache rotates its new keys straight into its buffer with it, in the pass that
// would otherwise copy them there.
absl::Status ApplyRotaryInto(const Tensor& out, const Tensor& x, const Tensor& cos,
                             const Tensor& sin, RotaryStyle style);

// The default inverse frequencies of a rotary table, as Hugging Face computes them in f32:
// 1 / theta^(2i / head_dim) for i < head_dim / 2.
std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta);

// ---- attention -----------------------------------------------------------------------------------

struct AttentionOptions {
  bool causal = false;
  std::optional<double> scale;         // default 1/sqrt(D)
  std::optional<int64_t> kv_length;    // valid prefix of the K/V buffers; default Skv
  std::optional<int64_t> q_offset;     // absolute position of query 0; default kv_length - Sq
  // Gemma 2/3, gpt-oss and custom models (Note [Attention options] in cpu/attention.cc; CPU only):
  std::optional<double> softcap;  // > 0: scores = softcap · tanh(scores / softcap) before the mask
  std::optional<int64_t> window;  // >= 1, causal: query i sees no key j <= q_offset + i - window
  Tensor sinks;  // [Hq] float: per query head a logit in its softmax denominator, without a value
  Tensor mask;   // [B or 1, 1, Sq, Skv] float, added to the scores (broadcast over the heads)
};

// ScaledDotProductAttention(q, k, v, options): softmax(softcap(q·kᵀ·scale) + mask)·v per head
// (with the sinks in the denominators), softmax in f32.
//   q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] -> [B, Hq, Sq, Dv].
// GQA: Hq % Hkv == 0 and kv head g serves query heads g*r .. g*r+r-1 (r = Hq/Hkv). Only keys
// j < kv_length are attended; with `causal`, query i attends to keys j <= q_offset + i (bottom-right
// aligned by default, as for a KV cache). A query row with no visible key yields zeros. Float
// dtypes; k and v share one, which on the CPU may differ from q's (a KV cache of its own dtype:
// Note [A KV cache of its own dtype] in attention.cc); the output has q's.
#define DT_ATTENTION_OPS(X)                                                                      \
  X(ScaledDotProductAttention,                                                                   \
    (DT_IN(q), DT_IN(k), DT_IN(v), DT_ATTR(const AttentionOptions&, options, {})),               \
    Attention(q, k, v, options))
// The same written into `out` [B, Hq, Sq, Dv] instead of a new tensor: q's dtype and device,
// writable, a unit stride along Dv (any others) and no storage shared with q, k or v. An attention
// layer passes the transpose of a [B, Sq, Hq, Dv] tensor, so that its heads' rows come out joined
// as the output projection reads them ([B, Sq, Hq·Dv]), without a transposing copy.
absl::Status ScaledDotProductAttentionInto(const Tensor& out, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionOptions& options = {});

// ---- paged attention (CPU) -----------------------------------------------------------------------

// A serving engine's KV cache (nn/models/engine.cc): the keys and values of many sequences in
// fixed-size pages of one pool per layer, k_pages [N, Hkv, P, D] and v_pages [N, Hkv, P, Dv] (page
// n holds P positions of every KV head). Sequence i's position p lies in page page_table[i, p / P]
// at row p % P; a sequence grows by taking more pages, never by moving the ones it has.
//
//   sequence   page_table row   positions
//   0          [3, 0, -]        0-15 in page 3, 16-20 in page 0 (P = 16, 21 positions)
//   1          [1, -, -]        0-6 in page 1
struct PagedAttentionOptions {
  bool causal = true;
  std::optional<double> scale;    // default 1/sqrt(D)
  std::optional<double> softcap;  // as AttentionOptions
  std::optional<int64_t> window;  // as AttentionOptions, positions within each sequence
  Tensor sinks;                   // as AttentionOptions: [Hq] float
};

// ScaledDotProductAttention for the query rows of S sequences stacked in one tensor, each against
// its own pages: q [Hq, T, D] where sequence i's rows are [query_starts[i], query_starts[i + 1])
// (query_starts i64 [S + 1], 0 to T, non-decreasing), its keys positions [0, kv_lengths[i])
// (kv_lengths i64 [S]) of its pages (page_table i32 [S, max_pages]; only the pages its positions
// reach are read, and must be in [0, N)). Its query rows are its last positions: with `causal`,
// row r of n sees keys j <= kv_lengths[i] - n + r. GQA as ScaledDotProductAttention; softmax in
// f32; one float dtype for both pools, q's may differ. Written into out [Hq, T, Dv] (q's dtype, a
// unit stride along Dv, any others; no storage shared with the inputs), as
// ScaledDotProductAttentionInto writes. CPU only: other devices are refused (Unimplemented).
absl::Status PagedAttentionInto(const Tensor& out, const Tensor& q, const Tensor& k_pages,
                                const Tensor& v_pages, const Tensor& page_table,
                                const Tensor& query_starts, const Tensor& kv_lengths,
                                const PagedAttentionOptions& options = {});
// Writes the T new positions x [H, T, W] (any float dtype, rounded to pool's) into a pool
// [N, H, P, W] (k_pages or v_pages) at slots (i64 [T], slot = page · P + row, in [0, N · P)): row
// slot % P of page slot / P of every head. CPU only.
absl::Status WriteToPages(const Tensor& pool, const Tensor& x, const Tensor& slots);

// ---- lookup --------------------------------------------------------------------------------------

// Embedding(table, ids[, index_offset]): table [V, H], ids [...] (i64 or i32) -> [..., H]: row
// ids[i] - index_offset of the table (index_offset: Tensors only, 0 in the row's form). An id
// outside [index_offset, index_offset + V) is NOT an error: it yields a zero row. This is the
// masked lookup of a vocab-sharded table, whose partial results are then summed across ranks.
// A quantized table (CPU) gives its rows dequantized, in f32.
#define DT_LOOKUP_OPS(X) X(Embedding, (DT_IN(table), DT_IN(ids)), Embedding(table, ids))
absl::StatusOr<Tensor> Embedding(const Tensor& table, const Tensor& ids, int64_t index_offset);

// ---- shape ops -----------------------------------------------------------------------------------

// Concatenation along `dim`; all tensors need the same dtype, device, rank and sizes off `dim`.
absl::StatusOr<Tensor> Cat(absl::Span<const Tensor> tensors, int64_t dim);
// A braced list of Tensors, Cat({a, b}, dim), picks this overload rather than the DTensor and
// Value ones of ops/ops.h (a list converts to each span equally well; to an initializer_list better).
inline absl::StatusOr<Tensor> Cat(std::initializer_list<Tensor> tensors, int64_t dim) {
  return Cat(absl::MakeConstSpan(tensors.begin(), tensors.size()), dim);
}
// Split(x, sizes, dim): views of consecutive pieces of x along dim with the given sizes (which
// must sum to x.size(dim)).
// Chunk(x, chunks, dim): torch.chunk: views of size ceil(n/chunks) along dim, the last possibly
// shorter; fewer than `chunks` pieces when they run out (n=5, chunks=4 -> sizes 2, 2, 1); a
// zero-size dim gives `chunks` empty pieces.
//   n   chunks  sizes
//   6   3       2 2 2
//   5   4       2 2 1
//   1   3       1
#define DT_SPLIT_OPS(X)                                                                          \
  X(Split, (DT_IN(x), DT_ATTR(absl::Span<const int64_t>, sizes), DT_ATTR(int64_t, dim)),         \
    Split(x, sizes, dim), List)                                                                  \
  X(Chunk, (DT_IN(x), DT_ATTR(int64_t, chunks), DT_ATTR(int64_t, dim)), Chunk(x, chunks, dim),   \
    List)
// x with `before` and `after` elements of `value` added along dim (both >= 0).
absl::StatusOr<Tensor> Pad(const Tensor& x, int64_t dim, int64_t before, int64_t after,
                           double value = 0.0);

// TopK(x, k, dim, largest): the k largest (or smallest) elements along dim, sorted (largest first
// when `largest`), and their i64 indices. Ties keep the lower index first; NaN counts as greater
// than every number. T: Tensor here, DTensor (indices global along dim) or Value.
template <typename T>
struct TopKOf {
  T values;
  T indices;
};
using TopKResult = TopKOf<Tensor>;
#define DT_SELECT_OPS(X)                                                                         \
  X(TopK,                                                                                        \
    (DT_IN(x), DT_ATTR(int64_t, k), DT_ATTR(int64_t, dim, -1), DT_ATTR(bool, largest, true)),    \
    TopK(x, k, dim, largest), TopK)

// ---- the lists -----------------------------------------------------------------------------------

// Every op of the sections above that runs on DTensors too, X(Name, params, call[, result]):
// Name(params) on Tensors (declared below), DTensors and Values, whose DTensor call is
// internal::calls::call (ops/op_calls.h); it returns one tensor, or std::vector (result List) or
// TopKOf (result TopK) of them.
#define DT_OPS(X)                                                                                \
  DT_GEMM_OPS(X) DT_POINTWISE_OPS(X) DT_REDUCE_OPS(X) DT_NORM_OPS(X) DT_ROTARY_OPS(X)            \
  DT_ATTENTION_OPS(X) DT_LOOKUP_OPS(X) DT_SPLIT_OPS(X) DT_SELECT_OPS(X)

// Ops declared in one row, X(Name, params): everything but the op's sharding rule and kernels
// comes from the row. Name(params) on Tensors, DTensors and Values (ops/value_ops.h declares the
// Tensor overload: it runs the op's declaration, ops/decls/<family>.cc, on the whole tensors);
// its OpId k<Name> (ops/strategy.h); its attributes, struct <Name>Attrs with a field per DT_ATTR
// (ops/op_attrs.h); its call builder internal::calls::Name (ops/op_calls.h); its kernels
// cpu::Name and cuda::Name (ops/local/kernels.h), whose parameters are the row's with
// `const Tensor& out` last. docs/ops.md, "Adding an op".

//
// SoftCap(x, cap): cap · tanh(x / cap) elementwise, which squashes x into (-cap, cap) (Gemma 2's
// attention and final-logit soft-capping); x f32, bf16 or f16, cap finite and > 0; computed in
// f32, rounded once. Not linear, so on DTensors a Partial x is reduced first; any Shard is kept.
#define DT_DECLARED_OPS(X) X(SoftCap, (DT_IN(x), DT_ATTR(double, cap)))

#define DT_TENSOR_PARAM_In(n) , const Tensor& n
#define DT_TENSOR_PARAM_Opt(n) , const Tensor& n = Tensor()
#define DT_TENSOR_PARAM_Attr(type, n, ...) , type n __VA_OPT__(= __VA_ARGS__)
#define DT_TENSOR_OP_(name, params, call, ...) \
  absl::StatusOr<DT_ROW_RESULT(Tensor, __VA_ARGS__)> name(DT_ROW_LIST(DT_TENSOR_PARAM_, params));
DT_OPS(DT_TENSOR_OP_)
#undef DT_TENSOR_OP_
#undef DT_TENSOR_PARAM_In
#undef DT_TENSOR_PARAM_Opt
#undef DT_TENSOR_PARAM_Attr

}  // namespace dt::ops
