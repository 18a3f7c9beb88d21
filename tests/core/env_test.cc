// core/env: the one policy for DT_* variables (unset or empty: not given; a bad value: an error
// naming the variable, the value and what is accepted), CheckAll, and that docs/env.md lists every
// variable of the table with its accepted values and default.
#include "dtensor/core/env.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt::env {
namespace {

using dt::testing::Contains;
using dt::testing::ScopedEnv;

TEST(Env, UnsetAndEmptyAreNotGiven) {
  ScopedEnv e("DT_TIMEOUT_MS", "");
  EXPECT_EQ(Int("DT_TIMEOUT_MS").value(), std::nullopt);
  ::unsetenv("DT_TIMEOUT_MS");
  EXPECT_EQ(Int("DT_TIMEOUT_MS").value(), std::nullopt);
}

TEST(Env, EveryKindAcceptsItsValues) {
  {
    ScopedEnv e("DT_TIMEOUT_MS", "2500");
    EXPECT_EQ(Int("DT_TIMEOUT_MS").value(), 2500);
  }
  {
    ScopedEnv e("DT_SHM", "0");
    EXPECT_EQ(Flag("DT_SHM").value(), false);
  }
  {
    ScopedEnv e("DT_BACKEND", "gloo");
    EXPECT_EQ(Choice("DT_BACKEND").value(), "gloo");
  }
  {
    ScopedEnv e("DT_JOB_ID", "job-7_a");
    EXPECT_EQ(Text("DT_JOB_ID").value(), "job-7_a");
  }
}

TEST(Env, BadValuesNameTheVariableTheValueAndWhatIsAccepted) {
  const struct {
    const char* name;
    const char* value;
    const char* message;
  } cases[] = {
      {"DT_TIMEOUT_MS", "abc", "DT_TIMEOUT_MS='abc': expected an integer in [1, 86400000]"},
      {"DT_TIMEOUT_MS", "0", "DT_TIMEOUT_MS='0': expected an integer in [1, 86400000]"},
      {"DT_NUM_THREADS", "-2", "DT_NUM_THREADS='-2': expected an integer in [1, 4096]"},
      {"DT_SHM", "yes", "DT_SHM='yes': expected 0 or 1"},
      {"DT_BACKEND", "tcp", "DT_BACKEND='tcp': expected one of threads, gloo, shm, mpi, nccl"},
      {"DT_JOB_ID", "a/b", "DT_JOB_ID='a/b': expected 1-64 letters, digits, '-' or '_'"},
      {"DT_BUFFER_POOL_MB", "lots", "DT_BUFFER_POOL_MB='lots': expected an integer in [0, 1048576]"},
      {"DT_SHM_AREA_KB", "8", "DT_SHM_AREA_KB='8': expected an integer in [64, 65536]"},
  };
  for (const auto& c : cases) {
    ScopedEnv e(c.name, c.value);
    const absl::Status s = CheckAll();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(s.message(), c.message);
  }
  EXPECT_TRUE(CheckAll().ok()) << CheckAll();
}

TEST(Env, DocsListEveryVariable) {
  std::ifstream in(std::string(DT_SOURCE_DIR) + "/docs/env.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const Var& v : Vars()) {
    const std::string row = absl::StrCat("| `", v.name, "` | ", Accepted(v), " | ", v.fallback, " | ", v.meaning, " |");
    EXPECT_TRUE(Contains(doc, row)) << "docs/env.md lacks the row\n" << row;
  }
}

}  // namespace
}  // namespace dt::env
