// Every declared DTensor op (ops/op_decl.h) is whole: a rule, a local kernel, a CUDA kernel in
// ops/local/kernels.h or a stated reason it needs none, and a property test in this binary that
// compares it with the local op on random meshes and placements. A new op fails here until all
// of that exists.

#include <cmath>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/op_decl.h"

namespace dt::ops::internal {
namespace {

// The property test (suite.name, registered in dt_ops_test) that checks each op against the
// local op on its global inputs.
const std::map<std::string, std::string>& PropertyTests() {
  static const auto* m = new std::map<std::string, std::string>{
      {"Matmul", "DopsGemm.MatmulMatchesLocal"},
      {"Linear", "DopsGemm.LinearMatchesLocal"},
      {"Binary", "DopsPointwise.BinaryMatchesLocal"},
      {"BinaryScalar", "DopsPointwise.ScalarMatchesLocalAndKeepsPartial"},
      {"Unary", "DopsPointwise.UnaryMatchesLocal"},
      {"Cast", "DopsPointwise.CastMatchesLocal"},
      {"Reduce", "DopsReduce.ReduceMatchesLocal"},
      {"Softmax", "DopsReduce.SoftmaxMatchesLocal"},
      {"RmsNorm", "DopsNorm.NormsMatchLocal"},
      {"LayerNorm", "DopsNorm.NormsMatchLocal"},
      {"ApplyRotary", "DopsNorm.RotaryMatchesLocal"},
      {"ScaledDotProductAttention", "DopsAttention.MatchesLocal"},
      {"Embedding", "DopsEmbedding.MatchesLocal"},
      {"View", "DopsShape.ViewMatchesLocal"},
      {"Permute", "DopsShape.PermuteAndTransposeNeverMove"},
      {"Unsqueeze", "DopsShape.UnsqueezeSqueezeMatchLocal"},
      {"Squeeze", "DopsShape.UnsqueezeSqueezeMatchLocal"},
      {"Cat", "DopsShape.CatMatchesLocal"},
      {"Split", "DopsShape.SplitAndChunkMatchLocal"},
      {"TopK", "DopsReduce.TopKMatchesLocal"},
      {"Modulate", "DopsPointwise.ModulateMatchesLocal"},
      {"GatedActivation", "DopsPointwise.GatedActivationMatchesLocal"},
  };
  return *m;
}

std::set<std::string> RegisteredTests() {
  std::set<std::string> names;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < u.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& s = *u.GetTestSuite(i);
    for (int j = 0; j < s.total_test_count(); ++j) {
      names.insert(absl::StrCat(s.name(), ".", s.GetTestInfo(j)->name()));
    }
  }
  return names;
}

// The kernels every device implements: the rows of DT_LOCAL_KERNELS (ops/local/kernels.h), from
// which namespace cuda's declarations and the CUDA module's table are made.
std::set<std::string> CudaKernels() {
#define DT_KERNEL_NAME_(name, params) #name,
  return {DT_LOCAL_KERNELS(DT_KERNEL_NAME_)};
#undef DT_KERNEL_NAME_
}

TEST(OpDecl, TableIsInOpIdOrderAndComplete) {
  const auto ops = AllOps();
  ASSERT_FALSE(ops.empty());
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpDecl& d = *ops[i];
    SCOPED_TRACE(d.name);
    EXPECT_EQ(static_cast<size_t>(d.op), i);
    EXPECT_EQ(&DeclOf(d.op), &d);
    EXPECT_FALSE(d.input_names.empty());
    EXPECT_LT(d.attrs, std::variant_size_v<Attrs>);
    EXPECT_NE(d.infer, nullptr) << "no shape/dtype rule";
    EXPECT_NE(d.candidates, nullptr) << "no sharding rule";
    EXPECT_NE(d.run, nullptr) << "no local kernel";
  }
}

TEST(OpDecl, EveryOpHasACudaKernelOrAReason) {
  const std::set<std::string> kernels = CudaKernels();
  for (const OpDecl* decl : AllOps()) {
    const OpDecl& d = *decl;
    SCOPED_TRACE(d.name);
    ASSERT_NE(d.cuda, nullptr);
    const std::string c = d.cuda;
    if (absl::StartsWith(c, "cuda::")) {
      EXPECT_TRUE(kernels.count(c.substr(6))) << c << " is not a row of DT_LOCAL_KERNELS (ops/local/kernels.h)";
    } else {
      EXPECT_TRUE(absl::StartsWith(c, "none: ") && c.size() > 10)
          << "expected cuda::<kernel> or 'none: <why>', got '" << c << "'";
    }
  }
}

TEST(OpDecl, EveryOpHasAPropertyTestAgainstTheLocalOp) {
  const std::set<std::string> registered = RegisteredTests();
  std::set<std::string> declared;
  for (const OpDecl* decl : AllOps()) {
    const OpDecl& d = *decl;
    declared.insert(d.name);
    const auto it = PropertyTests().find(d.name);
    if (it == PropertyTests().end()) {
      ADD_FAILURE() << d.name << " has no property test (add it to PropertyTests() here)";
      continue;
    }
    EXPECT_TRUE(registered.count(it->second))
        << d.name << ": " << it->second << " is not a test of this binary";
  }
  for (const auto& [op, test] : PropertyTests()) {
    EXPECT_TRUE(declared.count(op)) << op << " is listed here but not declared";
  }
}

TEST(OpDecl, AttrsCompareBitwiseHashAndPrint) {
  const Attrs a = BinaryScalarAttrs{ops::BinaryOp::kMul, std::nan("")};
  const Attrs b = BinaryScalarAttrs{ops::BinaryOp::kMul, std::nan("")};
  EXPECT_TRUE(a == b);  // a NaN scalar still hits the strategy cache
  EXPECT_EQ(AttrsHash(a), AttrsHash(b));
  EXPECT_FALSE(Attrs(BinaryScalarAttrs{ops::BinaryOp::kMul, 0.0}) ==
               Attrs(BinaryScalarAttrs{ops::BinaryOp::kMul, -0.0}));
  EXPECT_FALSE(Attrs(MatmulAttrs{true, false}) == Attrs(MatmulAttrs{false, true}));
  EXPECT_EQ(AttrsToString(MatmulAttrs{false, true}), "trans_a=0 trans_b=1");
  EXPECT_EQ(AttrsToString(SplitAttrs{1, {2, 3}}), "dim=1 sizes=[2, 3]");
  EXPECT_EQ(AttrsToString(AttentionAttrs{true, std::nullopt, 7, std::nullopt}),
            "causal=1 scale=none kv_length=7 q_offset=none");
}

}  // namespace
}  // namespace dt::ops::internal
