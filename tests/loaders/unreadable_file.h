#pragma once
// For the loaders' tests: a file the process may not read must be PermissionDenied, not NotFound.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt::testing {

// Expects `open(path)` to fail with PermissionDenied ("Permission denied") once `path` may not be
// read. Root reads every file, so as root a child process that became nobody (uid 65534) opens it.
inline void ExpectPermissionDenied(const std::string& path,
                                   const std::function<absl::Status(const std::string&)>& open) {
  if (::geteuid() != 0) {
    ::chmod(path.c_str(), 0);
    const absl::Status st = open(path);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
    EXPECT_TRUE(Contains(st, "Permission denied")) << st;
    return;
  }
  ::chmod(path.c_str(), 0600);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    const absl::Status st = open(path);
    if (st.code() != absl::StatusCode::kPermissionDenied || !Contains(st, "Permission denied")) {
      std::fprintf(stderr, "as nobody: %s\n", st.ToString().c_str());
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = -1;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace dt::testing
