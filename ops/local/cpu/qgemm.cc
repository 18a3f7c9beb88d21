// The quantized GEMM: Linear with a weight held in GGUF blocks (Note [Quantized dtypes] in
// core/quant.h), for decode (M = 1..8 rows) and prefill (any M) alike.
//
// Note [Quantized GEMM]
// The weight is never dequantized in memory. The activations are quantized once per call, row by
// row, to 16-bit integers with a scale per 32 elements (Note [Activation blocks]); every product
// of a weight block with an activation block is then an integer dot product, scaled once in f32:
//
//   w(p) = dw_h * qw(p) + mw_h      (qw an integer of at most 8 bits, h the 16-element half of p's
//                                    32-block; every type has this form: q4_1 d*q + m, q4_0 d*q -
//                                    8d, q8_0 d*q, q4_k (d*sc)*q - dmin*m, iq4_nl d*kv[q] (qw the
//                                    codebook's value), iq4_xs (d*sc)*kv[q], and with per-16
//                                    scales q6_k (d*sc)*q - 32*d*sc, q3_k (d*sc)*q - 4*d*sc (q the
//                                    3-bit value plus 4), q2_k (d*sc)*q - dmin*m)
//   x(p) = dx * t(p)                (t a 16-bit integer)
//   sum_p w(p) x(p) over one block = dx * sum_h (dw_h * sum_{p in h} qw t) + sum_h mw_h * sx_h,
//                                    sx_h = dx * sum_{p in h} t (stored with the activations)
//
// The integer sums run on vpmaddwd (AVX2: 16 products of 16-bit pairs summed into 8 i32 lanes)
// or vpdpwssd (the same, accumulated, on AVX-VNNI and AVX-512 VNNI). Two kernels per instruction
// set (qgemm_kernels.cc, qgemm_x86.inc):
//   Dot   M <= 4..8 rows of x (decode; the tuner settles the M between, Note [Dot or panels]):
//         each weight block is decoded in registers where it lies,
//         once per four rows of x, and the per-block scales are applied eight blocks at a time
//         (Note [Quantized dot groups]); the weights are read exactly once, as the float skinny
//         GEMM reads them (Note [Skinny GEMM]). With AVX-512 it also comes on 512-bit vectors,
//         the tuner's pick per CPU (Note [512-bit quantized dot]).
//   Gemm  beyond (prefill, batched decode): a chunk of weight rows is decoded into panels (8-bit
//         quants of eight rows interleaved in pairs, widened to the pairs of 16-bit integers
//         vpdpwssd wants as they are loaded), per call or once per weight
//         (Note [Packed quantized weights]), and multiplied with every row of x, a register tile
//         of rows x 16 columns accumulating over each 32-block before its scales are applied
//         (Note [Quantized panels]).
//
// Work split (oneTBB, within the rank's core budget like the float GEMM: AvailableThreads):
// threads take chunks of weight rows (output columns): for Dot each chunk reads at least
// kMinChunkBytes of weights, as many chunks per thread as the tuner settled for the call's size,
// or none (Note [Decode split] in decode_split.cc); for Gemm a chunk's panels stay in L2 while
// all of x streams past them, as many bytes of them as the tuner settled (Note [Panel chunk]).
//
// Note [Activation blocks]
// Each run of 32 activations gets d = max|x| / 32767 and t = round(x / d), plus s = d * sum(t) and
// h = d * (sum of the first 16 t), which the offset terms mw_h * sx_h of every weight type need
// (the per-16 scales of q6_k, q3_k and q2_k are why halves). The rounding error of an activation is
// at most d / 2 = max|x| / 65534 of its block: the tolerance the tests derive from
// (tests/ops/local/qgemm_test.cc).
//
// Why 16 bits and not llama.cpp's 8 (its Q8_0/Q8_1 activation blocks, which u8 x s8 dot products
// such as vpdpbusd and vpmaddubsw take twice as fast): with 8-bit activations every activation is
// off by up to 1/254 of its block's largest, and where a block holds an outlier channel (the
// final norm's output in SmolLM2 reaches 33 next to values near 1) its neighbours lose most of
// their precision. On SmolLM2-135M-Instruct Q4_1 that moved the first logits of the chat answer to
// "What is the capital of France?" by about 0.13, past their 0.08 margin: both an 8-bit build of
// these kernels and llama.cpp (llama-cpp-python 0.3.36) answer "L'Étoile, la Cité, ..." where the
// dequantized f32 model answers "The capital of France is Paris." With 16-bit activations the
// quantized path tracks the dequantized f32 one to about 1e-4 of the logits (the model test's
// KL divergence ~1e-6) and answers Paris. The price is half the integer throughput per
// instruction, which decode (bound by reading the weights) does not notice and prefill pays
// within its target (docs/llama.md, "Quantized weights").

#include "dtensor/ops/local/cpu/qgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "dtensor/core/quant.h"
#include "dtensor/core/storage.h"
#include "dtensor/ops/local/cpu/decode_split.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/isa_choice.h"
#include "dtensor/ops/local/cpu/kept_weights.h"
#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu {


namespace {

constexpr int64_t kMinChunkBytes = int64_t{16} << 10;
// Rows of x up to which Dot runs (the panels beyond): the candidates of the tuner's knobs
// qgemm.dot_max_rows and qgemm.dot_max_rows_kept, whose picks settle the M between the first and
// the last (Note [Dot or panels]).
constexpr int64_t kDotMaxRows[] = {4, 5, 6, 7, 8};
constexpr int64_t kDotAlways = kDotMaxRows[0], kPanelsBeyond = std::end(kDotMaxRows)[-1];
// Note [Panel chunk]
// A chunk of weight rows is packed into panels and then multiplied with every row of x (Note
// [Quantized panels]): the panels should still be in L2 when the rows of x reach them, and x's
// own rows pass through the same L2. How many bytes of panels that allows depends on the CPU (an
// L2 of 1 MiB per core on AMD Zen 4, 2 MiB on Intel Sapphire Rapids, 1.25 MiB on Ice Lake) and on
// what its prefetchers keep there, so it is the tuner's knob qgemm.panel_chunk: the most bytes of
// panels in one chunk (fewer where the weights give each thread less than two chunks). 384 KiB,
// candidate 0, was the fixed bound before it was a knob (set to fit Zen 4's L2; no measurement of
// it was recorded); on the 2-vCPU Zen 5 VM (2026-12-07) 384k and 192k measured within 1-3 % of
// each other in five calibrations, 768k and 1536k 3-10 % slower. A trial's run
// multiplies 128 rows of x with q4_1 weights [2048, 2048] and [5632, 2048] (a 1B model's attention
// and MLP shapes, 2.5 and 7 KiB of panels per row), packed per call, the arena's threads.
constexpr int64_t kPanelChunkKiB[] = {384, 192, 768, 1536};

// The most bytes of panels in one chunk: candidate i of qgemm.panel_chunk.
int64_t PanelChunkBytes(int candidate) {
  return kPanelChunkKiB[static_cast<size_t>(candidate)] << 10;
}

// x [m, k] (unit column stride) quantized (Note [Activation blocks]) into `buf`: t (m * k int16),
// then d, s and h (m * ld floats each); rows.t is null when out of memory. f32 rows are read where
// they lie; rows of a half dtype are widened one at a time into an f32 row that stays in L1 and
// quantized from there, so x is read once (not widened into a scratch copy of all of it and then
// read again). With `paired`, rows.paired too, after h (the 512-bit dot's layout).
qgemm::QRows QuantizeRows(const qgemm::Kernels& ks, const Tensor& x,
                          std::optional<gemm::ScratchBuffer>& buf, bool paired = false) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t ld = qgemm::QRowsLd(k), pld = qgemm::PairedLd(k);
  buf.emplace(gemm::ScratchSlot::kQuant, m * k / 2 + 3 * m * ld + (paired ? m * pld / 2 : 0));
  qgemm::QRows rows;
  if (buf->data() == nullptr) return rows;
  rows.m = static_cast<int>(m);
  rows.k = k;
  rows.ld = ld;
  int16_t* t = reinterpret_cast<int16_t*>(buf->data());
  float* d = buf->data() + m * k / 2;
  float* s = d + m * ld;
  float* h = d + 2 * m * ld;
  rows.t = t;
  rows.d = d;
  rows.s = s;
  rows.h = h;
  ParallelFor(m, k, [&](int64_t lo, int64_t hi) {
    if (x.dtype() == DType::kF32) {
      ks.quantize(static_cast<int>(hi - lo), k, x.data<float>() + lo * x.stride(0), x.stride(0),
                  t + lo * k, d + lo * ld, s + lo * ld, h + lo * ld);
      return;
    }
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(k));
    for (int64_t i = lo; i < hi; ++i) {
      LoadF32(x.dtype(), ElementPtr(x, i * x.stride(0)), k, 1, row.data());
      ks.quantize(1, k, row.data(), k, t + i * k, d + i * ld, s + i * ld, h + i * ld);
    }
  });
  if (paired) {
    int16_t* out = reinterpret_cast<int16_t*>(h + m * ld);
    const int64_t subs = k / 32;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; 2 * p < subs; ++p) {
        const int16_t* a = t + i * k + 64 * p;
        int16_t* o = out + i * pld + 64 * p;
        const bool b = 2 * p + 1 < subs;
        std::memcpy(o, a, 32);
        std::memcpy(o + 32, a + 16, 32);
        if (b) {
          std::memcpy(o + 16, a + 32, 32);
          std::memcpy(o + 48, a + 48, 32);
        } else {
          std::memset(o + 16, 0, 32);
          std::memset(o + 48, 0, 32);
        }
      }
    }
    rows.paired = out;
  }
  return rows;
}

// Note [Packed quantized weights]
// The prefill kernel multiplies panels (Note [Quantized panels]), which it otherwise decodes from
// the weight's blocks on every call: a serving engine that batches 5..16 sequences per decode step
// runs the panel kernel every step and spent ~15 % of its samples in that repacking (issue 48).
// A process may instead keep each weight's panels, made once at its first product on panels
// and reused by every later one. The panels take 40 bytes per row and 32-block (8-bit quants, an
// f32 scale and offset; 48 with per-16 scales): 2x a q4_1 weight, 1.2x q8_0, 4.6x q2_k. Decode
// (M <= kDotAlways) keeps reading the blocks, which are the fewest bytes per product and what
// decode is bound by, so the panels cannot replace the original layout: they come beside it, kept
// per weight under the process's budget for kept layouts (Note [Kept weights] in
// kept_weights.cc: SetPackedBudget, DT_QGEMM_PACKED_MB; 0, the default, keeps none). A weight
// whose panels do not fit is packed per call as before; PackedBytes() is what is held, for a load
// report. Quantized weights are never written after loading, so every one qualifies.

// The panels of all of w's rows into `p` (GemmScratchBytes of them), packed over the arena's
// threads.
void PackInto(const qgemm::Kernels& ks, const Tensor& w, uint8_t* p) {
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t lanes = ks.gemm_lanes, row_bytes = DTypeBytes(w.dtype(), k);
  const int64_t groups = (n + lanes - 1) / lanes;
  const int64_t group_bytes = qgemm::GemmScratchBytes(ks, w.dtype(), lanes, k);
  const uint8_t* wp = static_cast<const uint8_t*>(w.raw_data());
  ParallelFor(groups, lanes * row_bytes, [&](int64_t lo, int64_t hi) {
    ks.pack(w.dtype(), std::min(n, hi * lanes) - lo * lanes, k, wp + lo * lanes * row_bytes, row_bytes,
            p + lo * group_bytes);
  });
}

// The panels of w (all its rows) if the process keeps them and they fit (Note [Packed quantized
// weights]), made on first use; else null.
const uint8_t* KeptPanels(const qgemm::Kernels& ks, const Tensor& w) {
  if (!kept::Keeping()) return nullptr;
  const int64_t n = w.size(0), k = w.size(1);
  const std::string key =
      absl::StrCat("qgemm ", reinterpret_cast<uintptr_t>(w.raw_data()), " ", DTypeName(w.dtype()),
                   " ", n, "x", k, " ", qgemm::IsaName(qgemm::ActiveIsa()));
  const int64_t bytes = qgemm::GemmScratchBytes(ks, w.dtype(), n, k);
  const Storage panels = kept::Layout(w.storage(), key, bytes, [&](void* out) {
    PackInto(ks, w, static_cast<uint8_t*>(out));
    return true;
  });
  // The entry holds the panels until the budget drops to 0 (a test's or the process's teardown).
  return static_cast<const uint8_t*>(panels.data());
}

// One product of a call: a weight, its f32 bias (or null) and its output.
struct Target {
  const Tensor* w;
  const float* bias32;
  const Tensor* out;
  // The weight's panels if the process keeps them (Note [Packed quantized weights]), else null.
  const uint8_t* panels = nullptr;
};

// Threads take chunks of weight rows (output columns): Dot's chunks_per_thread of them per thread,
// 0 for none (Note [Decode split] in decode_split.cc); Gemm's are whole register tiles whose panels
// fit panel_bytes (Note [Panel chunk]), at least two per thread where the weights allow, for oneTBB
// to balance (Note [Quantized GEMM]). The chunks of all the targets run in one fork-join (Note
// [Sibling projections]). `pf` is the prefetch of the kernel that runs: Dot's, or (pf.hint) the
// panels'.
absl::Status Multiply(const qgemm::Kernels& ks, bool packed, const qgemm::QRows& rows,
                      absl::Span<const Target> targets, Prefetch pf, int chunks_per_thread,
                      int64_t panel_bytes) {
  const int64_t m = rows.m, k = rows.k;
  const int threads = gemm::AvailableThreads();
  int64_t total_bytes = 0;
  for (const Target& t : targets) total_bytes += t.w->size(0) * DTypeBytes(t.w->dtype(), k);
  struct Task {
    const Target* target;
    int64_t j0, j1;
  };
  std::vector<Task> tasks;
  for (const Target& t : targets) {
    const int64_t n = t.w->size(0), bytes = n * DTypeBytes(t.w->dtype(), k);
    int64_t chunk = n;
    if (packed) {
      const int64_t step = 2 * ks.gemm_lanes;  // a register tile's weight rows
      const int64_t per_row = qgemm::GemmScratchBytes(ks, t.w->dtype(), step, k) / step;
      chunk = std::max<int64_t>(step, panel_bytes / per_row / step * step);
      chunk = std::min(chunk, std::max<int64_t>(step, (n + 2 * threads - 1) / (2 * threads) / step * step));
    } else {
      const int64_t chunks = split::Chunks(bytes, total_bytes, chunks_per_thread, threads, kMinChunkBytes);
      chunk = (n + chunks - 1) / chunks;
    }
    for (int64_t j0 = 0; j0 < n; j0 += chunk) tasks.push_back({&t, j0, std::min(n, j0 + chunk)});
  }
  std::atomic<bool> out_of_memory{false};
  auto run = [&](const Task& task) {
    const Tensor& w = *task.target->w;
    const Tensor& out = *task.target->out;
    const int64_t n = w.size(0), j0 = task.j0, cols = task.j1 - task.j0;
    const DType q = w.dtype(), dtype = out.dtype();
    const int64_t row_bytes = DTypeBytes(q, k);
    const uint8_t* wp = static_cast<const uint8_t*>(w.raw_data());
    const uint8_t* kept = task.target->panels;
    std::optional<gemm::ScratchBuffer> panel, cbuf;
    if (packed && kept == nullptr) {
      panel.emplace(gemm::ScratchSlot::kPackedB, qgemm::GemmScratchBytes(ks, q, cols, k) / 4);
    }
    if (dtype != DType::kF32) cbuf.emplace(gemm::ScratchSlot::kC, m * cols);
    if ((panel && panel->data() == nullptr) || (cbuf && cbuf->data() == nullptr)) {
      out_of_memory = true;
      return;
    }
    float* c = cbuf ? cbuf->data() : out.data<float>() + j0;
    const int64_t ldc = cbuf ? cols : n;
    if (packed && kept != nullptr) {
      // j0 is a whole number of panel groups (the chunks are whole register tiles).
      ks.panels(q, rows, cols, kept + qgemm::GemmScratchBytes(ks, q, j0, k), c, ldc, pf.hint);
    } else if (packed) {
      ks.pack(q, cols, k, wp + j0 * row_bytes, row_bytes, panel->data());
      ks.panels(q, rows, cols, panel->data(), c, ldc, pf.hint);
    } else {
      (rows.paired != nullptr ? ks.dot_wide : ks.dot)(q, rows, cols, wp + j0 * row_bytes,
                                                      row_bytes, c, ldc, pf);
    }
    const float* bias32 = task.target->bias32;
    gemm::FinishRows(m, cols, c, ldc, bias32 != nullptr ? bias32 + j0 : nullptr, dtype,
                     static_cast<char*>(out.raw_data()) + j0 * DTypeSize(dtype), n);
  };
  if (tasks.size() == 1 || threads == 1 || (!packed && chunks_per_thread == 0)) {
    for (const Task& task : tasks) run(task);
  } else {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, tasks.size(), 1),
                      [&](const tbb::blocked_range<size_t>& r) {
                        for (size_t i = r.begin(); i != r.end(); ++i) run(tasks[i]);
                      },
                      tbb::simple_partitioner());
  }
  if (out_of_memory) return absl::ResourceExhaustedError("Linear: out of memory");
  return absl::OkStatus();
}

// The candidates of qgemm.dot_prefetch as kernels take them (Note [Quantized dot prefetch]).
const std::vector<Prefetch>& DotPrefetches() {
  static const std::vector<Prefetch> pfs = [] {
    std::vector<Prefetch> v;
    for (const std::string& name : qgemm::DotPrefetchKnob().candidates) v.push_back(PrefetchNamed(name));
    return v;
  }();
  return pfs;
}

// The dot's prefetch as this process settled it, for trials (which never decide another knob).
Prefetch SettledDotPrefetch() { return DotPrefetches()[tune::Settled(qgemm::DotPrefetchKnob())]; }

// The candidates of qgemm.panels_prefetch as the panels take them (Note [Panels prefetch]), named
// once, not on every product.
PrefetchHint PanelsPrefetch(int candidate) {
  static const std::vector<PrefetchHint> hints = [] {
    std::vector<PrefetchHint> v;
    for (const std::string& name : qgemm::PanelsPrefetchKnob().candidates) {
      v.push_back(PrefetchHintNamed(name));
    }
    return v;
  }();
  return hints[static_cast<size_t>(candidate)];
}

// Cold q4_1 weights of two shapes for the quantized GEMM's knobs, alternating until ColdBytes() of
// them so that every run reads them from memory as a decode step does (and ColdBytes() of panels
// where the trial keeps them), each multiplied by its own count of rows of x quantized once; split
// over the arena's threads as the real products are.
class ColdQuantizedTrial : public tune::Trial {
 public:
  double Work() const override { return bytes_; }
  int Threads() const override { return gemm::AvailableThreads(); }

 protected:
  using MakeWeight = absl::StatusOr<Tensor> (*)(int64_t n, int64_t k, int64_t i);
  using RowsOf = int64_t (*)(int64_t i);
  ColdQuantizedTrial() : ks_(qgemm::KernelsFor(qgemm::ActiveIsa())) {}

  // Weight i (of shape i % 2) meets rows_of(i) rows of x. With keep_panels, panels are made now
  // and the products on panels use them, as in a process that keeps them (Note [Packed quantized
  // weights]): those of the first weights, ColdBytes() of them (2x fewer weights than blocks
  // for q4_1), which weight i reads as panels i mod their count (of its shape): as cold as all
  // the weights' panels would be, in less memory. The products' values are not used.
  absl::Status Fill(const int64_t (&shapes)[2][2], RowsOf rows_of, MakeWeight make, uint64_t x_seed,
                    bool keep_panels) {
    int64_t most_rows = 1, panel_bytes = 0;
    for (int64_t bytes = 0, i = 0; bytes < tune::ColdBytes(); ++i) {
      const int64_t n = shapes[i % 2][0], k = shapes[i % 2][1], m = rows_of(i);
      DT_ASSIGN_OR_RETURN(Tensor w, make(n, k, i));
      DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty({m, n}));
      // Panels in pairs (both shapes), so that i mod their count has weight i's shape.
      if (keep_panels && (panel_bytes < tune::ColdBytes() || panels_.size() % 2 != 0)) {
        DT_ASSIGN_OR_RETURN(Storage p,
                            Storage::Allocate(qgemm::GemmScratchBytes(ks_, w.dtype(), n, k), kCPU));
        PackInto(ks_, w, static_cast<uint8_t*>(p.data()));
        panel_bytes += p.nbytes();
        panels_.push_back(std::move(p));
      }
      bytes += w.nbytes();
      bytes_ += static_cast<double>(w.nbytes());
      most_rows = std::max(most_rows, m);
      weights_.push_back(std::move(w));
      outs_.push_back(std::move(out));
    }
    if (panels_.size() % 2 != 0) panels_.pop_back();  // an even count: i mod it keeps i's shape
    for (int s = 0; s < 2; ++s) {
      DT_ASSIGN_OR_RETURN(x_[s], Tensor::Randn({most_rows, shapes[s][1]}, x_seed + s));
      rows_[s] = QuantizeRows(ks_, x_[s], qbuf_[s], /*paired=*/ks_.dot_wide != nullptr);
      if (rows_[s].t == nullptr) return absl::ResourceExhaustedError("tuner: out of memory");
    }
    return absl::OkStatus();
  }

  // Fill with random q4_1 weights of SmolLM2-135M's MLP shapes ([1536, 576] and [576, 1536]), for
  // the knobs of the panels: Unimplemented on a CPU without the panel kernels.
  absl::Status FillMlp(RowsOf rows_of, uint64_t x_seed, bool keep_panels) {
    if (ks_.pack == nullptr) return absl::UnimplementedError("tuner: no panel kernel on this CPU");
    const int64_t shapes[2][2] = {{1536, 576}, {576, 1536}};
    auto random = [](int64_t n, int64_t k, int64_t i) {
      return RandomQuantized(DType::kQ4_1, {n, k}, 11 + i);
    };
    return Fill(shapes, rows_of, random, x_seed, keep_panels);
  }

  // Every weight times its rows of x: on the dot with `pf` up to dot_max_rows rows (512-bit with
  // wide_), on the panels beyond with `panels_hint`; the dot in chunks_per_thread chunks per
  // thread, or as this process settled it for the weight's size where nullopt.
  absl::Status MultiplyAll(int64_t dot_max_rows, Prefetch pf, PrefetchHint panels_hint,
                           std::optional<int> chunks_per_thread = std::nullopt) {
    for (size_t i = 0; i < weights_.size(); ++i) {
      // The rows are laid out one after another: the first m of them are a QRows of their own.
      qgemm::QRows rows = rows_[i % 2];
      rows.m = static_cast<int>(outs_[i].size(0));
      if (!wide_) rows.paired = nullptr;
      rows.pair_bytes = pair_bytes_;
      const bool panels = rows.m > dot_max_rows;
      Target target{&weights_[i], nullptr, &outs_[i]};
      if (panels && !panels_.empty()) {
        target.panels = static_cast<const uint8_t*>(panels_[i % panels_.size()].data());
      }
      const int chunks = chunks_per_thread ? *chunks_per_thread
                                           : split::Settled(qgemm::DotSplitKnobs(), weights_[i].nbytes(),
                                                            gemm::AvailableThreads());
      const Prefetch kernel_pf = panels ? Prefetch{panels_hint, 0} : pf;
      DT_RETURN_IF_ERROR(Multiply(ks_, panels, rows, {target}, kernel_pf, chunks,
                                  PanelChunkBytes(tune::Settled(qgemm::PanelChunkKnob()))));
    }
    return absl::OkStatus();
  }

  const qgemm::Kernels& ks_;
  // The dot's width as this process settled it (Note [512-bit quantized dot]).
  bool wide_ = ks_.dot_wide != nullptr && tune::Settled(qgemm::DotWidthKnob()) == 1;
  // The rows the dot reads in pairs as this process settled it (Note [Quantized dot pairs]).
  int64_t pair_bytes_ = qgemm::DotPairBytes(tune::Settled(qgemm::DotPairsKnob()));

 private:
  std::vector<Tensor> weights_, outs_;
  std::vector<Storage> panels_;
  Tensor x_[2];
  std::optional<gemm::ScratchBuffer> qbuf_[2];
  qgemm::QRows rows_[2];
  double bytes_ = 0;
};

// Decode-shaped products for qgemm.dot_prefetch: one row of x against a small model's projection
// ([1536, 576]: 553 KB, rows of 360 bytes) and a larger one ([2048, 2048]: 2.6 MB, rows of 1280
// bytes).
class DotPrefetchTrial : public ColdQuantizedTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<DotPrefetchTrial>(new DotPrefetchTrial);
    const int64_t shapes[2][2] = {{1536, 576}, {2048, 2048}};
    DT_RETURN_IF_ERROR(t->Fill(shapes, [](int64_t) -> int64_t { return 1; }, &PatternWeight,
                               /*x_seed=*/7, /*keep_panels=*/false));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    return MultiplyAll(/*dot_max_rows=*/1, DotPrefetches()[candidate], PrefetchHint::kNone);
  }

 private:
  // Every block: f16 scale and offset 2^-10 (normal numbers: no denormal slow paths), then 16
  // bytes of nibbles.
  static absl::StatusOr<Tensor> PatternWeight(int64_t n, int64_t k, int64_t) {
    DT_ASSIGN_OR_RETURN(Tensor w, Tensor::Empty({n, k}, DType::kQ4_1));
    uint8_t* b = static_cast<uint8_t*>(w.raw_data());
    for (int64_t blk = 0; blk < n * k / 32; ++blk, b += 20) {
      b[0] = b[2] = 0x00;
      b[1] = b[3] = 0x14;
      for (int q = 0; q < 16; ++q) b[4 + q] = static_cast<uint8_t>(blk * 7 + q * 13);
    }
    return w;
  }
};

// Decode-shaped products for qgemm.dot_width (Note [512-bit quantized dot]): one row of x, then
// four, against cold weights of both families the width changes: a small model's q4_1 projection
// ([1536, 576]: rows of 18 blocks, a partial group; the 32-element types decode pairs) and a q4_k
// one of a larger model ([2048, 2048]; the super-block types join 256-bit halves), with the
// prefetch this process has settled on.
class DotWidthTrial : public ColdQuantizedTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<DotWidthTrial>(new DotWidthTrial);
    if (t->ks_.dot_wide == nullptr) {
      return absl::UnimplementedError("tuner: no 512-bit quantized dot in this set");
    }
    const int64_t shapes[2][2] = {{1536, 576}, {2048, 2048}};
    auto random = [](int64_t n, int64_t k, int64_t i) {
      return RandomQuantized(i % 2 == 0 ? DType::kQ4_1 : DType::kQ4_K, {n, k}, 43 + i);
    };
    DT_RETURN_IF_ERROR(t->Fill(shapes, [](int64_t i) -> int64_t { return (i / 2) % 2 ? 4 : 1; },
                               random, /*x_seed=*/47, /*keep_panels=*/false));
    t->pf_ = SettledDotPrefetch();
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    wide_ = candidate == 1;
    return MultiplyAll(/*dot_max_rows=*/4, pf_, PrefetchHint::kNone);
  }

 private:
  Prefetch pf_;
};

// Decode-shaped products for qgemm.dot_pairs (Note [Quantized dot pairs]): one row of x against
// cold q4_1 weights of SmolLM2-135M's MLP shapes, rows of 360 bytes ([1536, 576]) and of 960
// ([576, 1536]), half the bytes each, so that "512" pairs half of them and "1k" all of them, with
// the width and the prefetch this process has settled on, on one thread: the choice is how one
// core walks its rows (with every core reading, memory bounds them all alike: on the Zen 5 VM at
// 2 threads off gave 29.8 GB/s, 512 29.2, where one thread gained 8-10 %).
class DotPairsTrial : public ColdQuantizedTrial {
 public:
  int Threads() const override { return 1; }
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<DotPairsTrial>(new DotPairsTrial);
    const int64_t shapes[2][2] = {{1536, 576}, {576, 1536}};
    auto random = [](int64_t n, int64_t k, int64_t i) {
      return RandomQuantized(DType::kQ4_1, {n, k}, 53 + i);
    };
    DT_RETURN_IF_ERROR(t->Fill(shapes, [](int64_t) -> int64_t { return 1; }, random,
                               /*x_seed=*/59, /*keep_panels=*/false));
    t->pf_ = SettledDotPrefetch();
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    pair_bytes_ = qgemm::DotPairBytes(candidate);
    return MultiplyAll(/*dot_max_rows=*/1, pf_, PrefetchHint::kNone, /*chunks_per_thread=*/0);
  }

 private:
  Prefetch pf_;
};

// Decode-shaped products for qgemm.dot_split.<class> (Note [Decode split]): one row of x
// against cold q4_1 weights of two shapes whose bytes lie in the class, with the prefetch this
// process has settled on.
class DotSplitTrial : public ColdQuantizedTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make(int size_class) {
    // small: k_proj of SmolLM2-135M (69 KB) and a [96, 1536] slice (92 KB); medium: its q_proj
    // (207 KB) and [384, 1536] (368 KB); large: [1536, 1536] (1.4 MB) and [2048, 2048] (2.6 MB).
    static constexpr int64_t kShapes[3][2][2] = {
        {{192, 576}, {96, 1536}}, {{576, 576}, {384, 1536}}, {{1536, 1536}, {2048, 2048}}};
    auto t = std::unique_ptr<DotSplitTrial>(new DotSplitTrial);
    auto random = [](int64_t n, int64_t k, int64_t i) {
      return RandomQuantized(DType::kQ4_1, {n, k}, 23 + i);
    };
    DT_RETURN_IF_ERROR(t->Fill(kShapes[size_class], [](int64_t) -> int64_t { return 1; }, random,
                               /*x_seed=*/29, /*keep_panels=*/false));
    t->pf_ = SettledDotPrefetch();
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    return MultiplyAll(/*dot_max_rows=*/1, pf_, PrefetchHint::kNone,
                       split::ChunksPerThread(candidate));
  }

 private:
  Prefetch pf_;
};

// Note [Dot or panels]
// Between 4 and 8 rows of x, which kernel is faster depends on the CPU and on whether the process
// keeps the panels: Dot decodes each weight block in registers once per four rows (twice from
// M = 5) and reads the fewest bytes; the panels decode each block once into panels (40 bytes per
// row and 32-block) per call, or read panels made once (2x the bytes of a q4_1 weight), and run
// wider register tiles. Measured one thread each, q4_1 weights [1536, 576] and [576, 1536]
// on the AMD EPYC (Zen 4) VM: Dot 41 and 28 us at M = 1 against the panels' 91 and 97 (packing
// included); at M = 4 Dot 131 and 75 against 111 and 112; from M = 6 the panels won throughout.
// So Dot always serves M <= 4 and the panels M > 8, and two knobs settle the M between on the
// machine that runs it: qgemm.dot_max_rows where the panels are packed per call (the default),
// qgemm.dot_max_rows_kept where the process keeps them (a serving engine: `--packed-weights-mb`;
// a weight past the budget, packed per call there, follows the kept pick too).
// Candidate t runs Dot up to M = t. A trial's run multiplies cold q4_1 weights of both MLP shapes
// of SmolLM2-135M, each by 5, 6, 7 or 8 rows of x in turn (a serving step's M moves between them
// as sequences join and leave), Dot and the panels with the prefetches the process has settled on.
class DotMaxRowsTrial : public ColdQuantizedTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make(bool keep_panels) {
    auto t = std::unique_ptr<DotMaxRowsTrial>(new DotMaxRowsTrial);
    // Each shape meets every M from kDotAlways + 1 to kPanelsBeyond in turn.
    auto rows = [](int64_t i) { return kDotAlways + 1 + (i / 2) % (kPanelsBeyond - kDotAlways); };
    DT_RETURN_IF_ERROR(t->FillMlp(rows, /*x_seed=*/17, keep_panels));
    t->pf_ = SettledDotPrefetch();
    t->panels_hint_ = PanelsPrefetch(tune::Settled(qgemm::PanelsPrefetchKnob()));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    return MultiplyAll(kDotMaxRows[candidate], pf_, panels_hint_);
  }

 private:
  Prefetch pf_;
  PrefetchHint panels_hint_ = PrefetchHint::kNone;
};

// Batched-decode-shaped products for qgemm.panels_prefetch (Note [Panels prefetch]): 16 rows of
// x against the kept panels of cold q4_1 weights of both MLP shapes of SmolLM2-135M, as a serving
// engine's step with 16 sequences multiplies them.
class PanelsPrefetchTrial : public ColdQuantizedTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<PanelsPrefetchTrial>(new PanelsPrefetchTrial);
    DT_RETURN_IF_ERROR(t->FillMlp([](int64_t) -> int64_t { return 16; }, /*x_seed=*/37,
                                  /*keep_panels=*/true));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    return MultiplyAll(/*dot_max_rows=*/0, Prefetch{}, PanelsPrefetch(candidate));
  }
};

// Prefill-shaped products for the knobs of the panels' arithmetic: rows of x against q4_1 weights
// of two shapes on the panels packed per call, the weights in cache (these knobs change the
// arithmetic and the panels' stay in L2, not the memory's speed), the arena's threads. The
// activations are quantized once, the same bits on every set.
class PrefillTrial : public tune::Trial {
 public:
  int Threads() const override { return gemm::AvailableThreads(); }

 protected:
  PrefillTrial() = default;
  absl::Status Fill(const int64_t (&shapes)[2][2], int64_t m, uint64_t seed) {
    for (int s = 0; s < 2; ++s) {
      const int64_t n = shapes[s][0], k = shapes[s][1];
      DT_ASSIGN_OR_RETURN(w_[s], RandomQuantized(DType::kQ4_1, {n, k}, seed + s));
      DT_ASSIGN_OR_RETURN(out_[s], Tensor::Empty({m, n}));
      DT_ASSIGN_OR_RETURN(x_[s], Tensor::Randn({m, k}, seed + 2 + s));
      rows_[s] = QuantizeRows(qgemm::KernelsFor(qgemm::BaseIsa()), x_[s], qbuf_[s]);
      if (rows_[s].t == nullptr) return absl::ResourceExhaustedError("tuner: out of memory");
      bytes_ += static_cast<double>(w_[s].nbytes());
      flops_ += 2.0 * static_cast<double>(m * n * k);
    }
    return absl::OkStatus();
  }
  // Both products on ks's panels, chunks of at most panel_bytes of them.
  absl::Status MultiplyBoth(const qgemm::Kernels& ks, int64_t panel_bytes) {
    if (ks.pack == nullptr) return absl::UnimplementedError("tuner: no panel kernel in this set");
    const Prefetch pf{PanelsPrefetch(tune::Settled(qgemm::PanelsPrefetchKnob())), 0};
    for (int s = 0; s < 2; ++s) {
      const Target target{&w_[s], nullptr, &out_[s]};
      DT_RETURN_IF_ERROR(Multiply(ks, /*packed=*/true, rows_[s], {target}, pf, 0, panel_bytes));
    }
    return absl::OkStatus();
  }
  double bytes_ = 0, flops_ = 0;

 private:
  Tensor w_[2], out_[2], x_[2];
  std::optional<gemm::ScratchBuffer> qbuf_[2];
  qgemm::QRows rows_[2];
};

// qgemm.isa (Note [Tuned instruction set] in isa_choice.h): 32 rows of x against SmolLM2-135M's
// MLP shapes with each candidate set's kernels. Figure: GB/s of blocks.
class IsaTrial : public PrefillTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<IsaTrial>(new IsaTrial);
    const int64_t shapes[2][2] = {{1536, 576}, {576, 1536}};
    DT_RETURN_IF_ERROR(t->Fill(shapes, /*m=*/32, /*seed=*/13));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    return MultiplyBoth(qgemm::KernelsFor(candidates_[static_cast<size_t>(candidate)]),
                        PanelChunkBytes(tune::Settled(qgemm::PanelChunkKnob())));
  }
  double Work() const override { return bytes_; }

 private:
  IsaTrial() = default;
  const std::vector<qgemm::Isa> candidates_ = qgemm::IsaCandidates();
};

// qgemm.panel_chunk (Note [Panel chunk]): 128 rows of x against a 1B model's shapes, the
// process's set. Figure: GFLOP/s.
class PanelChunkTrial : public PrefillTrial {
 public:
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make() {
    auto t = std::unique_ptr<PanelChunkTrial>(new PanelChunkTrial);
    const int64_t shapes[2][2] = {{2048, 2048}, {5632, 2048}};
    DT_RETURN_IF_ERROR(t->Fill(shapes, /*m=*/128, /*seed=*/41));
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override { return MultiplyBoth(ks_, PanelChunkBytes(candidate)); }
  double Work() const override { return flops_; }

 private:
  PanelChunkTrial() = default;
  const qgemm::Kernels& ks_ = qgemm::KernelsFor(qgemm::ActiveIsa());
};

// Whether m rows of x take the panels (Note [Dot or panels]).
absl::StatusOr<bool> UsePanels(const qgemm::Kernels& ks, int64_t m) {
  if (ks.pack == nullptr || m <= kDotAlways) return false;
  if (m > kPanelsBeyond) return true;
  // Both kernels' prefetches first: the knob's trial runs them as settled.
  DT_RETURN_IF_ERROR(tune::Pick(qgemm::DotPrefetchKnob()).status());
  DT_RETURN_IF_ERROR(tune::Pick(qgemm::PanelsPrefetchKnob()).status());
  DT_ASSIGN_OR_RETURN(const int i, tune::Pick(qgemm::DotMaxRowsKnob(kept::Keeping())));
  return m > kDotMaxRows[i];
}

}  // namespace

absl::Status QuantizedLinears(const Tensor& x, absl::Span<const Tensor> ws,
                              absl::Span<const Tensor> biases, absl::Span<const Tensor> outs) {
  const int64_t m = x.size(0);
  const qgemm::Kernels& ks = qgemm::KernelsFor(qgemm::ActiveIsa());
  DT_ASSIGN_OR_RETURN(const bool packed, UsePanels(ks, m));
  bool wide = false;
  if (!packed && ks.dot_wide != nullptr) {
    DT_ASSIGN_OR_RETURN(const int width, tune::Pick(qgemm::DotWidthKnob()));
    wide = width == 1;
  }
  // x quantized (Note [Activation blocks]).
  std::optional<gemm::ScratchBuffer> qbuf;
  qgemm::QRows rows = QuantizeRows(ks, x, qbuf, wide);
  if (rows.t == nullptr) return absl::ResourceExhaustedError("Linear: out of memory");
  std::vector<std::vector<float>> bias32(ws.size());
  std::vector<Target> targets;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor& bias = biases[i];
    if (bias.defined()) {
      bias32[i].resize(static_cast<size_t>(ws[i].size(0)));
      LoadF32(bias.dtype(), bias.raw_data(), ws[i].size(0), 1, bias32[i].data());
    }
    targets.push_back({&ws[i], bias32[i].empty() ? nullptr : bias32[i].data(), &outs[i]});
  }
  if (packed) {
    for (Target& t : targets) t.panels = KeptPanels(ks, *t.w);
  }
  Prefetch pf;
  int chunks_per_thread = 0;
  int64_t panel_bytes = 0;
  if (packed) {
    DT_ASSIGN_OR_RETURN(const int i, tune::Pick(qgemm::PanelsPrefetchKnob()));
    pf.hint = PanelsPrefetch(i);
    DT_ASSIGN_OR_RETURN(const int c, tune::Pick(qgemm::PanelChunkKnob()));
    panel_bytes = PanelChunkBytes(c);
  } else {
    DT_ASSIGN_OR_RETURN(const int i, tune::Pick(qgemm::DotPrefetchKnob()));
    pf = DotPrefetches()[i];
    if (m == 1) {  // Note [Quantized dot pairs]
      DT_ASSIGN_OR_RETURN(const int pairs, tune::Pick(qgemm::DotPairsKnob()));
      rows.pair_bytes = qgemm::DotPairBytes(pairs);
    }
    int64_t bytes = 0;
    for (const Tensor& w : ws) bytes += w.nbytes();
    DT_ASSIGN_OR_RETURN(chunks_per_thread,
                        split::Decide(qgemm::DotSplitKnobs(), bytes, gemm::AvailableThreads()));
  }
  return Multiply(ks, packed, rows, targets, pf, chunks_per_thread, panel_bytes);
}

const tune::Knob& qgemm::IsaKnob() {
  static const tune::Knob* const knob =
      MakeIsaKnob("qgemm.isa", "the instruction set of the quantized kernels", "GB/s",
                  qgemm::IsaCandidates(), &qgemm::IsaName, &IsaTrial::Make);
  return *knob;
}

qgemm::Isa qgemm::TunedIsa() {
  static const std::vector<qgemm::Isa> candidates = qgemm::IsaCandidates();
  return PickedIsa(qgemm::IsaKnob(), candidates);
}

const tune::Knob& qgemm::DotPrefetchKnob() {
  static const tune::Knob knob{
      .name = "qgemm.dot_prefetch",
      .what = "the quantized decode dot's prefetch of weight rows: hint / distance ahead",
      .candidates = {"nta/2k", "t0/2k", "t1/2k", "nta/4k", "t0/4k", "t0/1k", "none"},
      .unit = "GB/s",
      .rounds = 7,
      .make_trial = &DotPrefetchTrial::Make,
  };
  return knob;
}

const tune::Knob& qgemm::DotWidthKnob() {
  static const tune::Knob knob{
      .name = "qgemm.dot_width",
      .what = "the quantized decode dot's vectors in bits",
      .candidates = {"256", "512"},
      .unit = "GB/s",
      .rounds = 7,
      .rule = []() -> std::optional<std::pair<int, std::string>> {
        if (qgemm::KernelsFor(qgemm::ActiveIsa()).dot_wide != nullptr) return std::nullopt;
        return std::make_pair(0, absl::StrCat("no 512-bit dot in the ",
                                              qgemm::IsaName(qgemm::ActiveIsa()), " kernels"));
      },
      .make_trial = &DotWidthTrial::Make,
  };
  return knob;
}

const tune::Knob& qgemm::DotPairsKnob() {
  static const tune::Knob knob{
      .name = "qgemm.dot_pairs",
      .what = "the quantized decode dot's weight rows read two at a time: up to these bytes",
      .candidates = {"off", "512", "1k", "2k"},
      .unit = "GB/s",
      .rounds = 7,
      .make_trial = &DotPairsTrial::Make,
  };
  return knob;
}

int64_t qgemm::DotPairBytes(int candidate) {
  static constexpr int64_t kBytes[] = {0, 512, 1024, 2048};
  return kBytes[candidate];
}

const tune::Knob& qgemm::PanelsPrefetchKnob() {
  static const tune::Knob knob{
      .name = "qgemm.panels_prefetch",
      .what = "the quantized panels' prefetch of the next register tile's panels: hint",
      .candidates = {"none", "t0", "nta", "t1"},
      .unit = "GB/s",
      .rounds = 7,
      .make_trial = &PanelsPrefetchTrial::Make,
  };
  return knob;
}

const tune::Knob& qgemm::PanelChunkKnob() {
  static const tune::Knob knob = [] {
    std::vector<std::string> candidates;
    for (const int64_t kib : kPanelChunkKiB) candidates.push_back(absl::StrCat(kib, "k"));
    return tune::Knob{
        .name = "qgemm.panel_chunk",
        .what = "the most bytes of quantized panels packed and multiplied as one chunk (in L2)",
        .candidates = std::move(candidates),
        .unit = "GFLOP/s",
        .rounds = 5,
        .make_trial = &PanelChunkTrial::Make,
    };
  }();
  return knob;
}

const tune::Knob& qgemm::DotMaxRowsKnob(bool kept_panels) {
  auto make = [](std::string name, std::string what, bool keep) {
    std::vector<std::string> candidates;
    for (const int64_t rows : kDotMaxRows) candidates.push_back(std::to_string(rows));
    return tune::Knob{
        .name = std::move(name),
        .what = std::move(what),
        .candidates = std::move(candidates),
        .unit = "GB/s",
        .rounds = 7,
        .make_trial = [keep] { return DotMaxRowsTrial::Make(keep); },
    };
  };
  static const tune::Knob per_call = make(
      "qgemm.dot_max_rows", "rows of x up to which the quantized GEMM runs the decode dot, not panels packed per call",
      false);
  static const tune::Knob kept = make(
      "qgemm.dot_max_rows_kept", "the same where the process keeps each weight's panels (a serving engine)", true);
  return kept_panels ? kept : per_call;
}

const std::vector<const tune::Knob*>& qgemm::DotSplitKnobs() {
  static const std::vector<const tune::Knob*>& knobs =
      split::MakeKnobs("qgemm.dot_split", "a quantized decode product", &DotSplitTrial::Make);
  return knobs;
}

void qgemm::SetPackedBudget(int64_t bytes) { kept::SetBudget(bytes); }

int64_t qgemm::PackedBytes() { return kept::Bytes(); }

absl::Status QuantizedLinear(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& out) {
  return QuantizedLinears(x, {w}, {bias}, {out});
}

}  // namespace dt::ops::cpu
