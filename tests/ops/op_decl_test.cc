// Every declared DTensor op (ops/op_decl.h) is whole: a rule, a local kernel, a CUDA kernel in
// ops/local/kernels.h or a stated reason it needs none, and a property test in this binary that
// compares it with the local op on random meshes and placements. A new op fails here until all
// of that exists, and until docs/ops.md's table of strategies names it.

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/ops/dtensor_ops.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/op_decl.h"

namespace dt::ops::internal {
namespace {

// The property test (suite.name, registered in dt_ops_test) that checks each op against the
// local op on its global inputs, where it is not named <Suite>.<Op>MatchesLocal (PropertyTestOf).
const std::map<std::string, std::string>& PropertyTests() {
  static const auto* m = new std::map<std::string, std::string>{
      {"BinaryScalar", "DopsPointwise.ScalarMatchesLocalAndKeepsPartial"},
      {"RmsNorm", "DopsNorm.NormsMatchLocal"},
      {"LayerNorm", "DopsNorm.NormsMatchLocal"},
      {"ApplyRotary", "DopsNorm.RotaryMatchesLocal"},
      {"ScaledDotProductAttention", "DopsAttention.MatchesLocal"},
      {"Embedding", "DopsEmbedding.MatchesLocal"},
      {"Permute", "DopsShape.PermuteAndTransposeNeverMove"},
      {"Unsqueeze", "DopsShape.UnsqueezeSqueezeMatchLocal"},
      {"Squeeze", "DopsShape.UnsqueezeSqueezeMatchLocal"},
      {"Split", "DopsShape.SplitAndChunkMatchLocal"},
  };
  return *m;
}

std::set<std::string> RegisteredTests();

// The property test of op `name`: its entry in PropertyTests(), else a registered test named
// <Suite>.<name>MatchesLocal (the name a new op's test takes: no entry needed); "" if neither.
std::string PropertyTestOf(const std::string& name) {
  const auto it = PropertyTests().find(name);
  if (it != PropertyTests().end()) return it->second;
  for (const std::string& test : RegisteredTests()) {
    if (absl::EndsWith(test, absl::StrCat(".", name, "MatchesLocal"))) return test;
  }
  return "";
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
    const std::string test = PropertyTestOf(d.name);
    if (test.empty()) {
      ADD_FAILURE() << d.name << " has no property test (name it <Suite>." << d.name
                    << "MatchesLocal, or add it to PropertyTests() here)";
      continue;
    }
    EXPECT_TRUE(registered.count(test)) << d.name << ": " << test << " is not a test of this binary";
  }
  for (const auto& [op, test] : PropertyTests()) {
    EXPECT_TRUE(declared.count(op)) << op << " is listed here but not declared";
  }
}

// The public ops on DTensors: a name per row of the op lists (ops/local/ops.h, ops/dtensor_ops.h),
// and Cat.
std::set<std::string> PublicOps() {
#define DT_ROW_NAME_(name, ...) #name,
  return {DT_OPS(DT_ROW_NAME_) DT_DECLARED_OPS(DT_ROW_NAME_) DT_LAYOUT_OPS(DT_ROW_NAME_) "Cat"};
#undef DT_ROW_NAME_
}

// The op names in the first column of docs/ops.md's table of strategies: its `Name`s.
std::set<std::string> DocumentedOps() {
  std::ifstream in(DT_SOURCE_DIR "/docs/ops.md");
  EXPECT_TRUE(in.good()) << "cannot read " DT_SOURCE_DIR "/docs/ops.md";
  std::set<std::string> names;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "| op | strategies")) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (!absl::StartsWith(line, "|")) break;
    const std::vector<std::string> cells = absl::StrSplit(line, '|');
    const std::vector<std::string> quoted = absl::StrSplit(cells[1], '`');
    for (size_t i = 1; i < quoted.size(); i += 2) {  // the odd pieces are between backquotes
      const std::string& q = quoted[i];
      if (!q.empty() && std::isupper(static_cast<unsigned char>(q[0])) &&
          q.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") ==
              std::string::npos) {
        names.insert(q);
      }
    }
  }
  EXPECT_FALSE(names.empty()) << "no table '| op | strategies ...' in docs/ops.md";
  return names;
}

TEST(OpDecl, DocsTableNamesEveryPublicOp) {
  const std::set<std::string> ops = PublicOps(), documented = DocumentedOps();
  std::vector<std::string> undocumented, unknown;
  for (const auto& op : ops) {
    if (!documented.count(op)) undocumented.push_back(op);
  }
  for (const auto& op : documented) {
    if (!ops.count(op)) unknown.push_back(op);
  }
  EXPECT_TRUE(undocumented.empty()) << "ops missing from docs/ops.md's table of strategies: "
                                    << absl::StrJoin(undocumented, ", ");
  EXPECT_TRUE(unknown.empty()) << "docs/ops.md's table of strategies names ops that no row of "
                                  "DT_OPS, DT_DECLARED_OPS or DT_LAYOUT_OPS declares: "
                               << absl::StrJoin(unknown, ", ");
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
