#pragma once
// ProgressBar: one self-rewriting line on stderr for long work (loading, saving, denoising).
//
//   loading [##########..........]  52%  31.2/60.0 MB  120/241 tensors  84.1 MB/s  ETA 0.3 s
//
// It appears only when stderr is a terminal and the work has run for more than a second, so pipes,
// CI logs and quick runs see nothing extra; Finish() (or the destructor) clears the line. Updates
// redraw at most ten times a second. Not thread-safe: one owner calls Update.

#include <chrono>
#include <cstdint>
#include <string>

namespace dt {

class ProgressBar {
 public:
  // `total_bytes` and `total_items` may be 0 (unknown: no percentage, no ETA). `enabled` false
  // draws nothing (a non-leading rank).
  ProgressBar(std::string label, int64_t total_bytes, int64_t total_items, std::string item_name,
              bool enabled = true);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(int64_t bytes_done, int64_t items_done);
  // Erases the line if it is drawn (before printing something else on the terminal); the next
  // Update draws it again.
  void Clear();
  void Finish();

  // The line as drawn (tests; no terminal needed).
  std::string Line(int64_t bytes_done, int64_t items_done, double seconds) const;

 private:
  std::string label_, item_name_;
  int64_t total_bytes_, total_items_;
  bool enabled_, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace dt
