#pragma once
// Small assertions and helpers shared by the tests.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
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

// Sets an environment variable for the scope (nullptr: unsets it), restoring what it was after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// For code that caches what it measured under XDG_CACHE_HOME and reads one variable (DT_GEMM,
// DT_TUNE) once: for the scope, XDG_CACHE_HOME is a fresh directory (removed after) and `name` is
// `value` (nullptr: unset). `enter` runs once both are set, `leave` once both are restored (to make
// the code forget what it read).
class ScopedCache {
 public:
  ScopedCache(const char* name, const char* value, std::function<void()> enter, std::function<void()> leave)
      : dir_(std::filesystem::temp_directory_path() /
             absl::StrCat("dt-cache-", ::getpid(), "-", counter_++)),
        leave_(std::move(leave)) {
    std::filesystem::remove_all(dir_);
    xdg_.emplace("XDG_CACHE_HOME", dir_.c_str());
    var_.emplace(name, value);
    enter();
  }
  ScopedCache(const ScopedCache&) = delete;
  ScopedCache& operator=(const ScopedCache&) = delete;
  ~ScopedCache() {
    xdg_.reset();
    var_.reset();
    leave_();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::function<void()> leave_;
  std::optional<ScopedEnv> xdg_, var_;
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
