// CPU scaled dot-product attention. Per (batch, KV head, block of queries) task, one of two paths
// (Note [Flash attention on the CPU]): prefill takes the flash path (blocks of keys, an online
// softmax, attention_kernels.h); decode the score-row path (f32 score rows on the skinny GEMM
// kernels, masked softmax in f32, then probabilities times values).

#include "dtensor/ops/local/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/cpu/vec_math.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace {

// A task's output rows (group * rows of dv, stacked head by head): the caller's, written in place
// where `direct` points at them with strides hs (head) and rs (row), else `obuf`, copied out after.
void PointOut(attention::FlashTask& t, float* direct, int64_t hs, int64_t rs,
              std::vector<float>& obuf) {
  if (direct != nullptr) {
    t.out = direct, t.out_hs = hs, t.out_rs = rs;
    return;
  }
  obuf.resize(static_cast<size_t>(t.group * t.rows * t.dv));
  t.out = obuf.data(), t.out_hs = t.rows * t.dv, t.out_rs = t.dv;
}

// A task none of whose rows sees a key: zeros.
void ZeroOut(const attention::FlashTask& t) {
  for (int64_t rr = 0; rr < t.group * t.rows; ++rr) {
    std::fill_n(t.out + rr / t.rows * t.out_hs + rr % t.rows * t.out_rs, t.dv, 0.0f);
  }
}

// Element offset of t[i0, i1, i2, 0].
inline int64_t At(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2);
}

// Note [Flash attention on the CPU]
// Two paths compute ScaledDotProductAttention's result; AttentionTuning (attention.h) picks one per
// call. The flash path (prefill): a task is (batch, KV head, q_block stacked query rows: Note
// [Query heads share their KV head's pass]); it walks the keys it may see in blocks of kv_block
// and holds one block of scores at a time: S = scale q kᵀ in f32, each row's running max and sum
// move to include the block (an online softmax), the output so far is rescaled by
// e^(old max - new max) and the block's P v added; the sum divides at the end, and a row that
// saw no key gives zeros. Causal: a task's keys end at its last row's limit, so no block wholly
// above the diagonal is visited, and only the blocks past its first row's limit are masked, per
// row. The score-row path held m x kv_end f32 scores per task instead and, for bf16 and f16,
// converted every key and value row the task saw to f32 first.
// Layout (attention_x86.inc): q is packed once per task, transposed (a lane is a stacked row);
// keys are read where they lie, one element (f32) or pair of elements (bf16 on vdpbf16ps)
// broadcast per key against vectors of rows, so a q kᵀ tile is 6 keys x 64 rows and k is never
// copied; scores are key-major and the softmax runs along keys on whole vectors of rows; a P v
// tile is 6 rows x 64 value columns with values read where they lie (f32; bf16 widened in
// registers) or, for vdpbf16ps, interleaved into pairs of rows once per block (the one copy the
// path makes: 2 x kv_block x dv bytes, in L1, read by every tile of the block). Keys and values
// whose rows are not of unit stride, or not of the path's type (f16; a cache of another dtype than
// q's), are copied per task.
// Numerics: f32 stays f32 (f16 runs in f32). bf16 on AVX512_BF16: q kᵀ as bf16 products in f32
// sums (Note [bf16 dot products] in gemm_kernels.cc), P rounded to bf16 for P v as PyTorch's bf16
// flash attention does (each weight within 2^-9 relative), the max, sums and output in f32, the
// sums of the unrounded P; bf16 on the other sets is widened to f32 (P not rounded).
// Decode: calls with fewer than flash_min_rows stacked rows take the score-row path in f32 and
// f16: with 1-8 rows a flash q kᵀ tile fills 1-8 of its 16 lanes, where the skinny GEMM reads key
// rows as vectors (Note [Score rows read keys in place]). bf16 takes the flash path by default
// (flash_min_rows_bf16 = 0: the tuner's knob decides per CPU), which multiplies bf16 pairs where
// the score-row path widens them.
// AMX: a tile path slots in as one more Isa of attention_kernels.h: the same task loop with the
// q kᵀ and P v tiles on TMUL (q packed in pairs as now, the key and value blocks packed into tile
// layout where PackValuePairs packs values), the softmax unchanged. Not written: no machine this
// project runs on has AMX to test it.
// Measured on the AMD EPYC Zen 4 VM, 2 vCPUs (AVX-512 with BF16, no AMX), 2026-12-06, beside other
// builds (load 8-13); bench_attention --quick --cpu-time --threads=1 (one thread's CPU time, the
// figure that holds under load), Llama shapes (heads 8/4/64, 32/8/64, 32/8/128), causal prefill
// of 512 and 2048 tokens: f32 79-98 GFLOP/s, 1.54-2.17x the score-row path; bf16 134-162
// GFLOP/s, 2.63-3.57x. Blocks (q_block/kv_block, bench_attention --rows=sweep, the same timing):
// 64/64 within 3 % of the best pair on every shape; 32/64, 32/128, 64/128 and 64/256 within 3 % of
// 64/64 either way (64/256 best on 7 of 12 shapes, by 1-3 %: not past the noise); 32/32 3-10 %,
// 128/32 5-13 % and 128/64 1-7 % slower. Decode (1 query, 512 and 2048 cached keys): f32 on the
// score-row path 1.14-1.93x faster than on the flash path, bf16 on the flash path 1.18-1.74x
// faster than on the score-row path. Against PyTorch: docs/benchmarks.md (bench_attention).

// Note [Attention options]
// What models beyond Llama change in attention, each off at its default (AttentionParams in
// kernels.h), in this order on a block's scores, as transformers' eager attention applies them:
//   scale    the factor of q kᵀ (Gemma: query_pre_attn_scalar^-0.5 rather than D^-0.5);
//   softcap  scores become softcap · tanh(scores / softcap) (Gemma 2's attn_logit_softcapping);
//   window   a causal query at position i sees keys j with i - window < j <= i (transformers'
//            sliding_window_causal: Gemma 2/3, gpt-oss, Mistral); blocks wholly before the first
//            row's window are not visited, the others masked per row;
//   mask     an additive f32 tensor (broadcast over heads) added to the scores;
//   sinks    a logit per query head that joins every row's softmax denominator and has no value
//            (gpt-oss): the online softmax starts each row's running max at the sink and its sum
//            at e^0 = 1, as if the sink were a key of zero value, so output = Σ e^(s_j - m) v_j /
//            (e^(sink - m) + Σ e^(s_j - m)); a row with no visible key still gives zeros.
// The flash path applies them in a pass over each block's scores between q kᵀ and the softmax
// (none when only scale is set; one untaken branch per block), the score-row path (decode) to each
// row's scores before its softmax; both skip the keys before a window. tanh is computed as
// sign(x) (1 - e^(-2|x|)) / (1 + e^(-2|x|)) through the vector exp, on either path.

// Note [Score rows read keys in place]
// Each (query head, block of queries) task multiplies with every key and value row its block can
// see. Copying them into a contiguous f32 buffer first cost a decode step as many bytes again as
// it reads: SmolLM2's 30 layers x 9 query heads x 250 cached positions x 64 x 2 f32 are 35 MB per
// token against its 97 MB of q4_1 weights, 6.5 % of the step's time at 100 positions in a perf
// profile (one thread, AMD EPYC Zen 4). So the score-row path (decode, contiguous or paged) calls
// the skinny kernels (gemm_kernels.h) directly on rows it prepares once per task: the stacked
// query rows in f32 zero-padded to 16, keys and values where they lie when they are f32, bf16 or
// f16 rows of unit stride (half precision widened in registers: a KV cache of its own dtype, Note
// [A KV cache of its own dtype] in ops/local/attention.cc, is read at half the bytes and never
// copied), other rows converted to f32 per run; each run's probabilities in a zero-padded block
// (the axpy kernel reads x up to k rounded up to 16), eight rows at a time (the kernels' most),
// prefetched as the tuner picked for the skinny GEMM (asked once per call). A run is every key of
// a contiguous cache, or what lies in one page of a paged one (16 positions by default: a sequence
// at 130 positions makes 18 small products per KV head and layer, whose p v parts are summed in
// f32). Through Sgemm each product converted its x into scratch, asked the tuner and made a pass
// over its output: in a profile of bench_serve_engine (SmolLM2 Q4_1, 16 sequences at ~130
// positions, AMD EPYC VM) that was under 1 % of the samples, the kernels themselves about 4.5 %.

// Note [Query heads share their KV head's pass]
// With grouped-query attention the `group` query heads of a KV head read the same keys and
// values. One task stacks their rows (group x a block of queries) into one product with the keys
// and one with the values, so each key row is read once per group and, in decode, the skinny
// kernel meets `group` rows of x at a time instead of one: a tile of rows x keys shares its
// horizontal sums, where one row against 64-element keys spent as long summing as multiplying.
// The block of queries shrinks by the group so that a task keeps about q_block rows
// (AttentionTuning in attention.h).

// rows [r0, r0 + rows) of t[i0, i1] (each `width` wide) as contiguous f32.
void LoadRows(const Tensor& t, int64_t i0, int64_t i1, int64_t r0, int64_t rows, float* dst) {
  const int64_t width = t.size(3);
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(t.dtype(), ElementPtr(t, At(t, i0, i1, r0 + r)), width, t.stride(3), dst + r * width);
  }
}

// x = cap · tanh(x / cap) for n elements: sign(x) · cap · (1 - e) / (1 + e), e = e^(-2|x| / cap)
// (ExpF32's argument <= 0), as the flash path's Tanh computes it.
void SoftCap(float* x, int64_t n, float cap, std::vector<float>& tmp) {
  tmp.resize(static_cast<size_t>(n));
  const float k = -2.0f / cap;
  for (int64_t j = 0; j < n; ++j) tmp[j] = k * std::abs(x[j]);
  ExpF32(tmp.data(), tmp.data(), n);
  for (int64_t j = 0; j < n; ++j) x[j] = std::copysign(cap * (1 - tmp[j]) / (1 + tmp[j]), x[j]);
}

// One stacked row of a score-row task: row[j] holds the score of the task's j-th key, keys
// [first, limit) of them visible. Scaled, soft-capped, `add` added (the mask's row from `first`;
// null: none), softmaxed with the sink (a key of score `sink` and no value; -inf: none) into the
// visible keys' weights, every other entry zeroed; a row that sees no key is all zeros.
void SoftmaxScoreRow(float* row, int64_t nkv, int64_t first, int64_t limit, float scale,
                     float softcap, const float* add, float sink, bool has_sink,
                     std::vector<float>& tmp) {
  const int64_t n = limit - first;
  float* x = row + first;
  // Every pass on vectors (a decode step makes one per stacked row, layer and cached key).
  auto scaled = [](float* v, int64_t len, float by) {
    MapF32(v, v, len, DT_VEC8([by](__m256 a) { return _mm256_mul_ps(a, _mm256_set1_ps(by)); }),
           [by](float a) { return a * by; });
  };
  scaled(x, n, scale);
  if (softcap > 0) SoftCap(x, n, softcap, tmp);
  if (add != nullptr) {
    for (int64_t j = 0; j < n; ++j) x[j] += add[j];
  }
  const float mx = MaxF32(x, n, sink);
  std::fill(row, x, 0.0f);
  std::fill(x + n, row + nkv, 0.0f);
  if (mx == -std::numeric_limits<float>::infinity()) {  // no visible key: a zero output
    std::fill(x, x + n, 0.0f);
    return;
  }
  MapF32(x, x, n, DT_VEC8([mx](__m256 a) { return Exp8(_mm256_sub_ps(a, _mm256_set1_ps(mx))); }),
         [mx](float a) { return ExpScalar(a - mx); });
  const float sum = (has_sink ? ExpScalar(sink - mx) : 0.0f) + SumF32(x, n);
  scaled(x, n, 1.0f / sum);
}

// A score-row task (Note [Score rows read keys in place]): m = group x rows stacked query rows
// (row rr: the group's head rr / rows, query rr % rows at position pos0 + rr % rows) against keys
// [kv_begin, kv_end) of its KV head, kv_end >= 1; Note [Attention options] for the rest.
struct ScoreRowTask {
  int64_t rows = 0, m = 0;
  int64_t pos0 = 0, kv_end = 0;
  bool causal = false;
  int64_t window = 0;
  float scale = 1, softcap = 0;
  const float* sinks = nullptr;  // the group's first head's sink, or null
  const float* mask = nullptr;   // the first query's row of the mask, or null
  int64_t mask_rs = 0;
};

// Runs a score-row task into o [m, dv] (f32). q_at(rr): the element offset in q of stacked row
// rr (elements q_cs apart); locate(t, j): {the element offset of key j's row in k or v (t), the
// rows from j on that lie t.stride(2) apart}.
template <typename QAt, typename Locate>
void RunScoreRows(const ScoreRowTask& t, const Tensor& q, int64_t q_cs, const QAt& q_at,
                  const Tensor& k, const Tensor& v, const Locate& locate, Prefetch pf,
                  gemm::DotOrder order, float* o) {
  const int64_t d = q.size(-1), dv = v.size(3), m = t.m;
  const int64_t kv_begin =
      t.window > 0 ? std::clamp<int64_t>(t.pos0 + 1 - t.window, 0, t.kv_end) : 0;
  const int64_t nkv = t.kv_end - kv_begin;
  if (nkv == 0) {
    std::fill_n(o, m * dv, 0.0f);
    return;
  }
  const int64_t ldq = (d + 15) / 16 * 16, ldp = (nkv + 15) / 16 * 16;
  const gemm::Kernels& ks = gemm::KernelsFor(gemm::ActiveIsa());
  thread_local std::vector<float> buf, run_rows, tmp;
  buf.resize(static_cast<size_t>(m * ldq + m * nkv + m * dv + m * ldp));
  float* qs = buf.data();
  float* s = qs + m * ldq;
  float* part = s + m * nkv;
  float* ps = part + m * dv;
  for (int64_t rr = 0; rr < m; ++rr) {
    LoadF32(q.dtype(), ElementPtr(q, q_at(rr)), d, q_cs, qs + rr * ldq);
    std::fill(qs + rr * ldq + d, qs + (rr + 1) * ldq, 0.0f);
  }
  // Rows [j, j + *run) of k or v: where they lie when they are float rows of unit stride, else
  // converted into run_rows; *rs: the distance between rows, *elem: their type.
  auto rows_at = [&](const Tensor& x, int64_t j, int64_t* run, int64_t* rs,
                     gemm::Elem* elem) -> const void* {
    const auto [at, n] = locate(x, j);
    *run = std::min(n, t.kv_end - j);
    const DType dt = x.dtype();
    if (x.stride(3) == 1 && (dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16)) {
      *rs = x.stride(2);
      *elem = gemm::ElemOf(dt);
      return ElementPtr(x, at);
    }
    const int64_t width = x.size(3);
    run_rows.resize(static_cast<size_t>(*run * width));
    for (int64_t jj = 0; jj < *run; ++jj) {
      LoadF32(dt, ElementPtr(x, at + jj * x.stride(2)), width, x.stride(3),
              run_rows.data() + jj * width);
    }
    *rs = width;
    *elem = gemm::Elem::kF32;
    return run_rows.data();
  };
  for (int64_t j = kv_begin, run = 0; j < t.kv_end; j += run) {  // q · kᵀ
    int64_t rs = 0;
    gemm::Elem elem;
    const void* keys = rows_at(k, j, &run, &rs, &elem);
    for (int64_t r0 = 0; r0 < m; r0 += gemm::kSkinnyMaxRows) {
      const int mm = static_cast<int>(std::min<int64_t>(gemm::kSkinnyMaxRows, m - r0));
      ks.dot(mm, run, d, qs + r0 * ldq, ldq, keys, rs, elem, s + r0 * nkv + (j - kv_begin), nkv,
             pf, order);
    }
  }
  for (int64_t rr = 0; rr < m; ++rr) {
    const int64_t r = rr % t.rows;
    const int64_t limit =
        t.causal ? std::clamp<int64_t>(t.pos0 + r + 1, 0, t.kv_end) : t.kv_end;
    // Keys [first, limit) are visible (Note [Attention options]: the window); first >= kv_begin.
    const int64_t first =
        t.window > 0 ? std::clamp<int64_t>(t.pos0 + r + 1 - t.window, 0, limit) : 0;
    const float* add = t.mask != nullptr ? t.mask + r * t.mask_rs + first : nullptr;
    const float sink =
        t.sinks != nullptr ? t.sinks[rr / t.rows] : -std::numeric_limits<float>::infinity();
    SoftmaxScoreRow(s + rr * nkv, nkv, first - kv_begin, limit - kv_begin, t.scale, t.softcap,
                    add, sink, t.sinks != nullptr, tmp);
  }
  for (int64_t j = kv_begin, run = 0; j < t.kv_end; j += run) {  // p · v
    int64_t rs = 0;
    gemm::Elem elem;
    const void* values = rows_at(v, j, &run, &rs, &elem);
    const int64_t ldr = (run + 15) / 16 * 16;
    for (int64_t rr = 0; rr < m; ++rr) {
      std::copy_n(s + rr * nkv + (j - kv_begin), run, ps + rr * ldr);
      std::fill(ps + rr * ldr + run, ps + (rr + 1) * ldr, 0.0f);
    }
    float* dst = j == kv_begin ? o : part;
    for (int64_t r0 = 0; r0 < m; r0 += gemm::kSkinnyMaxRows) {
      const int mm = static_cast<int>(std::min<int64_t>(gemm::kSkinnyMaxRows, m - r0));
      ks.axpy(mm, dv, run, ps + r0 * ldr, ldr, values, rs, elem, dst + r0 * dv, dv, pf);
    }
    if (dst == part) {
      for (int64_t e = 0; e < m * dv; ++e) o[e] += part[e];
    }
  }
}

// The score-row path: per task, the f32 scores of every stacked row against every key it may
// see, a masked softmax, then probabilities times values (Note [Score rows read keys in place]).
absl::Status ScoreRows(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params, int64_t block, const Tensor& out) {
  const int64_t batch = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), group = hq / hkv, dv = v.size(3);
  const int64_t q_blocks = (sq + block - 1) / block;
  const int64_t cost = block * group * std::max<int64_t>(1, params.kv_length) * (d + dv) * 2;
  DT_ASSIGN_OR_RETURN(const Prefetch pf, gemm::PickSkinnyPrefetch());
  DT_ASSIGN_OR_RETURN(const gemm::DotOrder order, gemm::PickDotOrder());
  ParallelFor(batch * hkv * q_blocks, cost, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> obuf;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bi = task / (hkv * q_blocks), g = task / q_blocks % hkv;
      const int64_t i0 = task % q_blocks * block, rows = std::min(block, sq - i0);
      ScoreRowTask t;
      t.rows = rows, t.m = group * rows;
      t.pos0 = params.q_offset + i0;
      t.kv_end = params.kv_length;
      if (params.causal) t.kv_end = std::clamp<int64_t>(t.pos0 + rows, 0, t.kv_end);
      t.causal = params.causal, t.window = params.window;
      t.scale = params.scale, t.softcap = params.softcap;
      if (params.sinks != nullptr) t.sinks = params.sinks + g * group;
      if (params.mask != nullptr) {
        t.mask = params.mask + bi * params.mask_bs + i0 * params.mask_rs;
        t.mask_rs = params.mask_rs;
      }
      obuf.resize(static_cast<size_t>(t.m * dv));
      if (t.kv_end > 0) {
        RunScoreRows(
            t, q, q.stride(3),
            [&](int64_t rr) { return At(q, bi, g * group + rr / rows, i0 + rr % rows); }, k, v,
            [&](const Tensor& x, int64_t j) {
              return std::pair<int64_t, int64_t>{At(x, bi, g, j), x.size(2) - j};
            },
            pf, order, obuf.data());
      } else {
        std::fill(obuf.begin(), obuf.end(), 0.0f);
      }
      for (int64_t rr = 0; rr < t.m; ++rr) {
        StoreF32(out.dtype(), ElementPtr(out, At(out, bi, g * group + rr / rows, i0 + rr % rows)),
                 dv, 1, obuf.data() + rr * dv);
      }
    }
  });
  return absl::OkStatus();
}

// Rows [0, n) of a tensor of keys or values (row j at element at(t, j), any float dtype) as
// contiguous rows in buf: as bf16 bits for kBF16 (rounded where they are not bf16), else as f32.
template <typename At>
const void* GatherRows(const Tensor& t, int64_t n, attention::Elem elem, std::vector<float>& buf,
                       const At& at) {
  const int64_t width = t.size(3);
  if (elem == attention::Elem::kF32) {
    buf.resize(static_cast<size_t>(n * width));
    for (int64_t j = 0; j < n; ++j) {
      LoadF32(t.dtype(), ElementPtr(t, at(t, j)), width, t.stride(3), buf.data() + j * width);
    }
    return buf.data();
  }
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(width));
  buf.resize(static_cast<size_t>((n * width + 1) / 2));
  uint16_t* dst = reinterpret_cast<uint16_t*>(buf.data());
  for (int64_t j = 0; j < n; ++j) {
    LoadF32(t.dtype(), ElementPtr(t, at(t, j)), width, t.stride(3), row.data());
    StoreF32(DType::kBF16, dst + j * width, width, 1, row.data());
  }
  return dst;
}

// Rows [0, n) of t[bi, g] for a flash task (row j at the result + j * *rs, unit stride): where they
// lie when they are `elem` with unit stride, else gathered into buf.
const void* TaskRows(const Tensor& t, int64_t bi, int64_t g, int64_t n, attention::Elem elem,
                     std::vector<float>& buf, int64_t* rs) {
  const DType want = elem == attention::Elem::kBF16 ? DType::kBF16 : DType::kF32;
  if (t.dtype() == want && t.stride(3) == 1) {
    *rs = t.stride(2);
    return ElementPtr(t, At(t, bi, g, 0));
  }
  *rs = t.size(3);
  return GatherRows(t, n, elem, buf, [&](const Tensor& x, int64_t j) { return At(x, bi, g, j); });
}

absl::Status Flash(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                   int64_t block, int64_t kv_block, const Tensor& out) {
  const int64_t batch = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hkv = k.size(1), group = hq / hkv, dv = v.size(3);
  const int64_t q_blocks = (sq + block - 1) / block;
  const int64_t cost = block * group * std::max<int64_t>(1, params.kv_length) * (d + dv) * 2;
  // bf16 stays bf16 (multiplied as bf16 where the CPU can); f32 and f16 run in f32.
  const attention::Elem elem =
      q.dtype() == DType::kBF16 ? attention::Elem::kBF16 : attention::Elem::kF32;
  const attention::FlashFn flash = attention::FlashFor(attention::ActiveIsa(), elem);
  // The kernel writes f32 rows of unit stride straight into out; other outputs go through a buffer.
  const bool direct = out.dtype() == DType::kF32 && out.stride(3) == 1;
  ParallelFor(batch * hkv * q_blocks, cost, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> qbuf, kbuf, vbuf, obuf;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bi = task / (hkv * q_blocks), g = task / q_blocks % hkv;
      const int64_t i0 = task % q_blocks * block, rows = std::min(block, sq - i0);
      const int64_t m = group * rows;  // stacked row hg * rows + r: head g * group + hg, query i0 + r
      int64_t kv_end = params.kv_length;
      if (params.causal) kv_end = std::clamp<int64_t>(params.q_offset + i0 + rows, 0, kv_end);
      attention::FlashTask t;
      t.group = group, t.rows = rows, t.d = d, t.dv = dv;
      PointOut(t, direct ? out.data<float>() + At(out, bi, g * group, i0) : nullptr, out.stride(1),
               out.stride(2), obuf);
      if (kv_end == 0) {
        ZeroOut(t);
      } else {
        if (q.dtype() == DType::kF16) {
          qbuf.resize(static_cast<size_t>(m * d));
          for (int64_t hg = 0; hg < group; ++hg) {
            LoadRows(q, bi, g * group + hg, i0, rows, qbuf.data() + hg * rows * d);
          }
          t.q = qbuf.data();
          t.q_hs = rows * d, t.q_rs = d, t.q_cs = 1;
        } else {
          t.q = ElementPtr(q, At(q, bi, g * group, i0));
          t.q_hs = q.stride(1), t.q_rs = q.stride(2), t.q_cs = q.stride(3);
        }
        t.k = TaskRows(k, bi, g, kv_end, elem, kbuf, &t.k_rs);
        t.v = TaskRows(v, bi, g, kv_end, elem, vbuf, &t.v_rs);
        t.kv_end = kv_end;
        t.causal = params.causal;
        t.limit0 = params.q_offset + i0 + 1;
        t.scale = params.scale;
        t.softcap = params.softcap, t.window = params.window;
        if (params.sinks != nullptr) t.sinks = params.sinks + g * group;
        if (params.mask != nullptr) {
          t.mask = params.mask + bi * params.mask_bs + i0 * params.mask_rs;
          t.mask_rs = params.mask_rs;
        }
        t.kv_block = kv_block;
        flash(t);
      }
      if (!direct) {
        for (int64_t rr = 0; rr < m; ++rr) {
          const int64_t at = At(out, bi, g * group + rr / rows, i0 + rr % rows);
          StoreF32(out.dtype(), ElementPtr(out, at), dv, out.stride(3), obuf.data() + rr * dv);
        }
      }
    }
  });
  return absl::OkStatus();
}

// Note [Paged attention]
// PagedAttention (ops::PagedAttentionInto) is the flash path over a serving engine's KV pages
// (nn/models/engine.cc): the query rows of many sequences stacked along one axis, each sequence's
// keys and values in fixed-size pages of one pool, [pages, Hkv, P, D], named by its row of the
// page table. A task is (sequence, KV head, block of its queries) with the group's rows stacked as
// in Flash; its keys are those of its sequence, read where they lie: the task carries the page
// table's row, and the kernel walks each block of kv_block keys in runs that do not cross a page
// (ForRuns in attention_kernels.h), so a page of P rows is read as the contiguous rows it is, and
// the online softmax is the same as over contiguous keys (blocks of kv_block keys, whatever P).
// Causal rows are bottom-right aligned per sequence: row r of a sequence with n query rows and L
// keys sees keys j <= L - n + r, its KV cache's positions before it and its own. A task of fewer
// stacked rows than the tuning's flash_min_rows (decode: `group` rows; "Decode" in Note [Flash
// attention on the CPU]) takes the score-row path as the contiguous decode does, one page's run
// of keys at a time (Note [Score rows read keys in place]). On the flash path a decode
// task of 3 rows filled 3 of a tile's 16 lanes: in a perf profile of bench_serve_engine (AMD EPYC
// Zen 4 VM, 2 vCPUs, beside builds) SmolLM2's paged decode attention took ~10x the samples of
// Generate's score-row attention, a few % of the engine's one-sequence decode. Other tasks take
// the flash path; there pages of another dtype than the path's (and pages whose rows are not of
// unit stride) are gathered into contiguous rows per task.

// The paged path: per task, a sequence's stacked rows against its pages (Note [Paged attention]).
absl::Status Paged(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                   const Tensor& page_table, const Tensor& query_starts, const Tensor& kv_lengths,
                   const PagedAttentionParams& params, int64_t block, int64_t kv_block,
                   int64_t min_rows, const Tensor& out) {
  const int64_t hq = q.size(0), d = q.size(2);
  const int64_t hkv = k_pages.size(1), page = k_pages.size(2), dv = v_pages.size(3);
  const int64_t group = hq / hkv;
  DT_ASSIGN_OR_RETURN(const Tensor table, page_table.Contiguous());
  DT_ASSIGN_OR_RETURN(const Prefetch pf, gemm::PickSkinnyPrefetch());  // for the score rows
  DT_ASSIGN_OR_RETURN(const gemm::DotOrder order, gemm::PickDotOrder());
  const std::vector<int64_t> starts = query_starts.ToVector<int64_t>();
  const std::vector<int64_t> lengths = kv_lengths.ToVector<int64_t>();
  const int64_t seqs = static_cast<int64_t>(lengths.size());
  struct Task {
    int64_t seq, g, i0;
  };
  std::vector<Task> tasks;
  int64_t work = 0;
  for (int64_t i = 0; i < seqs; ++i) {
    const int64_t n = starts[i + 1] - starts[i];
    for (int64_t g = 0; g < hkv; ++g) {
      for (int64_t i0 = 0; i0 < n; i0 += block) tasks.push_back({i, g, i0});
    }
    work += n * group * hkv * std::max<int64_t>(1, lengths[i]) * (d + dv) * 2;
  }
  if (tasks.empty()) return absl::OkStatus();
  const int64_t cost = std::max<int64_t>(1, work / static_cast<int64_t>(tasks.size()));
  const attention::Elem elem =
      q.dtype() == DType::kBF16 ? attention::Elem::kBF16 : attention::Elem::kF32;
  const DType want = elem == attention::Elem::kBF16 ? DType::kBF16 : DType::kF32;
  const attention::FlashFn flash = attention::FlashFor(attention::ActiveIsa(), elem);
  // Pages read where they lie when they hold `want` rows of unit stride; else gathered per task.
  const bool in_place = k_pages.dtype() == want && k_pages.stride(3) == 1 &&
                        v_pages.stride(3) == 1;
  const bool direct = out.dtype() == DType::kF32 && out.stride(2) == 1;
  const int32_t* ptab = table.data<int32_t>();
  const int64_t max_pages = table.size(1);
  ParallelFor(static_cast<int64_t>(tasks.size()), cost, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> qbuf, kbuf, vbuf, obuf;
    // A task's m rows from obuf into out: query heads from h0, rows [row0, row0 + rows).
    auto store = [&](int64_t h0, int64_t row0, int64_t rows, int64_t m) {
      for (int64_t rr = 0; rr < m; ++rr) {
        const int64_t at = (h0 + rr / rows) * out.stride(0) + (row0 + rr % rows) * out.stride(1);
        StoreF32(out.dtype(), ElementPtr(out, at), dv, out.stride(2), obuf.data() + rr * dv);
      }
    };
    for (int64_t ti = lo; ti < hi; ++ti) {
      const Task& task = tasks[ti];
      const int64_t n = starts[task.seq + 1] - starts[task.seq], len = lengths[task.seq];
      const int64_t row0 = starts[task.seq] + task.i0, rows = std::min(block, n - task.i0);
      const int64_t m = group * rows, h0 = task.g * group;
      const int64_t q_offset = len - n;  // the position of the sequence's first query row
      const int64_t kv_end =
          params.causal ? std::clamp<int64_t>(q_offset + task.i0 + rows, 0, len) : len;
      const int32_t* pages = ptab + task.seq * max_pages;
      if (m < min_rows && kv_end > 0) {  // Note [Paged attention]: decode on score rows
        ScoreRowTask st;
        st.rows = rows, st.m = m;
        st.pos0 = q_offset + task.i0, st.kv_end = kv_end;
        st.causal = params.causal, st.window = params.window;
        st.scale = params.scale, st.softcap = params.softcap;
        if (params.sinks != nullptr) st.sinks = params.sinks + h0;
        obuf.resize(static_cast<size_t>(m * dv));
        // Keys in runs that end at a page's end (Note [Paged attention]).
        RunScoreRows(
            st, q, q.stride(2),
            [&](int64_t rr) {
              return (h0 + rr / rows) * q.stride(0) + (row0 + rr % rows) * q.stride(1);
            },
            k_pages, v_pages,
            [&](const Tensor& pool, int64_t j) {
              return std::pair<int64_t, int64_t>{pages[j / page] * pool.stride(0) +
                                                     task.g * pool.stride(1) +
                                                     j % page * pool.stride(2),
                                                 page - j % page};
            },
            pf, order, obuf.data());
        store(h0, row0, rows, m);
        continue;
      }
      attention::FlashTask t;
      t.group = group, t.rows = rows, t.d = d, t.dv = dv;
      PointOut(t, direct ? out.data<float>() + h0 * out.stride(0) + row0 * out.stride(1) : nullptr,
               out.stride(0), out.stride(1), obuf);
      if (kv_end == 0) {
        ZeroOut(t);
      } else {
        if (q.dtype() == DType::kF16) {
          qbuf.resize(static_cast<size_t>(m * d));
          for (int64_t rr = 0; rr < m; ++rr) {
            const int64_t at = (h0 + rr / rows) * q.stride(0) + (row0 + rr % rows) * q.stride(1);
            LoadF32(q.dtype(), ElementPtr(q, at), d, q.stride(2), qbuf.data() + rr * d);
          }
          t.q = qbuf.data();
          t.q_hs = rows * d, t.q_rs = d, t.q_cs = 1;
        } else {
          t.q = ElementPtr(q, h0 * q.stride(0) + row0 * q.stride(1));
          t.q_hs = q.stride(0), t.q_rs = q.stride(1), t.q_cs = q.stride(2);
        }
        // Row j of a pool's pages for this task's KV head.
        auto at = [&](const Tensor& pool, int64_t j) {
          return pages[j / page] * pool.stride(0) + task.g * pool.stride(1) +
                 j % page * pool.stride(2);
        };
        if (in_place) {
          t.k = ElementPtr(k_pages, task.g * k_pages.stride(1));
          t.v = ElementPtr(v_pages, task.g * v_pages.stride(1));
          t.k_rs = k_pages.stride(2), t.v_rs = v_pages.stride(2);
          t.pages = pages, t.page = page;
          t.k_ps = k_pages.stride(0), t.v_ps = v_pages.stride(0);
        } else {  // f16 (or strided) pages: the task's rows gathered as contiguous rows
          t.k = GatherRows(k_pages, kv_end, elem, kbuf, at);
          t.v = GatherRows(v_pages, kv_end, elem, vbuf, at);
          t.k_rs = d, t.v_rs = dv;
        }
        t.kv_end = kv_end;
        t.causal = params.causal;
        t.limit0 = q_offset + task.i0 + 1;
        t.scale = params.scale;
        t.softcap = params.softcap, t.window = params.window;
        if (params.sinks != nullptr) t.sinks = params.sinks + h0;
        t.kv_block = kv_block;
        flash(t);
      }
      if (!direct) store(h0, row0, rows, m);
    }
  });
  return absl::OkStatus();
}

// A task is (batch, KV head, block of queries) with the block's rows of every query head of the
// group stacked (Note [Query heads share their KV head's pass]): `block` query positions per task,
// and the flash path from `flash_min` stacked rows (the score rows below). InvalidArgument naming
// `op` for blocks under 1.
struct TaskSplit {
  int64_t block, flash_min;
};
absl::StatusOr<TaskSplit> TaskSplitOf(const char* op, const AttentionTuning& tuning, int64_t q_heads,
                                    int64_t kv_heads, DType dtype) {
  if (tuning.q_block < 1 || tuning.kv_block < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": q_block (", tuning.q_block, ") and kv_block (",
                                                   tuning.kv_block, ") must be at least 1"));
  }
  const int64_t group = kv_heads > 0 ? q_heads / kv_heads : 1;  // none: an empty output
  return TaskSplit{std::max<int64_t>(1, tuning.q_block / group),
                  dtype == DType::kBF16 ? tuning.flash_min_rows_bf16 : tuning.flash_min_rows};
}

}  // namespace

absl::Status PagedAttentionTuned(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                                 const Tensor& page_table, const Tensor& query_starts,
                                 const Tensor& kv_lengths, const PagedAttentionParams& params,
                                 const AttentionTuning& tuning, const Tensor& out) {
  DT_ASSIGN_OR_RETURN(const TaskSplit rows,
                      TaskSplitOf("PagedAttention", tuning, q.size(0), k_pages.size(1), q.dtype()));
  if (out.numel() == 0) return absl::OkStatus();
  return Paged(q, k_pages, v_pages, page_table, query_starts, kv_lengths, params, rows.block,
               tuning.kv_block, rows.flash_min, out);
}

absl::Status PagedAttention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                            const Tensor& page_table, const Tensor& query_starts,
                            const Tensor& kv_lengths, const PagedAttentionParams& params,
                            const Tensor& out) {
  DT_ASSIGN_OR_RETURN(const AttentionTuning tuning, TunedAttention(q.dtype()));
  return PagedAttentionTuned(q, k_pages, v_pages, page_table, query_starts, kv_lengths, params,
                             tuning, out);
}

absl::Status WriteToPages(const Tensor& pool, const Tensor& x, const Tensor& slots) {
  const int64_t heads = x.size(0), tokens = x.size(1), width = x.size(2);
  const int64_t page = pool.size(2);
  const std::vector<int64_t> s = slots.ToVector<int64_t>();
  const bool same = pool.dtype() == x.dtype() && pool.stride(3) == 1 && x.stride(2) == 1;
  const int64_t bytes = width * DTypeSize(x.dtype());
  ParallelFor(heads * tokens, width * 2, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(width));
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t h = i / tokens, t = i % tokens;
      char* dst = ElementPtr(pool, s[t] / page * pool.stride(0) + h * pool.stride(1) +
                                       s[t] % page * pool.stride(2));
      const char* src = ElementPtr(x, h * x.stride(0) + t * x.stride(1));
      if (same) {
        std::memcpy(dst, src, static_cast<size_t>(bytes));
      } else {
        LoadF32(x.dtype(), src, width, x.stride(2), row.data());
        StoreF32(pool.dtype(), dst, width, pool.stride(3), row.data());
      }
    }
  });
  return absl::OkStatus();
}

absl::Status AttentionTuned(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionParams& params, const AttentionTuning& tuning,
                            const Tensor& out) {
  DT_ASSIGN_OR_RETURN(const TaskSplit rows,
                      TaskSplitOf("Attention", tuning, q.size(1), k.size(1), q.dtype()));
  if (out.numel() == 0) return absl::OkStatus();
  if (q.size(1) / k.size(1) * q.size(2) < rows.flash_min) return ScoreRows(q, k, v, params, rows.block, out);
  return Flash(q, k, v, params, rows.block, tuning.kv_block, out);
}

namespace {

// The candidates of attention.blocks: "q_block/kv_block".
std::pair<int64_t, int64_t> BlocksNamed(const std::string& name) {
  const size_t slash = name.find('/');
  return {std::stoll(name.substr(0, slash)), std::stoll(name.substr(slash + 1))};
}

// Causal prefill on the CPU's threads for attention.blocks: 1024 tokens, 16 query heads over 4 KV
// heads of 64 and 128 elements, f32 and bf16 (a Llama layer's shapes); in cache, as a prefill
// step's q, k and v are. GFLOP/s of the causal half of q·kᵀ and p·v.
class BlocksTrial : public tune::Trial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<BlocksTrial>(new BlocksTrial);
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const int64_t d : {64, 128}) {
        Case c;
        DT_ASSIGN_OR_RETURN(c.q, Tensor::Randn({1, 16, kTokens, d}, 1, dtype));
        DT_ASSIGN_OR_RETURN(c.k, Tensor::Randn({1, 4, kTokens, d}, 2, dtype));
        DT_ASSIGN_OR_RETURN(c.v, Tensor::Randn({1, 4, kTokens, d}, 3, dtype));
        DT_ASSIGN_OR_RETURN(c.out, Tensor::Empty({1, 16, kTokens, d}, dtype));
        t->flops_ += 2.0 * 2.0 * 16 * kTokens * kTokens / 2 * d;
        t->cases_.push_back(std::move(c));
      }
    }
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    AttentionTuning tuning;
    std::tie(tuning.q_block, tuning.kv_block) = BlocksNamed(BlocksKnob().candidates[candidate]);
    tuning.flash_min_rows = tuning.flash_min_rows_bf16 = 0;
    AttentionParams params;
    params.causal = true;
    params.kv_length = kTokens;
    for (const Case& c : cases_) {
      params.scale = 1.0f / std::sqrt(static_cast<float>(c.q.size(3)));
      DT_RETURN_IF_ERROR(AttentionTuned(c.q, c.k, c.v, params, tuning, c.out));
    }
    return absl::OkStatus();
  }
  double Work() const override { return flops_; }
  int Threads() const override { return gemm::AvailableThreads(); }

 private:
  static constexpr int64_t kTokens = 1024;
  struct Case {
    Tensor q, k, v, out;
  };
  std::vector<Case> cases_;
  double flops_ = 0;
};

// One decode step of every layer of a model for attention.decode_<dtype>: 1 query row of 16 heads
// against 4 KV heads of 128 elements and 2048 cached positions per layer, layers until twice the
// last-level cache of keys and values (as a long context reads them: from memory), the CPU's
// threads. GB/s of keys and values.
class DecodeTrial : public tune::Trial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make(DType dtype) {
    auto t = std::unique_ptr<DecodeTrial>(new DecodeTrial(dtype));
    const int64_t layer_bytes = 2 * 4 * kPositions * 128 * DTypeSize(dtype);
    for (int64_t bytes = 0, i = 0; bytes < tune::ColdBytes(); bytes += layer_bytes, ++i) {
      Layer l;
      DT_ASSIGN_OR_RETURN(l.k, Tensor::Full({1, 4, kPositions, 128}, 0.01 * (i % 7), dtype));
      DT_ASSIGN_OR_RETURN(l.v, Tensor::Full({1, 4, kPositions, 128}, 0.02, dtype));
      t->layers_.push_back(std::move(l));
      t->bytes_ += static_cast<double>(layer_bytes);
    }
    DT_ASSIGN_OR_RETURN(t->q_, Tensor::Randn({1, 16, 1, 128}, 4, dtype));
    DT_ASSIGN_OR_RETURN(t->out_, Tensor::Empty({1, 16, 1, 128}, dtype));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    AttentionTuning tuning;
    // "rows": the score-row path for every decode call; "flash": the flash path.
    const bool flash = DecodeKnob(dtype_).candidates[candidate] == "flash";
    tuning.flash_min_rows = tuning.flash_min_rows_bf16 = flash ? 0 : kScoreRowsBelow;
    AttentionParams params;
    params.causal = true;
    params.kv_length = kPositions;
    params.q_offset = kPositions - 1;  // the new token sees every cached one
    params.scale = 1.0f / std::sqrt(128.0f);
    for (const Layer& l : layers_) DT_RETURN_IF_ERROR(AttentionTuned(q_, l.k, l.v, params, tuning, out_));
    return absl::OkStatus();
  }
  double Work() const override { return bytes_; }
  int Threads() const override { return gemm::AvailableThreads(); }

 private:
  explicit DecodeTrial(DType dtype) : dtype_(dtype) {}
  static constexpr int64_t kPositions = 2048;
  struct Layer {
    Tensor k, v;
  };
  DType dtype_;
  std::vector<Layer> layers_;
  Tensor q_, out_;
  double bytes_ = 0;
};

}  // namespace

const tune::Knob& BlocksKnob() {
  static const tune::Knob knob{
      .name = "attention.blocks",
      .what = "the flash attention's blocks: query rows per task / keys per block (prefill)",
      .candidates = {"64/64", "64/128", "64/256", "32/64", "128/64", "128/128"},
      .unit = "GFLOP/s",
      .rounds = 5,
      .make_trial = &BlocksTrial::Make,
  };
  return knob;
}

const tune::Knob& DecodeKnob(DType dtype) {
  DT_CHECK(dtype == DType::kF32 || dtype == DType::kBF16);
  auto make = [](DType t, const char* first, const char* second) {
    return new tune::Knob{
        .name = absl::StrCat("attention.decode_", DTypeName(t)),
        .what = absl::StrCat("the path of ", DTypeName(t),
                             " decode attention (under ", kScoreRowsBelow,
                             " stacked query rows): score rows or flash"),
        .candidates = {first, second},
        .unit = "GB/s",
        .rounds = 5,
        .make_trial = [t]() { return DecodeTrial::Make(t); },
    };
  };
  // Each dtype's first candidate is what measured faster on the AMD EPYC Zen 4 VM (Note [Flash
  // attention on the CPU]); candidate 0 is also the choice when nothing can be measured.
  static const tune::Knob* const f32 = make(DType::kF32, "rows", "flash");
  static const tune::Knob* const bf16 = make(DType::kBF16, "flash", "rows");
  return dtype == DType::kBF16 ? *bf16 : *f32;
}

absl::StatusOr<AttentionTuning> TunedAttention(DType dtype) {
  AttentionTuning tuning;
  DT_ASSIGN_OR_RETURN(const int blocks, tune::Pick(BlocksKnob()));
  std::tie(tuning.q_block, tuning.kv_block) = BlocksNamed(BlocksKnob().candidates[blocks]);
  if (dtype == DType::kF32 || dtype == DType::kBF16) {
    const tune::Knob& decode = DecodeKnob(dtype);
    DT_ASSIGN_OR_RETURN(const int path, tune::Pick(decode));
    const int64_t min_rows = decode.candidates[path] == "flash" ? 0 : kScoreRowsBelow;
    (dtype == DType::kBF16 ? tuning.flash_min_rows_bf16 : tuning.flash_min_rows) = min_rows;
  }
  return tuning;
}

absl::Status Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params, const Tensor& out) {
  DT_ASSIGN_OR_RETURN(const AttentionTuning tuning, TunedAttention(q.dtype()));
  return AttentionTuned(q, k, v, params, tuning, out);
}

}  // namespace dt::ops::cpu
