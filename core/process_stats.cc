#include "dtensor/core/process_stats.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace dt {
namespace {

// A "Name:   123 kB" line of /proc/self/status, in bytes; -1 when absent.
int64_t StatusBytes(const char* name) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = std::string(name) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::strtoll(line.c_str() + prefix.size(), nullptr, 10) * 1024;
  }
  return -1;
}

}  // namespace

int64_t PeakResidentBytes() { return StatusBytes("VmHWM"); }

int64_t ResidentBytes() { return StatusBytes("VmRSS"); }

bool ResetPeakResidentBytes() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";  // proc(5): "5" resets the peak resident set size to the current one
  out.flush();
  return out.good();
}

}  // namespace dt
