// DTensor ops on CUDA pieces: the same ops, strategies and local shapes as on the host, the local
// kernels running on cuda:0. Every rank of a 4-rank mesh is seen in turn through an abstract mesh
// (the layouts here need no communication, and the threads backend moves host memory only), and
// each rank's CUDA piece must match its host piece (the oracle): exactly for data movement and
// lookups, within f32 tolerance for arithmetic. Skips without a CUDA device.
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/tests/ops/ops_test_util.h"

namespace dt::ops::internal::testing {
namespace {

constexpr Device kGpu = Device::CUDA(0);

using Op = std::function<absl::StatusOr<std::vector<DTensor>>(const std::vector<DTensor>&)>;

struct Input {
  Tensor full;
  const char* placements;
};

// Runs `op` on every rank's pieces on the host and on the GPU and compares the pieces.
void CheckOnGpu(const char* name, const std::vector<Input>& inputs, const Op& op, bool exact) {
  SCOPED_TRACE(name);
  for (int rank = 0; rank < 4; ++rank) {
    const DeviceMesh mesh = DeviceMesh::Abstract({4}, {"tp"}, rank).value();
    std::vector<DTensor> cpu, gpu;
    for (const Input& in : inputs) {
      cpu.push_back(DTensor::Distribute(in.full, mesh, Pl(in.placements), std::nullopt).value());
      gpu.push_back(
          DTensor::Distribute(in.full.To(kGpu).value(), mesh, Pl(in.placements), std::nullopt)
              .value());
    }
    auto want = op(cpu);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = op(gpu);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t k = 0; k < want->size(); ++k) {
      const DTensor &g = (*got)[k], &w = (*want)[k];
      EXPECT_EQ(g.spec(), w.spec()) << "rank " << rank << " output " << k;
      EXPECT_TRUE(g.ToLocal().device() == kGpu) << "rank " << rank << " output " << k;
      const Tensor host = g.ToLocal().To(kCPU).value();
      const absl::Status close =
          AllClose(host, w.ToLocal(), exact ? 0 : 1e-4, exact ? 0 : 1e-4);
      EXPECT_TRUE(close.ok()) << "rank " << rank << " output " << k << ": " << close;
    }
  }
}

template <typename Fn>
Op One(Fn fn) {
  return [fn](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
    DT_ASSIGN_OR_RETURN(DTensor y, fn(in));
    return std::vector<DTensor>{y};
  };
}

TEST(DopsCuda, OpsMatchTheHostOnEveryRank) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device: " << CudaUnavailableReason();
  const Tensor x = RandTensor({3, 8}, 1, false), w = RandTensor({10, 8}, 2, false),
               b = RandTensor({10}, 3, false), w2 = RandTensor({8, 10}, 4, false),
               big = RandTensor({6, 10}, 5, false), pos = RandTensor({6, 10}, 6, true, 1, 5);
  CheckOnGpu("Linear colwise", {{x, "R"}, {w, "S(0)"}, {b, "S(0)"}},
             One([](auto& in) { return Linear(in[0], in[1], in[2]); }), false);
  CheckOnGpu("Linear rowwise", {{big, "S(1)"}, {w2, "S(1)"}, {RandTensor({8}, 7, false), "R"}},
             One([](auto& in) { return Linear(in[0], in[1], in[2]); }), false);
  // Splitting a float into Partial(sum) divides each rank's copy (device memory, via the host).
  CheckOnGpu("Distribute P(sum)", {{x, "P(sum)"}}, One([](auto& in) -> absl::StatusOr<DTensor> { return in[0]; }), false);
  CheckOnGpu("Matmul", {{x, "S(0)"}, {RandTensor({8, 5}, 8, false), "R"}},
             One([](auto& in) { return Matmul(in[0], in[1]); }), false);
  CheckOnGpu("Add Partial + R", {{big, "S(1)"}, {pos, "S(1)"}},
             One([](auto& in) -> absl::StatusOr<DTensor> {
               DT_ASSIGN_OR_RETURN(DTensor s, Sum(in[0], 1));  // P(sum)
               DT_ASSIGN_OR_RETURN(DTensor r, Sum(in[1], 1));  // P(sum)
               DT_ASSIGN_OR_RETURN(DTensor t, Add(s, r));
               return Add(t, 2.0);  // added by rank 0 only
             }),
             false);
  CheckOnGpu("Mul, Div, Silu, Gelu, Exp, Rsqrt, Cast", {{big, "S(0)"}, {pos, "S(0)"}},
             One([](auto& in) -> absl::StatusOr<DTensor> {
               DT_ASSIGN_OR_RETURN(DTensor m, Mul(in[0], in[1]));
               DT_ASSIGN_OR_RETURN(DTensor d, Div(m, in[1]));
               DT_ASSIGN_OR_RETURN(DTensor s, Silu(d));
               DT_ASSIGN_OR_RETURN(DTensor g, Gelu(s, ops::GeluApproximation::kTanh));
               DT_ASSIGN_OR_RETURN(DTensor e, Exp(g));
               DT_ASSIGN_OR_RETURN(DTensor r, Rsqrt(e));
               DT_ASSIGN_OR_RETURN(DTensor c, Cast(r, DType::kBF16));
               return Cast(c, DType::kF32);
             }),
             false);
  CheckOnGpu("Tanh, SoftCap", {{big, "S(1)"}},
             [](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
               DT_ASSIGN_OR_RETURN(DTensor t, Tanh(in[0]));
               DT_ASSIGN_OR_RETURN(DTensor c, SoftCap(in[0], 0.5));
               return std::vector<DTensor>{t, c};
             },
             false);
  CheckOnGpu("Mean, Max over a sharded dim; Argmax, Softmax, TopK off it", {{big, "S(1)"}},
             [](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
               DT_ASSIGN_OR_RETURN(DTensor mean, Mean(in[0], 1));
               DT_ASSIGN_OR_RETURN(DTensor max, Max(in[0], 1, true));
               DT_ASSIGN_OR_RETURN(DTensor am, Argmax(in[0], 0));
               DT_ASSIGN_OR_RETURN(DTensor sm, Softmax(in[0], 0));
               DT_ASSIGN_OR_RETURN(TopKOf<DTensor> tk, TopK(in[0], 2, 0));
               return std::vector<DTensor>{mean, max, am, sm, tk.values, tk.indices};
             },
             false);
  CheckOnGpu("RmsNorm, LayerNorm", {{big, "S(0)"}, {RandTensor({10}, 9, false), "R"}},
             [](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
               DT_ASSIGN_OR_RETURN(DTensor r, RmsNorm(in[0], in[1]));
               DT_ASSIGN_OR_RETURN(DTensor l, LayerNorm(in[0], in[1], in[1]));
               return std::vector<DTensor>{r, l};
             },
             false);
  const Tensor q = RandTensor({1, 8, 5, 4}, 10, false), k = RandTensor({1, 4, 5, 4}, 11, false),
               v = RandTensor({1, 4, 5, 4}, 12, false), cs = RandTensor({5, 4}, 13, false);
  CheckOnGpu("ApplyRotary, attention over heads (GQA)",
             {{q, "S(1)"}, {k, "S(1)"}, {v, "S(1)"}, {cs, "R"}},
             One([](auto& in) -> absl::StatusOr<DTensor> {
               DT_ASSIGN_OR_RETURN(DTensor qr, ApplyRotary(in[0], in[3], in[3],
                                                           ops::RotaryStyle::kHalf));
               ops::AttentionOptions o;
               o.causal = true;
               return ScaledDotProductAttention(qr, in[1], in[2], o);
             }),
             false);
  CheckOnGpu("attention over queries", {{q, "S(2)"}, {k, "R"}, {v, "R"}},
             One([](auto& in) -> absl::StatusOr<DTensor> {
               ops::AttentionOptions o;
               o.causal = true;
               return ScaledDotProductAttention(in[0], in[1], in[2], o);
             }),
             false);
  const Tensor table = RandTensor({11, 3}, 14, false);
  const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {0, 3, 10, 7, 5, 1}).value();
  CheckOnGpu("Embedding vocab-sharded", {{table, "S(0)"}, {ids, "R"}},
             One([](auto& in) { return Embedding(in[0], in[1]); }), true);
  CheckOnGpu("View, Transpose, Cat, Split", {{RandTensor({4, 6, 8}, 15, false), "S(2)"}},
             [](const std::vector<DTensor>& in) -> absl::StatusOr<std::vector<DTensor>> {
               DT_ASSIGN_OR_RETURN(DTensor v, View(in[0], {4, 6, 4, 2}));
               DT_ASSIGN_OR_RETURN(DTensor t, Transpose(v, 1, 2));
               DT_ASSIGN_OR_RETURN(DTensor c, Cat({in[0], in[0]}, 2));
               DT_ASSIGN_OR_RETURN(std::vector<DTensor> s, Split(c, {8, 8}, 2));
               return std::vector<DTensor>{v, t, c, s[1]};
             },
             true);
}

}  // namespace
}  // namespace dt::ops::internal::testing
