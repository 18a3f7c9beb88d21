#pragma once
// Small assertions shared by the tests.
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace dt::testing {

// EXPECT_TRUE(Contains(text, "needle")) prints both on failure.
inline ::testing::AssertionResult Contains(absl::string_view text, absl::string_view needle) {
  if (text.find(needle) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << needle << "'";
}
inline ::testing::AssertionResult Contains(const absl::Status& s, absl::string_view needle) {
  if (s.ok()) return ::testing::AssertionFailure() << "OK status; expected '" << needle << "'";
  return Contains(s.message(), needle);
}

}  // namespace dt::testing
