#include "dtensor/nn/log.h"

#include <cstdio>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace dt::nn {
namespace {

absl::Mutex& SinkMutex() {
  static absl::Mutex mu;
  return mu;
}

LogSink& Sink() {
  static LogSink sink;
  return sink;
}

}  // namespace

LogSink SetLogSink(LogSink sink) {
  absl::MutexLock lock(&SinkMutex());
  return std::exchange(Sink(), std::move(sink));
}

void Log(LogLevel level, absl::string_view message) {
  absl::MutexLock lock(&SinkMutex());
  if (Sink()) {
    Sink()(level, message);
    return;
  }
  std::fprintf(stderr, "dtensor: %s: %.*s\n", level == LogLevel::kWarning ? "warning" : "info",
               static_cast<int>(message.size()), message.data());
}

}  // namespace dt::nn
