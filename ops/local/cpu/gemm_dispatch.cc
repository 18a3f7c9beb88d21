// The GEMM dispatcher: per dtype and shape class, own kernels, oneDNN or OpenBLAS.
//
// Note [GEMM dispatch]
// No one GEMM is fastest on every x86 server CPU: on a 2-vCPU Intel Xeon with AMX, oneDNN's AMX
// kernels ran bf16 products 7x faster than our AVX512_BF16 ones and OpenBLAS's SkylakeX kernels
// f32 ones 1.2x faster than ours (issue 30), while on AMD Zen 4/5 our AVX-512 kernels beat
// OpenBLAS 0.3.21, which does not know Zen 5 and runs its Haswell kernels there. So Matmul picks,
// per dtype (f32, bf16) and shape class (skinny M <= 8, small under kLargeFlops, large):
//   1. a test's override, then DT_GEMM=own|dnnl|openblas (anything else is an error naming the
//      variable); a forced backend that cannot run the dtype (OpenBLAS and bf16, anything but own
//      and f16) leaves it to own;
//   2. rules where what the CPU is settles it:
//        f16: own (no library here has an f16 GEMM for these CPUs);
//        skinny: own. A decode product reads each weight once and does 2M flops per element: it
//          is bound by memory, and our skinny kernels read the weights where they lie, bf16
//          widened in registers (Note [Skinny GEMM]); bench_gemm's decode rows measure the
//          libraries beside them;
//        bf16 where oneDNN runs AMX (the CPU has AMX-BF16 and the OS granted the tile state:
//          Note [AMX permission] in cpu_info.cc): oneDNN (on the 2-vCPU Xeon of issue 30,
//          PyTorch's oneDNN ran bf16 on AMX at 1369 GFLOP/s against our AVX-512 kernels' 192);
//          we have no AMX kernels of our own;
//   3. otherwise the tuner's knob of the dtype and class (gemm.f32.small, gemm.bf16.large, ...;
//      Note [Tuner] in tuner.cc): each backend that runs the dtype times a representative product
//      of the class (a Linear's layout) on one thread, interleaved, and the fastest best run wins
//      (own on ties within 3 %: one less library in the way), cached per machine with the other
//      knobs. One thread, because every backend spreads its work over the same oneTBB arena the
//      same way (Note [Library threads] in gemm_split.cc), so the per-core speed decides, and
//      because one thread is what a core shared with other processes still measures fairly. The
//      bf16-on-AMX rule of 2. is that knob's rule.
// The decisions are made once per process, on the first product that needs one.

#include "dtensor/ops/local/cpu/gemm_dispatch.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/isa_choice.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu::gemm {

namespace {

constexpr DType kDecidedTypes[] = {DType::kF32, DType::kBF16};
constexpr ShapeClass kDecidedClasses[] = {ShapeClass::kSmall, ShapeClass::kLarge};

std::atomic<int> forced_backend{-1};

struct EnvState {
  std::once_flag once;
  absl::StatusOr<std::optional<Backend>> env = std::optional<Backend>();
};

EnvState& GetEnv() {
  static EnvState* state = new EnvState;  // reachable until exit; never torn down under a caller
  return *state;
}

std::string TypeName(DType t) { return std::string(DTypeName(t)); }

// A product of one calibrated class, in a Linear's layout (w [N, K] read as the column-major
// [K, N] operand), which is what models run.
class ClassProduct {
 public:
  ClassProduct(DType t, ShapeClass c) {
    const bool small = c == ShapeClass::kSmall;
    const int64_t m = small ? 64 : 256, n = small ? 256 : 1024, k = small ? 256 : 1024;
    const int64_t size = DTypeSize(t);
    a_.resize(static_cast<size_t>(m * k * size));
    w_.resize(static_cast<size_t>(n * k * size));
    out_.resize(static_cast<size_t>(m * n * size));
    // Small values of either type: f32 (i % 7) / 8, or the bf16 of it (exact).
    for (std::vector<char>* v : {&a_, &w_}) {
      for (size_t i = 0; i < v->size() / size; ++i) {
        const float x = static_cast<float>(i % 7) / 8.0f;
        if (t == DType::kF32) {
          reinterpret_cast<float*>(v->data())[i] = x;
        } else {
          reinterpret_cast<uint16_t*>(v->data())[i] = static_cast<uint16_t>(FloatBits(x) >> 16);
        }
      }
    }
    p_.m = m, p_.n = n, p_.k = k, p_.dtype = t;
    p_.a = a_.data(), p_.a_rs = k, p_.a_cs = 1;
    p_.b = w_.data(), p_.b_rs = 1, p_.b_cs = k;
    p_.out = out_.data(), p_.ldo = n;
  }
  const Problem& problem() const { return p_; }
  double Flops() const { return 2.0 * p_.m * p_.n * p_.k; }

 private:
  std::vector<char> a_, w_, out_;
  Problem p_;
};

// A product of one calibrated class on each backend that runs the dtype, on one thread.
class BackendTrial : public tune::Trial {
 public:
  BackendTrial(DType t, ShapeClass c, std::vector<Backend> backends)
      : product_(t, c), backends_(std::move(backends)) {}
  absl::Status Run(int candidate) override {
    const Problem& p = product_.problem();
    switch (backends_[candidate]) {
      case Backend::kOwn: return Packed(p, KernelsFor(ActiveIsa()), false);
      case Backend::kDnnl: return RunDnnl(p, false);
      case Backend::kOpenBlas: return RunOpenBlas(p, false);
    }
    return absl::OkStatus();
  }
  double Work() const override { return product_.Flops(); }
  int Threads() const override { return 1; }

 private:
  ClassProduct product_;
  std::vector<Backend> backends_;
};

// gemm.isa's trial (Note [Tuned instruction set] in isa_choice.h): the f32 and the bf16 product
// of the large class on each candidate set's kernels, on one thread (the width changes what one
// core computes).
class IsaTrial : public tune::Trial {
 public:
  absl::Status Run(int candidate) override {
    const Kernels& ks = KernelsFor(candidates_[static_cast<size_t>(candidate)]);
    DT_RETURN_IF_ERROR(Packed(f32_.problem(), ks, false));
    return Packed(bf16_.problem(), ks, false);
  }
  double Work() const override { return f32_.Flops() + bf16_.Flops(); }
  int Threads() const override { return 1; }

 private:
  ClassProduct f32_{DType::kF32, ShapeClass::kLarge}, bf16_{DType::kBF16, ShapeClass::kLarge};
  const std::vector<Isa> candidates_ = IsaCandidates();
};

// The backends a knob of `t` chooses among, own first.
std::vector<Backend> Runs(DType t) {
  std::vector<Backend> runs;
  for (const Backend b : kAllBackends) {
    if (BackendRuns(b, t)) runs.push_back(b);
  }
  return runs;
}

}  // namespace

const char* ShapeClassName(ShapeClass c) {
  switch (c) {
    case ShapeClass::kSkinny: return "skinny";
    case ShapeClass::kSmall: return "small";
    case ShapeClass::kLarge: return "large";
  }
  return "?";
}

ShapeClass ClassOf(int64_t m, int64_t n, int64_t k) {
  if (m <= kSkinnyMaxRows) return ShapeClass::kSkinny;
  return 2.0 * static_cast<double>(m) * n * k < kLargeFlops ? ShapeClass::kSmall : ShapeClass::kLarge;
}

absl::StatusOr<std::optional<Backend>> ParseGemmEnv(const char* value) {
  if (value == nullptr || *value == '\0') return std::optional<Backend>();
  for (const Backend b : kAllBackends) {
    if (std::string(value) == BackendName(b)) return std::optional<Backend>(b);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("DT_GEMM='", value, "': expected one of own, dnnl, openblas (or unset: the fastest per CPU)"));
}

const tune::Knob& BackendKnob(DType t, ShapeClass c) {
  DT_CHECK((t == DType::kF32 || t == DType::kBF16) && c != ShapeClass::kSkinny);
  auto make = [](DType t, ShapeClass c) {
    auto* knob = new tune::Knob{
        .name = absl::StrCat("gemm.", TypeName(t), ".", ShapeClassName(c)),
        .what = absl::StrCat("the backend of ", TypeName(t), " products of the ", ShapeClassName(c),
                             " class (Note [GEMM dispatch])"),
        .unit = "GFLOP/s",
        .rounds = c == ShapeClass::kSmall ? 21 : 5,
        .keep_first = 1.0 / 0.97,
    };
    for (const Backend b : Runs(t)) knob->candidates.push_back(BackendName(b));
    if (t == DType::kBF16) {
      const int dnnl = static_cast<int>(std::find(knob->candidates.begin(), knob->candidates.end(),
                                                  std::string(BackendName(Backend::kDnnl))) -
                                        knob->candidates.begin());
      knob->rule = [dnnl]() -> std::optional<std::pair<int, std::string>> {
        if (!DnnlUsesAmx()) return std::nullopt;
        return std::make_pair(dnnl, std::string("bf16 on AMX tiles through oneDNN"));
      };
    }
    knob->make_trial = [t, c]() -> absl::StatusOr<std::unique_ptr<tune::Trial>> {
      return std::make_unique<BackendTrial>(t, c, Runs(t));
    };
    return knob;
  };
  // Reachable until exit, like every knob.
  static const tune::Knob* const knobs[2][2] = {
      {make(DType::kF32, ShapeClass::kSmall), make(DType::kF32, ShapeClass::kLarge)},
      {make(DType::kBF16, ShapeClass::kSmall), make(DType::kBF16, ShapeClass::kLarge)}};
  return *knobs[t == DType::kBF16 ? 1 : 0][c == ShapeClass::kLarge ? 1 : 0];
}

const tune::Knob& IsaKnob() {
  static const tune::Knob* const knob = MakeIsaKnob(
      "gemm.isa", "the instruction set of our float kernels (GEMM, decode, attention)", "GFLOP/s",
      IsaCandidates(), &IsaName, []() -> absl::StatusOr<std::unique_ptr<tune::Trial>> {
        return std::make_unique<IsaTrial>();
      });
  return *knob;
}

Isa TunedIsa() {
  static const std::vector<Isa> candidates = IsaCandidates();
  return PickedIsa(IsaKnob(), candidates);
}

std::vector<const tune::Knob*> BackendKnobs() {
  std::vector<const tune::Knob*> knobs;
  for (const DType t : kDecidedTypes) {
    for (const ShapeClass c : kDecidedClasses) knobs.push_back(&BackendKnob(t, c));
  }
  return knobs;
}

namespace {

// The decision without its text when `explain` is false (the hot path: no allocation).
absl::StatusOr<Decision> DecideImpl(DType dtype, ShapeClass c, bool explain) {
  auto made = [&](Backend b, auto&&... why) {
    Decision d{b, {}};
    if (explain) d.why = absl::StrCat(why...);
    return d;
  };
  if (const int f = forced_backend.load(std::memory_order_relaxed); f >= 0) {
    const Backend b = static_cast<Backend>(f);
    if (BackendRuns(b, dtype)) return made(b, "forced by a test");
    return made(Backend::kOwn, "forced ", BackendName(b), ", which does not run ", TypeName(dtype));
  }
  EnvState& st = GetEnv();
  std::call_once(st.once, [&] { st.env = ParseGemmEnv(std::getenv("DT_GEMM")); });
  DT_RETURN_IF_ERROR(st.env.status());
  if (const std::optional<Backend> env = *st.env) {
    if (BackendRuns(*env, dtype)) return made(*env, "DT_GEMM=", BackendName(*env));
    return made(Backend::kOwn, "DT_GEMM=", BackendName(*env), " does not run ", TypeName(dtype));
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return made(Backend::kOwn, "rule: only own kernels run ", TypeName(dtype));
  }
  if (c == ShapeClass::kSkinny) {
    return made(Backend::kOwn, "rule: skinny products stream the weights in place (own)");
  }
  const tune::Knob& knob = BackendKnob(dtype, c);
  if (!explain) {
    DT_ASSIGN_OR_RETURN(const int i, tune::Pick(knob));
    return Decision{Runs(dtype)[i], {}};
  }
  DT_ASSIGN_OR_RETURN(const tune::Choice choice, tune::Explain(knob));
  return Decision{Runs(dtype)[choice.index], choice.why};
}

}  // namespace

absl::StatusOr<Decision> Decide(DType dtype, ShapeClass c) { return DecideImpl(dtype, c, true); }

absl::StatusOr<Backend> Choose(DType dtype, int64_t m, int64_t n, int64_t k) {
  DT_ASSIGN_OR_RETURN(const Decision d, DecideImpl(dtype, ClassOf(m, n, k), false));
  return d.backend;
}

void SetBackendForTesting(std::optional<Backend> b) {
  forced_backend.store(b.has_value() ? static_cast<int>(*b) : -1, std::memory_order_relaxed);
}

void ResetDispatchForTesting() {
  EnvState& st = GetEnv();
  // once_flag cannot be re-armed: read DT_GEMM again by hand.
  std::call_once(st.once, [] {});
  st.env = ParseGemmEnv(std::getenv("DT_GEMM"));
  tune::ResetForTesting();
}

}  // namespace dt::ops::cpu::gemm
