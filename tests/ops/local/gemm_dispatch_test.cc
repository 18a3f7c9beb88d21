// The GEMM dispatcher (Note [GEMM dispatch]): DT_GEMM, the rules, and the backend knobs' lines of
// the tuner's cache file (Note [Tuner]).
// Every test here sets XDG_CACHE_HOME to a fresh directory and resets the dispatcher, so that
// nothing reads or writes the user's cache.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

namespace gemm = cpu::gemm;
using gemm::Backend;
using gemm::ShapeClass;

// A scratch cache directory and DT_GEMM for one test; the dispatcher reads DT_GEMM again after.
class DispatchEnv : public testing::ScopedCache {
 public:
  explicit DispatchEnv(const char* dt_gemm)
      : ScopedCache("DT_GEMM", dt_gemm, gemm::ResetDispatchForTesting, gemm::ResetDispatchForTesting) {}
};

TEST(GemmDispatch, DtGemmAcceptsTheThreeNamesAndNothingElse) {
  EXPECT_EQ(*gemm::ParseGemmEnv(nullptr), std::nullopt);
  EXPECT_EQ(*gemm::ParseGemmEnv(""), std::nullopt);
  EXPECT_EQ(*gemm::ParseGemmEnv("own"), Backend::kOwn);
  EXPECT_EQ(*gemm::ParseGemmEnv("dnnl"), Backend::kDnnl);
  EXPECT_EQ(*gemm::ParseGemmEnv("openblas"), Backend::kOpenBlas);
  for (const char* bad : {"mkl", "OWN", " own", "onednn", "1"}) {
    const absl::StatusOr<std::optional<Backend>> r = gemm::ParseGemmEnv(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find(std::string("DT_GEMM='") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("own, dnnl, openblas"), std::string::npos) << msg;
  }
}

TEST(GemmDispatch, BadDtGemmIsAnErrorOfEveryProduct) {
  DispatchEnv env("blas");
  const Tensor a = Tensor::Ones({16, 16}).value();
  const absl::StatusOr<Tensor> y = Matmul(a, a);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(y.status().message().find("DT_GEMM='blas'"), absl::string_view::npos) << y.status();
}

TEST(GemmDispatch, DtGemmForcesEveryClassItRuns) {
  for (const Backend b : gemm::kAllBackends) {
    DispatchEnv env(gemm::BackendName(b));
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const ShapeClass c : gemm::kAllShapeClasses) {
        const gemm::Decision d = gemm::Decide(dtype, c).value();
        // A backend that cannot run the dtype leaves it to own, saying so.
        EXPECT_EQ(d.backend, gemm::BackendRuns(b, dtype) ? b : Backend::kOwn)
            << gemm::BackendName(b) << " " << DTypeName(dtype) << " " << gemm::ShapeClassName(c);
        EXPECT_NE(d.why.find(std::string("DT_GEMM=") + gemm::BackendName(b)), std::string::npos) << d.why;
      }
    }
    // Nothing is measured when DT_GEMM decides.
    EXPECT_FALSE(std::filesystem::exists(cpu::tune::CachePath()));
  }
}

TEST(GemmDispatch, RulesAndCalibrationWrittenOnceAndRead) {
  DispatchEnv env(nullptr);
  const std::string path = cpu::tune::CachePath();
  ASSERT_EQ(path.rfind(env.dir().string() + "/dtensor/tuning-", 0), 0u) << path;
  // Skinny products are own's by rule; f16 has no other backend.
  EXPECT_EQ(gemm::Decide(DType::kF32, ShapeClass::kSkinny)->backend, Backend::kOwn);
  EXPECT_EQ(gemm::Decide(DType::kF16, ShapeClass::kLarge)->backend, Backend::kOwn);
  const gemm::Decision large = gemm::Decide(DType::kF32, ShapeClass::kLarge).value();
  ASSERT_TRUE(std::filesystem::exists(path));
  const std::string text = testing::ReadFileBytes(path);
  EXPECT_NE(text.find("key " + cpu::tune::CacheKey() + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ngemm.f32.large GFLOP/s threads 1 "), std::string::npos) << text;
  EXPECT_TRUE(large.why.starts_with("measured")) << large.why;
  EXPECT_NE(large.why.find("(GFLOP/s, 1 thread): own "), std::string::npos) << large.why;
  // bf16 on AMX is oneDNN's by rule, else measured.
  const gemm::Decision bf16 = gemm::Decide(DType::kBF16, ShapeClass::kLarge).value();
  if (gemm::DnnlUsesAmx()) {
    EXPECT_EQ(bf16.backend, Backend::kDnnl);
  } else {
    EXPECT_NE(testing::ReadFileBytes(path).find("\ngemm.bf16.large GFLOP/s threads 1 "), std::string::npos) << text;
  }
}

// Figures written by hand decide: the fastest wins, own on near-ties (within 3%).
TEST(GemmDispatch, CachedFiguresDecide) {
  DispatchEnv env(nullptr);
  const std::string path = cpu::tune::CachePath();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  {
    std::ofstream out(path);
    out << "# test\nkey " << cpu::tune::CacheKey() << "\n"
        << "gemm.f32.small GFLOP/s threads 1 quiet own 100 dnnl 102 openblas 50\n"
        << "gemm.f32.large GFLOP/s threads 1 quiet own 100 dnnl 90 openblas 120\n"
        << "gemm.bf16.small GFLOP/s threads 1 quiet own 100 dnnl 300\n"
        << "gemm.bf16.large GFLOP/s threads 1 quiet own 100 dnnl 80\n";
  }
  gemm::ResetDispatchForTesting();
  EXPECT_EQ(gemm::Decide(DType::kF32, ShapeClass::kSmall)->backend, Backend::kOwn);
  EXPECT_EQ(gemm::Decide(DType::kF32, ShapeClass::kLarge)->backend, Backend::kOpenBlas);
  EXPECT_EQ(gemm::Choose(DType::kF32, 512, 512, 512).value(), Backend::kOpenBlas);
  EXPECT_EQ(gemm::Choose(DType::kF32, 64, 64, 64).value(), Backend::kOwn);
  EXPECT_EQ(gemm::Choose(DType::kF32, 1, 4096, 4096).value(), Backend::kOwn);
  if (!gemm::DnnlUsesAmx()) {
    EXPECT_EQ(gemm::Decide(DType::kBF16, ShapeClass::kSmall)->backend, Backend::kDnnl);
    EXPECT_EQ(gemm::Decide(DType::kBF16, ShapeClass::kLarge)->backend, Backend::kOwn);
  }
  EXPECT_EQ(gemm::Decide(DType::kF32, ShapeClass::kLarge)->why,
            "cached (GFLOP/s, 1 thread): own 100.0 dnnl 90.0 openblas 120.0");
  // The products run on what was decided and are right.
  const Tensor a = Tensor::Randn({300, 200}, 1).value(), b = Tensor::Randn({200, 500}, 2).value();
  const Tensor want = [&] {
    gemm::SetBackendForTesting(Backend::kOwn);
    Tensor t = Matmul(a, b).value();
    gemm::SetBackendForTesting(std::nullopt);
    return t;
  }();
  const Tensor got = Matmul(a, b).value();
  EXPECT_TRUE(AllClose(got, want, 1e-4, 1e-4).ok());
}

// A cache file of another machine or library, a line that does not parse, or one whose candidates
// or unit are not the knob's (the code changed), is measured again and replaced.
TEST(GemmDispatch, ForeignOrBrokenCacheIsMeasuredAgain) {
  for (const std::string& bad :
       {std::string("# x\nkey v0 | some other cpu\ngemm.f32.large GFLOP/s threads 1 quiet own 1 dnnl 12345.678\n"),
        "# x\nkey " + cpu::tune::CacheKey() + "\ngemm.f32.large GFLOP/s threads 1 quiet own fast dnnl 12345.678\n",
        "# x\nkey " + cpu::tune::CacheKey() + "\ngemm.f32.large GFLOP/s threads 1 quiet own 1 dnnl 12345.678\n",
        "# x\nkey " + cpu::tune::CacheKey() + "\ngemm.f32.large GB/s threads 1 quiet own 1 dnnl 12345.678 openblas 1\n",
        std::string("")}) {
    DispatchEnv env(nullptr);
    const std::string path = cpu::tune::CachePath();
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << bad;
    const gemm::Decision d = gemm::Decide(DType::kF32, ShapeClass::kLarge).value();
    EXPECT_NE(d.why.find("measured"), std::string::npos) << d.why;
    const std::string text = testing::ReadFileBytes(path);
    EXPECT_NE(text.find("key " + cpu::tune::CacheKey() + "\n"), std::string::npos) << text;
    EXPECT_EQ(text.find("12345"), std::string::npos) << text;
  }
}

TEST(GemmDispatch, CpuIdentityIsDescribed) {
  const cpu::CpuInfo& c = cpu::ThisCpu();
  const std::string d = c.Describe();
  EXPECT_NE(d.find(std::to_string(c.family) + "/" + std::to_string(c.model)), std::string::npos) << d;
  // AMX is never called granted on a CPU without it.
  if (!c.amx_bf16_cpu) {
    EXPECT_FALSE(c.amx_bf16_granted);
  }
  if (gemm::DnnlUsesAmx()) {
    EXPECT_TRUE(c.amx_bf16_granted);
  }
}

}  // namespace
}  // namespace dt::ops
