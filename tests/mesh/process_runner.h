#pragma once
// Runs a shell command for the launcher tests: its exit status, combined output and duration.

#include <chrono>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace dt::testing {

struct ProcessResult {
  int status = -1;  // exit code (128 + signal when killed)
  std::string output;
  double seconds = 0;
};

inline ProcessResult RunCommand(const std::string& command) {
  ProcessResult r;
  const auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// The "FAULT-REPORT rank=R ..." line of rank R, or a line saying it is missing (so that a failed
// expectation on it names the rank).
inline std::string ReportOf(const std::string& output, int rank) {
  const std::string key = "FAULT-REPORT rank=" + std::to_string(rank) + " ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return "(no FAULT-REPORT line from rank " + std::to_string(rank) + ")";
  return output.substr(at, output.find('\n', at) - at);
}

}  // namespace dt::testing
