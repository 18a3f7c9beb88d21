// CPU scaled dot-product attention: per (batch, query head, block of queries), f32 scores through
// the single-threaded GEMM (our kernels), masked softmax in f32, then probabilities times values.

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "dtensor/ops/local/cpu/gemm.h"
#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/vec_math.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

// Element offset of t[i0, i1, i2, 0].
inline int64_t At(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2);
}

// Note [Attention reads f32 keys in place]
// Each (query head, block of queries) task multiplies with every key and value row its block can
// see. Copying them into a contiguous f32 buffer first (as bf16 or f16 caches still are: the
// single-threaded GEMM takes f32) cost a decode step as many bytes again as it reads: SmolLM2's
// 30 layers x 9 query heads x 250 cached positions x 64 x 2 f32 are 35 MB per token against
// its 97 MB of q4_1 weights, 6.5 % of the step's time at 100 positions in a perf profile (one
// thread, AMD EPYC Zen 4). f32 keys and values whose rows have unit stride (every cache and
// projection here) are what the skinny and packed kernels read directly, rows any distance apart.

// rows [r0, r0 + rows) of t[i0, i1] (each `width` wide) as contiguous f32.
void LoadRows(const Tensor& t, int64_t i0, int64_t i1, int64_t r0, int64_t rows, float* dst) {
  const int64_t width = t.size(3);
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(t.dtype(), ElementPtr(t, At(t, i0, i1, r0 + r)), width, t.stride(3), dst + r * width);
  }
}

}  // namespace

absl::Status Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params, const Tensor& out) {
  const int64_t batch = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t group = hq / k.size(1), dv = v.size(3);
  const int64_t q_blocks = (sq + kQueryBlock - 1) / kQueryBlock;
  const int64_t cost = kQueryBlock * std::max<int64_t>(1, params.kv_length) * (d + dv) * 2;
  std::mutex mu;
  absl::Status status;
  ParallelFor(batch * hq * q_blocks, cost, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> buf;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bi = task / (hq * q_blocks), h = task / q_blocks % hq;
      const int64_t i0 = task % q_blocks * kQueryBlock, rows = std::min(kQueryBlock, sq - i0);
      // Keys visible to any row of the block: [0, kv_end).
      int64_t kv_end = params.kv_length;
      if (params.causal) kv_end = std::clamp<int64_t>(params.q_offset + i0 + rows, 0, kv_end);
      buf.resize(static_cast<size_t>(rows * d + kv_end * (d + dv) + rows * kv_end + rows * dv));
      float* qs = buf.data();
      float* kbuf = qs + rows * d;
      float* vbuf = kbuf + kv_end * d;
      float* s = vbuf + kv_end * dv;
      float* o = s + rows * kv_end;
      std::fill(o, o + rows * dv, 0.0f);
      if (kv_end > 0) {
        LoadRows(q, bi, h, i0, rows, qs);
        // Keys and values are read where they lie when they are f32 rows of unit stride (Note
        // [Attention reads f32 keys in place]), else as converted rows; row p's element j is at
        // ptr[p * rs + j * cs].
        const float* ks = kbuf;
        const float* vs = vbuf;
        int64_t k_rs = d, k_cs = 1, v_rs = dv, v_cs = 1;
        if (k.dtype() == DType::kF32 && k.stride(3) == 1) {
          ks = k.data<float>() + At(k, bi, h / group, 0);
          k_rs = k.stride(2), k_cs = k.stride(3);
        } else {
          LoadRows(k, bi, h / group, 0, kv_end, kbuf);
        }
        if (v.dtype() == DType::kF32 && v.stride(3) == 1) {
          vs = v.data<float>() + At(v, bi, h / group, 0);
          v_rs = v.stride(2), v_cs = v.stride(3);
        } else {
          LoadRows(v, bi, h / group, 0, kv_end, vbuf);
        }
        absl::Status st = Sgemm(rows, kv_end, d, qs, d, 1, ks, k_cs, k_rs, s, kv_end);  // q · kᵀ
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          status.Update(st);
          return;
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* row = s + r * kv_end;
          const int64_t limit =
              params.causal ? std::clamp<int64_t>(params.q_offset + i0 + r + 1, 0, kv_end) : kv_end;
          if (limit == 0) {  // no visible key: a zero row of probabilities, so a zero output
            std::fill(row, row + kv_end, 0.0f);
            continue;
          }
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < limit; ++j) mx = std::max(mx, row[j] *= params.scale);
          for (int64_t j = 0; j < limit; ++j) row[j] -= mx;
          ExpF32(row, row, limit);
          float sum = 0;
          for (int64_t j = 0; j < limit; ++j) sum += row[j];
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < limit; ++j) row[j] *= inv;
          std::fill(row + limit, row + kv_end, 0.0f);
        }
        st = Sgemm(rows, dv, kv_end, s, kv_end, 1, vs, v_rs, v_cs, o, dv);  // p · v
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          status.Update(st);
          return;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        StoreF32(out.dtype(), ElementPtr(out, At(out, bi, h, i0 + r)), dv, 1, o + r * dv);
      }
    }
  });
  return status;
}

}  // namespace dt::ops::cpu
