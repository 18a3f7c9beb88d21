// CPU Matmul kernel: Eigen f32 GEMM on blocks of the output, blocks spread over cores with oneTBB.
//
// Note [bf16 GEMM]
// Eigen's own bfloat16 GEMM has no SIMD kernel (about 6x slower than f32) and accumulates in bf16
// (relative errors up to 3e-1 at K=1024; see shared/reference/build-environment.md §4). bf16 and
// f16 operands are therefore converted to f32 once, multiplied with the f32 GEMM, and the f32
// result (plus bias) is rounded once. The conversions cost O(MK + KN + MN), the GEMM O(MNK).
//
// Note [GEMM threading]
// Eigen 3.4 parallelises its GEMM only with OpenMP, which this build does not use. The kernel
// instead cuts the output into blocks (whole matrices when the batch has at least one per core,
// otherwise row or column panels of each matrix, about kPanelsPerThread per core and at least
// kMinPanel wide) and runs one single-threaded Eigen GEMM per block inside tbb::parallel_for.
// Several panels per core let oneTBB rebalance when a core is shared with other processes (a static
// one-panel-per-core split finishes with the slowest core). Each panel repacks the operand it
// shares; at 128-wide panels that costs a few percent (measured: 1024^3 on one core runs at the
// same speed in 1, 4 or 8 row panels, within noise).

#include "dtensor/ops/local/cpu/gemm.h"

#include <algorithm>
#include <vector>

#include <Eigen/Core>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

constexpr int64_t kPanelsPerThread = 4;
constexpr int64_t kMinPanel = 128;

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
template <typename M>
using ConstMap = Eigen::Map<const M, Eigen::Unaligned, Eigen::OuterStride<>>;
using OutMap = Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename A, typename B>
void Product(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc) {
  ConstMap<A> am(a, m, k, Eigen::OuterStride<>(lda));
  ConstMap<B> bm(b, k, n, Eigen::OuterStride<>(ldb));
  OutMap cm(c, m, n, Eigen::OuterStride<>(ldc));
  cm.noalias() = am * bm;
}

// A float view of one operand: f32 data is used in place; bf16/f16 is converted once into a
// contiguous f32 buffer (broadcast batch dims are converted once, not per use).
struct F32Operand {
  Tensor f32;  // same shape as the operand, f32, possibly strided
  static absl::StatusOr<F32Operand> Make(const Tensor& t) {
    if (t.dtype() == DType::kF32) return F32Operand{t};
    // Collapse broadcast (stride-0) dims, keep the matrix layout, convert, re-expand.
    Shape shape = t.shape(), strides = t.strides();
    for (size_t d = 0; d < shape.size(); ++d) {
      if (strides[d] == 0) shape[d] = 1;
    }
    Tensor compact(t.storage(), shape, strides, t.storage_offset(), t.dtype());
    const bool col_major = t.stride(-1) != 1;
    if (col_major) {
      DT_ASSIGN_OR_RETURN(compact, compact.Transpose(-1, -2));
    }
    DT_ASSIGN_OR_RETURN(Tensor f, compact.To(DType::kF32));
    if (col_major) {
      DT_ASSIGN_OR_RETURN(f, f.Transpose(-1, -2));
    }
    DT_ASSIGN_OR_RETURN(f, f.Expand(t.shape()));
    return F32Operand{f};
  }
};

}  // namespace

void Sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
           const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc) {
  const bool a_row = a_cs == 1, b_row = b_cs == 1;
  const int64_t lda = a_row ? a_rs : a_cs, ldb = b_row ? b_rs : b_cs;
  if (a_row && b_row) return Product<RowMajor, RowMajor>(m, n, k, a, lda, b, ldb, c, ldc);
  if (a_row) return Product<RowMajor, ColMajor>(m, n, k, a, lda, b, ldb, c, ldc);
  if (b_row) return Product<ColMajor, RowMajor>(m, n, k, a, lda, b, ldb, c, ldc);
  return Product<ColMajor, ColMajor>(m, n, k, a, lda, b, ldb, c, ldc);
}

absl::Status Matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  const int nd = out.dim();
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1);
  const IntSpan batch(out.shape().data(), static_cast<size_t>(nd - 2));
  const int64_t batches = Numel(batch);

  DT_ASSIGN_OR_RETURN(F32Operand af, F32Operand::Make(a));
  DT_ASSIGN_OR_RETURN(F32Operand bf, F32Operand::Make(b));
  const Tensor& a32 = af.f32;
  const Tensor& b32 = bf.f32;
  // The f32 result: `out` itself for f32, else a scratch buffer rounded into `out` at the end.
  Tensor c32 = out;
  if (out.dtype() != DType::kF32) {
    DT_ASSIGN_OR_RETURN(c32, Tensor::Empty(out.shape(), DType::kF32));
  }
  std::vector<float> bias32;
  if (bias.defined()) {
    bias32.resize(static_cast<size_t>(n));
    LoadF32(bias.dtype(), bias.raw_data(), n, 1, bias32.data());
  }

  // Blocks: `splits` panels per matrix along the longer of M and N (see Note [GEMM threading]).
  const int threads = tbb::this_task_arena::max_concurrency();
  const double flops = 2.0 * static_cast<double>(batches) * m * n * k;
  int64_t splits = 1;
  if (flops > 4e6 && batches < threads) {
    const int64_t longer = std::max(m, n);
    splits = std::min<int64_t>((kPanelsPerThread * threads + batches - 1) / batches,
                               std::max<int64_t>(1, longer / kMinPanel));
  }
  const bool split_rows = m >= n;
  const int64_t along = split_rows ? m : n;
  const int64_t panel = (along + splits - 1) / splits;
  const std::array<Shape, 3> bstrides = {
      Shape(a32.strides().begin(), a32.strides().end() - 2),
      Shape(b32.strides().begin(), b32.strides().end() - 2),
      Shape(c32.strides().begin(), c32.strides().end() - 2)};
  const float* pa = a32.data<float>();
  const float* pb = b32.data<float>();
  float* pc = c32.data<float>();
  const int64_t a_rs = a32.stride(-2), a_cs = a32.stride(-1), b_rs = b32.stride(-2),
                b_cs = b32.stride(-1), ldc = c32.stride(-2);

  auto run_block = [&](int64_t block) {
    const int64_t bi = block / splits, lo = (block % splits) * panel;
    const int64_t len = std::min(panel, along - lo);
    if (len <= 0) return;
    const std::array<int64_t, 3> off = Offsets<3>(bi, batch, bstrides);
    const float* ab = pa + off[0];
    const float* bb = pb + off[1];
    float* cb = pc + off[2];
    if (split_rows) {
      Sgemm(len, n, k, ab + lo * a_rs, a_rs, a_cs, bb, b_rs, b_cs, cb + lo * ldc, ldc);
      if (!bias32.empty()) {
        for (int64_t i = lo; i < lo + len; ++i) {
          for (int64_t j = 0; j < n; ++j) cb[i * ldc + j] += bias32[j];
        }
      }
    } else {
      Sgemm(m, len, k, ab, a_rs, a_cs, bb + lo * b_cs, b_rs, b_cs, cb + lo, ldc);
      if (!bias32.empty()) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = lo; j < lo + len; ++j) cb[i * ldc + j] += bias32[j];
        }
      }
    }
  };
  const int64_t blocks = batches * splits;
  if (blocks == 1 || flops <= 4e6) {
    for (int64_t i = 0; i < blocks; ++i) run_block(i);
  } else {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, blocks, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t i = r.begin(); i != r.end(); ++i) run_block(i);
                      },
                      tbb::simple_partitioner());
  }
  if (c32.raw_data() != out.raw_data()) DT_RETURN_IF_ERROR(out.CopyFrom(c32));
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
