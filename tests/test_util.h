#pragma once
// Small assertions and helpers shared by the tests.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// A scratch directory of this process's own, `<tmp>/dt_<tag>_<pid>`, created at construction and
// removed with everything in it at destruction. Hold it in a function-local static that also
// hands out the paths, so that nothing uses the path after the directory is gone.
struct ScratchDir {
  std::string path;
  explicit ScratchDir(absl::string_view tag)
      : path((std::filesystem::temp_directory_path() / absl::StrCat("dt_", tag, "_", ::getpid())).string()) {
    std::filesystem::create_directories(path);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A file's bytes, all of them ("" when it cannot be read).
inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
// Writes `bytes` as the whole of the file at `path`.
inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace dt::testing
