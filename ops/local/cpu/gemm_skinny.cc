// The skinny GEMM for M <= 8 rows: a decode step's projections (GEMV and its few-row cousins).
//
// Note [Skinny GEMM]
// With one to eight rows of activations, a product does 2M flops per weight element and reads
// every weight element once: it is bound by memory bandwidth, not by FMAs, so packing the weights
// (which reads and writes them once more) would only cost. The skinny kernels (Note [GEMM
// kernels]) read b where it lies, bf16/f16 widened in registers, and only the M rows of a (a few
// KiB) are converted to f32 up front. How the work is split over the oneTBB arena depends on which
// way b is contiguous, so that each thread streams long contiguous runs of memory:
//   dot   b [K, N] column-major, i.e. a Linear weight w [N, K] with contiguous rows: threads take
//         chunks of output columns (weight rows), each sized to read at least kMinChunkBytes.
//   axpy  b [K, N] row-major: threads take chunks of k (weight rows again) and sum M x N partial
//         outputs at the end (chunks x M x N adds, small next to the K x N weights).
// How many chunks per thread, or none (the calling thread alone, which beats waking a worker for
// a small product), is the tuner's per size class (Note [Decode split] in decode_split.cc: knobs
// gemm.skinny_split.*).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "absl/types/span.h"

#include "dtensor/core/status.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/cpu/decode_split.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/gemm_scratch.h"
#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu::gemm {

namespace {

constexpr int64_t kMinChunkBytes = int64_t{32} << 10;
constexpr int64_t kMinAxpyRows = 64;
// axpy's chunks per thread at most: each adds an M x N partial output.
constexpr int kMaxAxpyChunksPerThread = 2;

}  // namespace

absl::Status Skinny(const Problem& p, const Kernels& ks, bool parallel, const SkinnyPlan& plan) {
  const Prefetch pf = plan.pf;
  const int chunks_per_thread = plan.chunks_per_thread;
  const int m = static_cast<int>(p.m);
  const int64_t n = p.n, k = p.k;
  const int64_t size = DTypeSize(p.dtype);
  const Elem elem = ElemOf(p.dtype);

  const bool dot = p.b_rs == 1;
  // bf16 dot layout on AVX512_BF16: x stays bf16 (Note [bf16 dot products]).
  const bool bf16_pairs = dot && elem == Elem::kBF16 && ks.dot_bf16 != nullptr;

  // The rows of a in f32, each padded with zeros to a multiple of 16; or, for bf16_pairs, their
  // bf16 bits padded to a multiple of 32.
  const int64_t ldx = bf16_pairs ? (k + 31) / 32 * 32 : (k + 15) / 16 * 16;
  ScratchBuffer xbuf(ScratchSlot::kX, bf16_pairs ? m * ldx / 2 : m * ldx);
  if (xbuf.data() == nullptr) return absl::ResourceExhaustedError("Matmul: out of memory");
  float* x = xbuf.data();
  uint16_t* x16 = reinterpret_cast<uint16_t*>(xbuf.data());
  for (int i = 0; i < m; ++i) {
    const char* row = static_cast<const char*>(p.a) + i * p.a_rs * size;
    if (bf16_pairs) {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row);
      for (int64_t q = 0; q < k; ++q) x16[i * ldx + q] = src[q * p.a_cs];
      std::fill(x16 + i * ldx + k, x16 + (i + 1) * ldx, uint16_t{0});
    } else {
      LoadF32(p.dtype, row, k, p.a_cs, x + i * ldx);
      std::fill(x + i * ldx + k, x + (i + 1) * ldx, 0.0f);
    }
  }

  const int64_t ldw = dot ? p.b_cs : p.b_rs;
  const int64_t weight_bytes = n * k * size;
  const int threads = parallel ? AvailableThreads() : 1;
  std::atomic<bool> out_of_memory{false};
  auto parallel_chunks = [&](int64_t chunks, auto&& fn) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, chunks, 1),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t c = r.begin(); c != r.end(); ++c) fn(c);
                      },
                      tbb::simple_partitioner());
  };

  if (!dot) {
    // axpy: rows of w are contiguous, so threads split k (each streams its own rows) into
    // partial sums of the whole output, added up at the end.
    const int64_t most = int64_t{std::min(chunks_per_thread, kMaxAxpyChunksPerThread)} * threads;
    const int64_t chunks =
        threads > 1 && chunks_per_thread > 0 ? std::clamp<int64_t>(k / kMinAxpyRows, 1, most) : 1;
    const int64_t rows = (k + chunks - 1) / chunks;
    ScratchBuffer partial(ScratchSlot::kC, chunks * m * n);
    if (partial.data() == nullptr) return absl::ResourceExhaustedError("Matmul: out of memory");
    auto run = [&](int64_t ch) {
      const int64_t p0 = ch * rows, p1 = std::min(k, p0 + rows);
      ks.axpy(m, n, p1 - p0, x + p0, ldx, static_cast<const char*>(p.b) + p0 * ldw * size, ldw,
              elem, partial.data() + ch * m * n, n, pf);
    };
    if (chunks == 1) {
      run(0);
    } else {
      parallel_chunks(chunks, run);
      for (int64_t ch = 1; ch < chunks; ++ch) {
        const float* src = partial.data() + ch * m * n;
        float* dst = partial.data();
        for (int64_t i = 0; i < m * n; ++i) dst[i] += src[i];
      }
    }
    FinishRows(m, n, partial.data(), n, p.bias, p.dtype, p.out, p.ldo);
    return absl::OkStatus();
  }

  // dot: threads split the output columns (weight rows).
  const int64_t chunks =
      split::Chunks(weight_bytes, weight_bytes, chunks_per_thread, threads, kMinChunkBytes);
  const int64_t chunk = std::min(n, ((n + chunks - 1) / chunks + 15) / 16 * 16);
  auto run = [&](int64_t j0, int64_t j1) {
    const int64_t cols = j1 - j0;
    std::optional<ScratchBuffer> cbuf;
    float* c;
    int64_t ldc;
    if (p.dtype == DType::kF32) {
      c = static_cast<float*>(p.out) + j0;
      ldc = p.ldo;
    } else {
      cbuf.emplace(ScratchSlot::kC, m * cols);
      if (cbuf->data() == nullptr) {
        out_of_memory = true;
        return;
      }
      c = cbuf->data();
      ldc = cols;
    }
    const char* w = static_cast<const char*>(p.b) + j0 * p.b_cs * size;
    if (bf16_pairs) {
      ks.dot_bf16(m, cols, k, x16, ldx, reinterpret_cast<const uint16_t*>(w), ldw, c, ldc, pf,
                  plan.order);
    } else {
      ks.dot(m, cols, k, x, ldx, w, ldw, elem, c, ldc, pf, plan.order);
    }
    FinishRows(m, cols, c, ldc, p.bias != nullptr ? p.bias + j0 : nullptr, p.dtype,
               static_cast<char*>(p.out) + j0 * size, p.ldo);
  };
  if (chunk >= n) {
    run(0, n);
  } else {
    parallel_chunks((n + chunk - 1) / chunk, [&](int64_t c) { run(c * chunk, std::min(n, (c + 1) * chunk)); });
  }
  if (out_of_memory) return absl::ResourceExhaustedError("Matmul: out of memory");
  return absl::OkStatus();
}

namespace {

// The candidates of gemm.skinny_prefetch as the kernels take them (Note [Skinny prefetch]).
const std::vector<Prefetch>& SkinnyPrefetches() {
  static const std::vector<Prefetch> pfs = [] {
    std::vector<Prefetch> v;
    for (const std::string& name : SkinnyPrefetchKnob().candidates) v.push_back(PrefetchNamed(name));
    return v;
  }();
  return pfs;
}

// The candidates of gemm.skinny_rows as the kernels take them (Note [Skinny dot order]): "1",
// or rows side by side / from how many KiB a row, "8/4k".
const std::vector<DotOrder>& DotOrders() {
  static const std::vector<DotOrder> orders = [] {
    std::vector<DotOrder> v;
    for (const std::string& name : SkinnyRowsKnob().candidates) {
      const size_t slash = name.find('/');
      DotOrder o;
      o.rows = std::stoi(name.substr(0, slash));
      if (slash != std::string::npos) o.from_bytes = std::stoll(name.substr(slash + 1)) << 10;
      v.push_back(o);
    }
    return v;
  }();
  return orders;
}

// The tuner's picks as this process settled them, for trials (which never decide another knob).
SkinnyPlan SettledPlan(int64_t weight_bytes) {
  return {SkinnyPrefetches()[tune::Settled(SkinnyPrefetchKnob())],
          split::Settled(SkinnySplitKnobs(), weight_bytes, AvailableThreads()),
          DotOrders()[tune::Settled(SkinnyRowsKnob())]};
}

// Decode-shaped products for the skinny GEMM's knobs: rows of x against Linear weights [n, k] of
// a few shapes and float types, taken in turn until ColdBytes() of weights, so that every run
// reads them from memory as a decode step does; split over the arena's threads as decode is.
// `setting` changes the plan settled for a weight's bytes as a run's candidate says.
class SkinnyTrial : public tune::Trial {
 public:
  struct Shape {
    int64_t n, k;
    DType dtype;
  };
  using Setting = std::function<void(int candidate, SkinnyPlan& plan)>;

  // Every other weight of each shape meets one row of x, the rest eight where eight_rows_too.
  static absl::StatusOr<std::unique_ptr<tune::Trial>> Make(absl::Span<const Shape> shapes,
                                                           bool eight_rows_too, Setting setting) {
    auto t = std::unique_ptr<SkinnyTrial>(new SkinnyTrial);
    t->setting_ = std::move(setting);
    t->eight_rows_too_ = eight_rows_too;
    for (int64_t bytes = 0, i = 0; bytes < tune::ColdBytes(); ++i) {
      const Shape& s = shapes[static_cast<size_t>(i) % shapes.size()];
      DT_ASSIGN_OR_RETURN(Tensor w, Tensor::Full({s.n, s.k}, 0.01, s.dtype));
      bytes += w.nbytes();
      t->bytes_ += static_cast<double>(w.nbytes());
      t->weights_.push_back(std::move(w));
    }
    for (const Shape& s : shapes) {
      DT_ASSIGN_OR_RETURN(Tensor x, Tensor::Full({kSkinnyMaxRows, s.k}, 0.5, s.dtype));
      DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty({kSkinnyMaxRows, s.n}, s.dtype));
      t->x_.push_back(std::move(x));
      t->outs_.push_back(std::move(out));
    }
    return std::unique_ptr<tune::Trial>(std::move(t));
  }
  absl::Status Run(int candidate) override {
    for (size_t i = 0; i < weights_.size(); ++i) {
      const Tensor& w = weights_[i];
      const Tensor& x = x_[i % x_.size()];
      const Tensor& out = outs_[i % x_.size()];
      Problem p;
      const bool eight = eight_rows_too_ && i / x_.size() % 2 == 1;
      p.m = eight ? kSkinnyMaxRows : 1, p.n = w.size(0), p.k = w.size(1);
      p.dtype = w.dtype();
      p.a = x.raw_data(), p.a_rs = p.k, p.a_cs = 1;
      p.b = w.raw_data(), p.b_rs = 1, p.b_cs = p.k;
      p.out = out.raw_data(), p.ldo = p.n;
      SkinnyPlan plan = SettledPlan(w.nbytes());
      setting_(candidate, plan);
      DT_RETURN_IF_ERROR(Skinny(p, KernelsFor(ActiveIsa()), /*parallel=*/true, plan));
    }
    return absl::OkStatus();
  }
  double Work() const override { return bytes_; }
  int Threads() const override { return AvailableThreads(); }

 private:
  SkinnyTrial() = default;
  Setting setting_;
  bool eight_rows_too_ = false;
  std::vector<Tensor> weights_, x_, outs_;
  double bytes_ = 0;
};

}  // namespace

const tune::Knob& SkinnyPrefetchKnob() {
  static const tune::Knob knob{
      .name = "gemm.skinny_prefetch",
      .what = "the float decode GEMV's prefetch of weights: hint / distance ahead (dot layout)",
      .candidates = {"t1/12k", "t0/12k", "nta/12k", "t1/6k", "t1/24k", "none"},
      .unit = "GB/s",
      .rounds = 7,
      // One and eight rows of x against f32 [1536, 576] (3.5 MB) and bf16 [2048, 2048] (8 MB).
      .make_trial =
          [] {
            const SkinnyTrial::Shape shapes[2] = {{1536, 576, DType::kF32}, {2048, 2048, DType::kBF16}};
            return SkinnyTrial::Make(shapes, /*eight_rows_too=*/true,
                                     [](int candidate, SkinnyPlan& plan) {
                                       plan.pf = SkinnyPrefetches()[candidate];
                                     });
          },
  };
  return knob;
}

const tune::Knob& SkinnyRowsKnob() {
  static const tune::Knob knob{
      .name = "gemm.skinny_rows",
      .what = "the float decode GEMV's weight rows side by side / from which row length "
              "(dot layout)",
      .candidates = {"8/4k", "4/4k", "8/2k", "8/8k", "8/16k", "1"},
      .unit = "GB/s",
      .rounds = 7,
      // One row of x against weights whose rows hold 1.1 to 16 KiB (a small model's to an 8B
      // one's), 3.5 to 8 MB each: bf16 [3072, 576], f32 [1536, 576], bf16 [2048, 2048], f32
      // [1024, 2048], f32 [512, 4096].
      .make_trial =
          [] {
            const SkinnyTrial::Shape shapes[5] = {{3072, 576, DType::kBF16},
                                                  {1536, 576, DType::kF32},
                                                  {2048, 2048, DType::kBF16},
                                                  {1024, 2048, DType::kF32},
                                                  {512, 4096, DType::kF32}};
            return SkinnyTrial::Make(shapes, /*eight_rows_too=*/false,
                                     [](int candidate, SkinnyPlan& plan) {
                                       plan.order = DotOrders()[candidate];
                                     });
          },
  };
  return knob;
}

const std::vector<const tune::Knob*>& SkinnySplitKnobs() {
  // One row of x against weights of two shapes and both float types per class: small bf16
  // [64, 576] (74 KB) and f32 [32, 768] (98 KB); medium bf16 [192, 576] (221 KB) and f32
  // [192, 576] (442 KB); large f32 [1536, 576] (3.5 MB) and bf16 [2048, 2048] (8 MB).
  static const std::vector<const tune::Knob*>& knobs = split::MakeKnobs(
      "gemm.skinny_split", "a float decode product (the skinny GEMM)", [](int size_class) {
        static constexpr SkinnyTrial::Shape kShapes[split::kClasses][2] = {
            {{64, 576, DType::kBF16}, {32, 768, DType::kF32}},
            {{192, 576, DType::kBF16}, {192, 576, DType::kF32}},
            {{1536, 576, DType::kF32}, {2048, 2048, DType::kBF16}}};
        return SkinnyTrial::Make(kShapes[size_class], /*eight_rows_too=*/false,
                                 [](int candidate, SkinnyPlan& plan) {
                                   plan.chunks_per_thread = split::ChunksPerThread(candidate);
                                 });
      });
  return knobs;
}

absl::StatusOr<Prefetch> PickSkinnyPrefetch() {
  DT_ASSIGN_OR_RETURN(const int i, tune::Pick(SkinnyPrefetchKnob()));
  return SkinnyPrefetches()[i];
}

absl::StatusOr<DotOrder> PickDotOrder() {
  DT_ASSIGN_OR_RETURN(const int i, tune::Pick(SkinnyRowsKnob()));
  return DotOrders()[i];
}

absl::Status Skinny(const Problem& p, const Kernels& ks, bool parallel) {
  SkinnyPlan plan;
  DT_ASSIGN_OR_RETURN(plan.pf, PickSkinnyPrefetch());
  const int64_t weight_bytes = p.n * p.k * DTypeSize(p.dtype);
  DT_ASSIGN_OR_RETURN(plan.chunks_per_thread,
                      split::Decide(SkinnySplitKnobs(), weight_bytes, parallel ? AvailableThreads() : 1));
  if (p.m == 1 && p.b_rs == 1) {  // the one row order the knob steers
    DT_ASSIGN_OR_RETURN(plan.order, PickDotOrder());
  }
  return Skinny(p, ks, parallel, plan);
}

}  // namespace dt::ops::cpu::gemm
