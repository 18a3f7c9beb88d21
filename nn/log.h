#pragma once
// The nn layer's warnings (plan rules that matched nothing, parameters no rule covers) go through
// one process-wide sink: stderr by default ("dtensor: warning: ..."), replaceable for tests and
// for applications that route logs elsewhere.
//
//   std::vector<std::string> seen;
//   ScopedLogSink capture([&](LogLevel, absl::string_view m) { seen.emplace_back(m); });
//   ... ParallelizeModule(...) ...   // warnings land in `seen`, not on stderr
//
// The sink is called under a lock (ranks running as threads may warn at the same time), so it
// must not log itself.

#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace dt::nn {

enum class LogLevel { kInfo, kWarning };

using LogSink = std::function<void(LogLevel level, absl::string_view message)>;

// Installs `sink` (nullptr restores stderr) and returns the previous one.
LogSink SetLogSink(LogSink sink);
void Log(LogLevel level, absl::string_view message);
inline void LogWarning(absl::string_view message) { Log(LogLevel::kWarning, message); }

// Installs a sink for its lifetime and restores the previous one afterwards.
class ScopedLogSink {
 public:
  explicit ScopedLogSink(LogSink sink) : previous_(SetLogSink(std::move(sink))) {}
  ~ScopedLogSink() { SetLogSink(std::move(previous_)); }
  ScopedLogSink(const ScopedLogSink&) = delete;
  ScopedLogSink& operator=(const ScopedLogSink&) = delete;

 private:
  LogSink previous_;
};

}  // namespace dt::nn
