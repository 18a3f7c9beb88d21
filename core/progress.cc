#include "dtensor/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dt {
namespace {

std::string Megabytes(int64_t b) { return absl::StrFormat("%.1f", b / 1e6); }

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total_bytes, int64_t total_items,
                         std::string item_name, bool enabled)
    : label_(std::move(label)),
      item_name_(std::move(item_name)),
      total_bytes_(total_bytes),
      total_items_(total_items),
      enabled_(enabled && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { Finish(); }

std::string ProgressBar::Line(int64_t bytes_done, int64_t items_done, double seconds) const {
  const double frac = total_bytes_ > 0   ? std::min(1.0, double(bytes_done) / total_bytes_)
                      : total_items_ > 0 ? std::min(1.0, double(items_done) / total_items_)
                                         : 0.0;
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(frac * kWidth);
  std::string line = absl::StrCat(label_, " [", std::string(filled, '#'),
                                  std::string(kWidth - filled, '.'), "] ",
                                  absl::StrFormat("%3.0f%%", 100 * frac));
  if (total_bytes_ > 0) {
    absl::StrAppend(&line, "  ", Megabytes(bytes_done), "/", Megabytes(total_bytes_), " MB");
  }
  if (total_items_ > 0) {
    absl::StrAppend(&line, "  ", items_done, "/", total_items_, " ", item_name_);
  }
  if (seconds > 0 && bytes_done > 0) {
    absl::StrAppend(&line, absl::StrFormat("  %.1f MB/s", bytes_done / 1e6 / seconds));
  }
  if (seconds > 0 && frac > 0 && frac < 1) {
    absl::StrAppend(&line, absl::StrFormat("  ETA %.1f s", seconds * (1 - frac) / frac));
  }
  return line;
}

void ProgressBar::Update(int64_t bytes_done, int64_t items_done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  if (seconds < 1.0 || now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  std::fprintf(stderr, "\r%s\033[K", Line(bytes_done, items_done, seconds).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Clear() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

void ProgressBar::Finish() {
  Clear();
  enabled_ = false;
}

}  // namespace dt
