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
//   3. otherwise a calibration: each backend that runs the dtype times a representative product
//      of the class (kCalibration) on one thread, interleaved, and the fastest best run wins (own on
//      ties within kOwnMargin: one less library in the way). One thread, because every backend
//      spreads its work over the same oneTBB arena the same way (Note [Library threads] in
//      gemm_split.cc), so the per-core speed decides, and because one thread is what a core
//      shared with other processes still measures fairly. It costs about 0.2 s once per machine:
//      the figures are written to CalibrationCachePath(), keyed by the CPU (vendor, family, model,
//      stepping, brand, features), the libraries' versions and what they run on (oneDNN's ISA,
//      OpenBLAS's core) and our kernels' ISA; a file with another key, or one that does not parse,
//      is measured again and replaced (written to a temporary file and renamed: concurrent
//      processes each write a whole file). Deleting the file measures again.
// The decisions are made once per process, on the first product that needs one.

#include "dtensor/ops/local/cpu/gemm_dispatch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"

namespace dt::ops::cpu::gemm {

namespace {

constexpr DType kDecidedTypes[] = {DType::kF32, DType::kBF16};
constexpr int kTypes = 2, kClasses = 3;
constexpr double kOwnMargin = 0.97;
constexpr const char* kCacheHeader =
    "# dtensor GEMM calibration: GFLOP/s per backend on one thread (Note [GEMM dispatch], "
    "ops/local/cpu/gemm_dispatch.cc). Delete this file to measure again.";

// The representative product of each calibrated class: a Linear's layout (w [N, K] read as the
// column-major [K, N] operand), which is what models run; and how many timed runs per backend.
struct Calibration {
  ShapeClass cls;
  int64_t m, n, k;
  int reps;
};
constexpr Calibration kCalibration[] = {{ShapeClass::kSmall, 64, 256, 256, 21},
                                        {ShapeClass::kLarge, 256, 1024, 1024, 5}};

int TypeIndex(DType t) { return t == DType::kBF16 ? 1 : 0; }

struct Measured {
  bool have = false;
  double gflops[3] = {0, 0, 0};  // per Backend; 0: does not run the dtype
};

struct State {
  std::once_flag env_once;
  absl::StatusOr<std::optional<Backend>> env = std::optional<Backend>();
  std::mutex mu;  // guards the rest
  bool built = false;
  std::array<std::array<Decision, kClasses>, kTypes> table;
  std::atomic<bool> ready{false};
};

State& GetState() {
  static State* state = new State;  // reachable until exit; never torn down under a caller
  return *state;
}

std::atomic<int> forced_backend{-1};

std::string TypeName(DType t) { return std::string(DTypeName(t)); }

// Chooses from measured GFLOP/s: the fastest, own on ties within kOwnMargin.
Decision FromMeasured(const Measured& m) {
  int best = 0;
  for (int b = 1; b < 3; ++b) {
    if (m.gflops[b] > m.gflops[best]) best = b;
  }
  if (best != 0 && m.gflops[0] >= kOwnMargin * m.gflops[best]) best = 0;
  std::string why = "calibrated (GFLOP/s, 1 thread):";
  for (const Backend b : kAllBackends) {
    const double g = m.gflops[static_cast<int>(b)];
    if (g > 0) absl::StrAppend(&why, " ", BackendName(b), " ", absl::StrFormat("%.1f", g));
  }
  return {static_cast<Backend>(best), why};
}

// The rule for this CPU, if one settles it (Note [GEMM dispatch], 2.).
std::optional<Decision> Rule(DType t, ShapeClass c) {
  if (c == ShapeClass::kSkinny) {
    return Decision{Backend::kOwn, "rule: skinny products stream the weights in place (own)"};
  }
  if (t == DType::kBF16 && DnnlUsesAmx()) {
    return Decision{Backend::kDnnl, "rule: bf16 on AMX tiles through oneDNN"};
  }
  return std::nullopt;
}

// GFLOP/s of each runnable backend on `cal` (its fastest run), the backends interleaved.
Measured Measure(DType t, const Calibration& cal) {
  const int64_t m = cal.m, n = cal.n, k = cal.k;
  const int64_t size = DTypeSize(t);
  std::vector<char> a(static_cast<size_t>(m * k * size)), w(static_cast<size_t>(n * k * size));
  std::vector<char> out(static_cast<size_t>(m * n * size));
  // Small values of either type: f32 (i % 7) / 8, or the bf16 of it (exact).
  auto fill = [&](std::vector<char>& v) {
    for (size_t i = 0; i < v.size() / size; ++i) {
      const float x = static_cast<float>(i % 7) / 8.0f;
      if (t == DType::kF32) {
        reinterpret_cast<float*>(v.data())[i] = x;
      } else {
        reinterpret_cast<uint16_t*>(v.data())[i] = static_cast<uint16_t>(FloatBits(x) >> 16);
      }
    }
  };
  fill(a);
  fill(w);
  Problem p;
  p.m = m, p.n = n, p.k = k, p.dtype = t;
  p.a = a.data(), p.a_rs = k, p.a_cs = 1;
  p.b = w.data(), p.b_rs = 1, p.b_cs = k;
  p.out = out.data(), p.ldo = n;
  const Kernels& kernels = KernelsFor(ActiveIsa());
  std::vector<Backend> runs;
  for (const Backend b : kAllBackends) {
    if (BackendRuns(b, t)) runs.push_back(b);
  }
  auto run = [&](Backend b) {
    switch (b) {
      case Backend::kOwn: return Packed(p, kernels, false);
      case Backend::kDnnl: return RunDnnl(p, false);
      case Backend::kOpenBlas: return RunOpenBlas(p, false);
    }
    return absl::OkStatus();
  };
  Measured out_m;
  std::vector<std::vector<double>> secs(runs.size());
  for (const Backend b : runs) {
    if (!run(b).ok()) return out_m;  // warm-up (oneDNN makes its primitive)
  }
  for (int r = 0; r < cal.reps; ++r) {
    for (size_t i = 0; i < runs.size(); ++i) {
      const size_t j = r % 2 == 0 ? i : runs.size() - 1 - i;
      const auto start = std::chrono::steady_clock::now();
      if (!run(runs[j]).ok()) return out_m;
      secs[j].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    // The fastest run: other processes on the machine only ever slow a run down, so the minimum
    // is the least disturbed estimate of what the backend can do.
    const double best = *std::min_element(secs[i].begin(), secs[i].end());
    out_m.gflops[static_cast<int>(runs[i])] = 2.0 * m * n * k / best / 1e9;
  }
  out_m.have = true;
  return out_m;
}

using Table = std::array<std::array<Measured, kClasses>, kTypes>;

// Reads the cache file; false when it is missing, has another key or does not parse.
bool ReadCache(const std::string& path, Table& table) {
  if (path.empty()) return false;
  std::ifstream in(path);
  std::string header, key;
  if (!std::getline(in, header) || !std::getline(in, key) || key != "key " + CalibrationKey()) {
    return false;
  }
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 2 || f.size() % 2 != 0) return false;
    int ti = -1, ci = -1;
    for (const DType t : kDecidedTypes) {
      if (f[0] == TypeName(t)) ti = TypeIndex(t);
    }
    for (const ShapeClass c : kAllShapeClasses) {
      if (f[1] == ShapeClassName(c)) ci = static_cast<int>(c);
    }
    if (ti < 0 || ci < 0) return false;
    Measured& m = table[ti][ci];
    for (size_t i = 2; i < f.size(); i += 2) {
      int bi = -1;
      for (const Backend b : kAllBackends) {
        if (f[i] == BackendName(b)) bi = static_cast<int>(b);
      }
      double g = 0;
      if (bi < 0 || !absl::SimpleAtod(f[i + 1], &g) || !(g > 0)) return false;
      m.gflops[bi] = g;
    }
    m.have = true;
  }
  return true;
}

void WriteCache(const std::string& path, const Table& table) {
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  // mkdir -p of the cache directory (its parent, $HOME/.cache, may not exist either).
  for (size_t at = 1; at != std::string::npos;) {
    at = dir.find('/', at + 1);
    ::mkdir(dir.substr(0, at).c_str(), 0755);
  }
  const std::string tmp = absl::StrCat(path, ".", ::getpid(), ".tmp");
  {
    std::ofstream out(tmp);
    out << kCacheHeader << "\nkey " << CalibrationKey() << "\n";
    for (const DType t : kDecidedTypes) {
      for (const ShapeClass c : kAllShapeClasses) {
        const Measured& m = table[TypeIndex(t)][static_cast<int>(c)];
        if (!m.have) continue;
        out << TypeName(t) << " " << ShapeClassName(c);
        for (const Backend b : kAllBackends) {
          const double g = m.gflops[static_cast<int>(b)];
          if (g > 0) out << " " << BackendName(b) << " " << absl::StrFormat("%.2f", g);
        }
        out << "\n";
      }
    }
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

// Fills st.table: rules first, then the cache file or a calibration for the classes left.
void Build(State& st) {
  Table measured;
  bool need = false;
  for (const DType t : kDecidedTypes) {
    for (const Calibration& cal : kCalibration) need |= !Rule(t, cal.cls).has_value();
  }
  const std::string path = CalibrationCachePath();
  bool complete = need && ReadCache(path, measured);
  for (const DType t : kDecidedTypes) {
    for (const Calibration& cal : kCalibration) {
      if (!Rule(t, cal.cls).has_value()) complete &= measured[TypeIndex(t)][static_cast<int>(cal.cls)].have;
    }
  }
  if (need && !complete) {
    measured = Table();
    for (const DType t : kDecidedTypes) {
      for (const Calibration& cal : kCalibration) {
        if (!Rule(t, cal.cls).has_value()) measured[TypeIndex(t)][static_cast<int>(cal.cls)] = Measure(t, cal);
      }
    }
    WriteCache(path, measured);
  }
  for (const DType t : kDecidedTypes) {
    for (const ShapeClass c : kAllShapeClasses) {
      Decision& d = st.table[TypeIndex(t)][static_cast<int>(c)];
      const Measured& m = measured[TypeIndex(t)][static_cast<int>(c)];
      if (std::optional<Decision> rule = Rule(t, c)) {
        d = *rule;
      } else if (m.have) {
        d = FromMeasured(m);
      } else {
        d = {Backend::kOwn, "calibration failed: own"};
      }
    }
  }
  st.built = true;
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

std::string CalibrationKey() {
  return absl::StrCat("v1 | ", ThisCpu().Describe(), " | ", DnnlDescription(), " | ",
                      OpenBlasDescription(), " | own ", IsaName(ActiveIsa()));
}

std::string CalibrationCachePath() {
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') {
    dir = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') {
    dir = absl::StrCat(h, "/.cache");
  } else {
    return "";
  }
  // FNV-1a of the key: one file per machine and library versions.
  uint64_t hash = 1469598103934665603ull;
  for (const char c : CalibrationKey()) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return absl::StrFormat("%s/dtensor/gemm-calibration-%016x.txt", dir, hash);
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
  State& st = GetState();
  std::call_once(st.env_once, [&] { st.env = ParseGemmEnv(std::getenv("DT_GEMM")); });
  DT_RETURN_IF_ERROR(st.env.status());
  if (const std::optional<Backend> env = *st.env) {
    if (BackendRuns(*env, dtype)) return made(*env, "DT_GEMM=", BackendName(*env));
    return made(Backend::kOwn, "DT_GEMM=", BackendName(*env), " does not run ", TypeName(dtype));
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return made(Backend::kOwn, "rule: only own kernels run ", TypeName(dtype));
  }
  if (!st.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.built) Build(st);
    st.ready.store(true, std::memory_order_release);
  }
  const Decision& d = st.table[TypeIndex(dtype)][static_cast<int>(c)];
  return explain ? d : Decision{d.backend, {}};
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
  State& st = GetState();
  std::lock_guard<std::mutex> lock(st.mu);
  st.ready.store(false, std::memory_order_release);
  st.built = false;
  // once_flag cannot be re-armed: read DT_GEMM again by hand.
  std::call_once(st.env_once, [] {});
  st.env = ParseGemmEnv(std::getenv("DT_GEMM"));
}

}  // namespace dt::ops::cpu::gemm
