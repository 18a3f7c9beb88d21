// The quantized GEMM: Linear with a weight held in GGUF blocks (Note [Quantized dtypes] in
// core/quant.h), for decode (M = 1..8 rows) and prefill (any M) alike.
//
// Note [Quantized GEMM]
// The weight is never dequantized in memory. The activations are quantized once per call, row by
// row, to 8-bit blocks of 32 (Note [Activation blocks]); every product of a weight block with an
// activation block is then an integer dot product of 8-bit values, scaled once in f32:
//
//   w(p) = dw_h * qw(p) + mw_h      (qw unsigned 8-bit, h the 16-element half of p's 32-block;
//                                    every type has this form: q4_1 d*q + m, q4_0 d*q - 8d,
//                                    q8_0 d*(q+128) - 128d, q4_k (d*sc)*q - dmin*m, q6_k with its
//                                    per-16 scales (d*sc)*q - 32*d*sc)
//   x(p) = dx * qx(p)               (qx signed 8-bit)
//   sum_p w(p) x(p) over one block = dx * sum_h (dw_h * sum_{p in h} qw qx) + sum_h mw_h * sx_h,
//                                    sx_h = dx * sum_{p in h} qx (stored with the activations)
//
// The integer sums are what x86 does fast: vpdpbusd (u8 x s8 -> 4 products summed into an i32
// lane; AVX-VNNI and AVX-512 VNNI) or vpmaddubsw + vpmaddwd (AVX2), 32 products per instruction.
// One kernel body per instruction set (qgemm_kernels.cc) decodes each weight block in registers
// and serves up to four activation rows with it; the rows of x tile the call in fours.
//
// Work split (oneTBB, within the rank's core budget like the float GEMM: AvailableThreads):
// threads take chunks of weight rows (output columns), each chunk sized to read at least
// kMinChunkBytes of weights and at most kMaxChunkBytes, so that a chunk stays in L2 while every
// row tile of x streams past it (prefill), and a decode step streams each weight byte once.
// A product under kMinParallelBytes of weights runs on the calling thread.
//
// Note [Activation blocks]
// Each run of 32 activations gets d = max|x| / 127 and q = round(x / d) (llama.cpp's Q8_0/Q8_1
// rounding, with d kept in f32 instead of f16), plus s = d * sum(q) and h = d * (sum of the first
// 16 q), which the offset terms mw_h * sx_h of every weight type need (q6_k's per-16 scales are
// why halves).
// The quantization error of an activation is at most d / 2 = max|x| / 254 of its block: the
// tolerance the tests derive from (tests/ops/local/qgemm_test.cc).

#include "dtensor/ops/local/cpu/qgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/loops.h"

namespace dt::ops::cpu {

namespace qgemm {

void QuantizeRows(int m, int64_t k, const float* x, int64_t ldx, int8_t* q, float* d, float* s,
                  float* h) {
  const int64_t ld = QRowsLd(k);
  for (int i = 0; i < m; ++i) {
    const float* xr = x + i * ldx;
    for (int64_t b = 0; b < ld; ++b) {
      float* di = d + i * ld + b;
      float* si = s + i * ld + b;
      float* hi = h + i * ld + b;
      if (b >= k / 32) {
        *di = *si = *hi = 0;
        continue;
      }
      const float* xb = xr + b * 32;
      float amax = 0;
      for (int p = 0; p < 32; ++p) amax = std::max(amax, std::abs(xb[p]));
      const float db = amax / 127.0f;
      const float id = db > 0 ? 1.0f / db : 0.0f;
      int8_t* qb = q + i * k + b * 32;
      int sum[2] = {0, 0};
      for (int p = 0; p < 32; ++p) {
        const int v = static_cast<int>(std::nearbyint(xb[p] * id));
        qb[p] = static_cast<int8_t>(std::clamp(v, -127, 127));
        sum[p / 16] += qb[p];
      }
      *di = db;
      *si = db * static_cast<float>(sum[0] + sum[1]);
      *hi = db * static_cast<float>(sum[0]);
    }
  }
}

}  // namespace qgemm

namespace {

constexpr int64_t kMinParallelBytes = int64_t{64} << 10;
constexpr int64_t kMinChunkBytes = int64_t{16} << 10;
constexpr int64_t kMaxChunkBytes = int64_t{256} << 10;
constexpr int kChunksPerThread = 4;

}  // namespace

absl::Status QuantizedLinear(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& out) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  const DType q = w.dtype();
  const int64_t row_bytes = DTypeBytes(q, k);
  const DType dtype = out.dtype();

  // x in f32 (when it is not already contiguous f32 rows), then quantized.
  std::optional<gemm::ScratchBuffer> xf;
  const float* x32 = nullptr;
  int64_t ldx = k;
  if (x.dtype() == DType::kF32 && x.stride(1) == 1) {
    x32 = x.data<float>();
    ldx = x.stride(0);
  } else {
    xf.emplace(gemm::ScratchSlot::kX, m * k);
    if (xf->data() == nullptr) return absl::ResourceExhaustedError("Linear: out of memory");
    for (int64_t i = 0; i < m; ++i) {
      LoadF32(x.dtype(), static_cast<const char*>(x.raw_data()) + i * x.stride(0) * DTypeSize(x.dtype()),
              k, x.stride(1), xf->data() + i * k);
    }
    x32 = xf->data();
  }
  // q (m * k bytes), then d, s and h (m * ld floats each) in one buffer.
  const int64_t ld = qgemm::QRowsLd(k);
  gemm::ScratchBuffer qbuf(gemm::ScratchSlot::kPackedA, m * k / 4 + 3 * m * ld);
  if (qbuf.data() == nullptr) return absl::ResourceExhaustedError("Linear: out of memory");
  qgemm::QRows rows;
  rows.m = static_cast<int>(m);
  rows.k = k;
  rows.ld = ld;
  int8_t* qq = reinterpret_cast<int8_t*>(qbuf.data());
  float* qd = qbuf.data() + m * k / 4;
  float* qs = qd + m * ld;
  float* qh = qs + m * ld;
  rows.q = qq;
  rows.d = qd;
  rows.s = qs;
  rows.h = qh;
  ParallelFor(m, k, [&](int64_t lo, int64_t hi) {
    qgemm::QuantizeRows(static_cast<int>(hi - lo), k, x32 + lo * ldx, ldx, qq + lo * k,
                        qd + lo * ld, qs + lo * ld, qh + lo * ld);
  });

  std::vector<float> bias32;
  if (bias.defined()) {
    bias32.resize(static_cast<size_t>(n));
    LoadF32(bias.dtype(), bias.raw_data(), n, 1, bias32.data());
  }
  const qgemm::DotFn dot = qgemm::DotFor(qgemm::ActiveIsa());
  const int64_t weight_bytes = n * row_bytes;
  const int threads = gemm::AvailableThreads();
  int64_t chunk = n;
  if (threads > 1 && weight_bytes >= kMinParallelBytes) {
    const int64_t chunks = std::clamp<int64_t>(weight_bytes / kMinChunkBytes, 1,
                                               int64_t{kChunksPerThread} * threads);
    chunk = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  }
  chunk = std::min(chunk, std::max<int64_t>(1, kMaxChunkBytes / row_bytes));
  const uint8_t* wp = static_cast<const uint8_t*>(w.raw_data());
  std::atomic<bool> out_of_memory{false};
  auto run = [&](int64_t j0, int64_t j1) {
    const int64_t cols = j1 - j0;
    std::optional<gemm::ScratchBuffer> cbuf;
    float* c;
    int64_t ldc;
    if (dtype == DType::kF32) {
      c = out.data<float>() + j0;
      ldc = n;
    } else {
      cbuf.emplace(gemm::ScratchSlot::kC, m * cols);
      if (cbuf->data() == nullptr) {
        out_of_memory = true;
        return;
      }
      c = cbuf->data();
      ldc = cols;
    }
    dot(q, rows, cols, wp + j0 * row_bytes, row_bytes, c, ldc);
    gemm::FinishRows(m, cols, c, ldc, bias32.empty() ? nullptr : bias32.data() + j0, dtype,
                     static_cast<char*>(out.raw_data()) + j0 * DTypeSize(dtype), n);
  };
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_chunks == 1) {
    run(0, n);
  } else {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_chunks, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t c = r.begin(); c != r.end(); ++c) {
                          run(c * chunk, std::min(n, (c + 1) * chunk));
                        }
                      },
                      tbb::simple_partitioner());
  }
  if (out_of_memory) return absl::ResourceExhaustedError("Linear: out of memory");
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
