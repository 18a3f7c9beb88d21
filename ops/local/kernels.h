#pragma once
// Internal: the per-device kernel interface behind ops/local/ops.h.
//
// The public functions in ops.h validate every argument, compute output shapes, allocate the
// outputs on the inputs' device and then call exactly one kernel below, `cpu::X` or `cuda::X` with
// identical signatures (cpu in ops/local/cpu/*.cc; cuda in ops/local/cuda/*.cu, built into the
// libdtensor_cuda.so module when CMake's DT_HAVE_CUDA is ON and reached through the table of
// ops/local/cuda_kernels.h, made from the same list: Note [CUDA module] in core/cuda_module.h).
//
// What every kernel may assume (the public layer guarantees it):
//   - all tensors are defined, on the kernel's device, with the dtypes and shapes stated below;
//   - outputs are freshly allocated, contiguous and never alias an input;
//   - inputs are arbitrary strided views (strides may be 0 for broadcast dims) unless stated; a
//     kernel that wants contiguous data may call Contiguous() itself;
//   - no tensor has zero elements unless stated (the public layer returns early on empty results);
//   - "float" means f32, bf16 or f16; half types are computed in f32 and rounded once on store.
// Kernels return OK or an error for failures the public layer cannot foresee (device errors).

#include <cstdint>

#include "absl/status/status.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

// AttentionOptions with every default resolved.
struct AttentionParams {
  bool causal = false;
  float scale = 1.0f;
  int64_t kv_length = 0;  // 0 <= kv_length <= Skv
  int64_t q_offset = 0;   // causal: query i sees keys j <= q_offset + i (may be negative)
  // Options (Note [Attention options] in cpu/attention.cc); the defaults change nothing.
  float softcap = 0;  // > 0: scores become softcap · tanh(scores / softcap) before the mask
  int64_t window = 0;  // > 0 (causal): query i sees no key j <= q_offset + i - window
  const float* sinks = nullptr;  // f32 [Hq]: a logit per query head joining each row's softmax
  // f32, added to the scores: query i's key j at mask[b · mask_bs + i · mask_rs + j].
  const float* mask = nullptr;
  int64_t mask_bs = 0, mask_rs = 0;
};

// Kernels (DT_LOCAL_KERNELS below; identical signatures in namespaces cpu and cuda):
//
//   Matmul(a, b, bias, out)
//     a [..., M, K], b [..., K, N] with identical batch dims (expanded: strides may be 0), out
//     [..., M, N]; one float dtype; M, N, K >= 1. In every matrix of a and b one of the last two
//     dims has stride 1 and the other a stride >= max(1, the size of the stride-1 dim), i.e. each
//     matrix is row-major or column-major with a leading dimension (cuBLAS-compatible). bias:
//     undefined or contiguous [N] of out's dtype, added to every row in f32 before rounding.
//   Binary(op, a, b, out)
//     out = a op b; a and b expanded to out's shape; one dtype, not bool; kDiv only for floats.
//     Integer arithmetic wraps (two's complement).
//   BinaryScalar(op, x, s, out)
//     out = x op s; x of out's shape and dtype (not bool; kDiv only float; s integral for
//     integer dtypes). Float dtypes compute in f32 (s rounded to f32 first).
//   Modulate(x, scale, shift, out)
//     out = round(round(x * round(1 + scale)) + shift) elementwise; scale and shift expanded to
//     out's shape; one float dtype; computed in f32, rounded to the dtype after each step.
//   GatedActivation(act, gate, up, out)
//     out = round(round(act(gate)) * up) elementwise; gate, up and out of one shape and float
//     dtype (see ops::GatedActivation).
//   Unary(op, x, out)
//     out = op(x); same shape and dtype; float, or any but bool for kNeg.
//   Reduce(op, x, dim, out)
//     out = reduction of x along dim (0 <= dim < x.dim()), shape x's without dim. kSum: any but
//     bool, out x's dtype for floats and i64 for integers; kMean: float, out x's dtype; kMax: any
//     but bool, out x's dtype; kArgmax: any but bool, out i64. x.size(dim) may be 0 only for kSum
//     (out 0) and kMean (out NaN). Floats accumulate in f32 or better.
//   Softmax(x, dim, log, out)
//     (log-)softmax along dim (0 <= dim < x.dim()); float; out same shape and dtype; f32 inside.
//   RmsNorm(x, weight, eps, out)
//     x [..., H] float; weight undefined or [H] of x's dtype; out like x. See ops::RmsNorm for the
//     two roundings.
//   LayerNorm(x, weight, bias, eps, out)
//     x [..., H] float; weight, bias undefined or [H] of x's dtype; out like x; one rounding.
//   ApplyRotary(x, cos, sin, style, out)
//     x [..., D] float with D even; cos and sin expanded to x's shape (any float dtypes); out
//     of x's shape and dtype with a unit stride along D, its other strides any (ApplyRotaryInto
//     writes a slot of a cache; not an exception to "fresh", it never aliases an input). See
//     ops::ApplyRotary for the two styles.
//   Attention(q, k, v, params, out)
//     q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], float (k and v of one dtype,
//     q's on CUDA), Hq % Hkv == 0
//     (query head h uses kv head h / (Hq/Hkv)); out [B, Hq, Sq, Dv] with a unit stride along Dv,
//     its other strides any (ScaledDotProductAttentionInto: the transpose of a [B, Sq, Hq, Dv]
//     tensor; it never aliases an input). Only keys j < kv_length are
//     visible, and with causal only j <= q_offset + i for query i. Skv and kv_length may be 0;
//     rows without a visible key are zero. Softmax in f32. The options of params (softcap,
//     window, sinks, mask) are CPU only: CUDA refuses a set one (Unimplemented, naming it).
//   Embedding(table, ids, index_offset, out)
//     table [V, H] any dtype (V may be 0; quantized only on the CPU, rows with unit stride); ids
//     any shape, i64 or i32; out [ids..., H] of table's dtype (f32 for a quantized table);
//     out[i] = table[ids[i] - index_offset], or zeros when that row does not exist.
//   TopK(x, k, dim, largest, values, indices)
//     the k largest (smallest) elements of x along dim (0 <= dim < x.dim(),
//     1 <= k <= x.size(dim)), sorted; ties lower index first; NaN greater than every number. x any
//     dtype but bool; values: x's shape with size k at dim, x's dtype; indices: same shape, i64.

// Every kernel, once: X(Name, (parameters)). Namespaces cpu and cuda each declare all of them with
// these signatures (below), and the CUDA module's table (cuda_kernels.h) has one field per row, so
// a kernel added here is declared for both devices and reached through DT_OPS_KERNEL (checks.h).
// The kernel of each row of DT_DECLARED_OPS (ops.h) is a row too: Name(the op's parameters,
// const Tensor& out), on the op's local pieces (its declaration's `run` says what it passes).
#define DT_LOCAL_KERNELS(X)                                                                     \
  DT_ROW_CALL_EACH(X, DT_DECLARED_OPS(DT_DECLARED_KERNEL_))                                     \
  X(Modulate, (const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& out))   \
  X(Matmul, (const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out))          \
  X(Binary, (BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out))                \
  X(BinaryScalar, (BinaryOp op, const Tensor& x, double s, const Tensor& out))                 \
  X(Unary, (UnaryOp op, const Tensor& x, const Tensor& out))                                   \
  X(GatedActivation, (UnaryOp act, const Tensor& gate, const Tensor& up, const Tensor& out))    \
  X(Reduce, (Reduction op, const Tensor& x, int dim, const Tensor& out))                       \
  X(Softmax, (const Tensor& x, int dim, bool log, const Tensor& out))                          \
  X(RmsNorm, (const Tensor& x, const Tensor& weight, float eps, const Tensor& out))            \
  X(LayerNorm,                                                                                  \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out))  \
  X(ApplyRotary, (const Tensor& x, const Tensor& cos, const Tensor& sin, RotaryStyle style,     \
                  const Tensor& out))                                                           \
  X(Attention, (const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, \
                const Tensor& out))                                                             \
  X(Embedding, (const Tensor& table, const Tensor& ids, int64_t index_offset, const Tensor& out)) \
  X(TopK, (const Tensor& x, int64_t k, int dim, bool largest, const Tensor& values,             \
           const Tensor& indices))

#define DT_DECLARED_KERNEL_(name, params) \
  , (name, (DT_ROW_LIST(DT_DECLARED_KERNEL_PARAM_, params), const Tensor& out))
#define DT_DECLARED_KERNEL_PARAM_In(n) , const Tensor& n
#define DT_DECLARED_KERNEL_PARAM_Opt(n) , const Tensor& n
#define DT_DECLARED_KERNEL_PARAM_Attr(type, n, ...) , type n

#define DT_LOCAL_KERNEL_DECL_(name, params) absl::Status name params;
namespace cpu {
DT_LOCAL_KERNELS(DT_LOCAL_KERNEL_DECL_)
}  // namespace cpu
namespace cuda {
DT_LOCAL_KERNELS(DT_LOCAL_KERNEL_DECL_)
}  // namespace cuda
#undef DT_LOCAL_KERNEL_DECL_

// PagedAttentionOptions with every default resolved.
struct PagedAttentionParams {
  bool causal = true;
  float scale = 1.0f;
  float softcap = 0;             // as AttentionParams
  int64_t window = 0;            // as AttentionParams, positions within each sequence
  const float* sinks = nullptr;  // as AttentionParams
};

// CPU-only kernels (the public layer refuses other devices: Note [Paged attention] in
// cpu/attention.cc):
//
//   PagedAttention(q, k_pages, v_pages, page_table, query_starts, kv_lengths, params, out)
//     q [Hq, T, D] and out [Hq, T, Dv] (a unit stride along Dv, its other strides any), pools
//     k_pages [N, Hkv, P, D] and v_pages [N, Hkv, P, Dv] of one float dtype, Hq % Hkv == 0;
//     page_table i32 [S, max_pages] with every page a sequence reads in [0, N); query_starts i64
//     [S + 1] from 0 to T, non-decreasing; kv_lengths i64 [S] with each sequence's query rows
//     (starts[i + 1] - starts[i]) <= kv_lengths[i] <= max_pages · P. See ops::PagedAttentionInto.
//   WriteToPages(pool, x, slots)
//     pool [N, H, P, W] float, x [H, T, W] float, slots i64 [T] in [0, N · P): pool[slot / P, :,
//     slot % P, :] = x[:, t, :] (rounded to pool's dtype).
namespace cpu {
absl::Status PagedAttention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                            const Tensor& page_table, const Tensor& query_starts,
                            const Tensor& kv_lengths, const PagedAttentionParams& params,
                            const Tensor& out);
absl::Status WriteToPages(const Tensor& pool, const Tensor& x, const Tensor& slots);
}  // namespace cpu

}  // namespace dt::ops
