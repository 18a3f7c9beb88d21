// core/progress: the line it draws, and that it draws nothing when stderr is not a terminal.
#include "dtensor/core/progress.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace dt {
namespace {

TEST(ProgressBar, LineShowsBytesItemsRateAndEta) {
  ProgressBar bar("loading", 60'000'000, 240, "tensors", /*enabled=*/false);
  EXPECT_EQ(bar.Line(30'000'000, 120, 2.0),
            "loading [##########..........]  50%  30.0/60.0 MB  120/240 tensors  15.0 MB/s  ETA 2.0 s");
  EXPECT_EQ(bar.Line(60'000'000, 240, 4.0),
            "loading [####################] 100%  60.0/60.0 MB  240/240 tensors  15.0 MB/s");
}

TEST(ProgressBar, UnknownTotalsShowNoPercentageOrEta) {
  ProgressBar bar("saving", 0, 0, "tensors", false);
  EXPECT_EQ(bar.Line(0, 3, 1.5), "saving [....................]   0%");
}

TEST(ProgressBar, SilentWhenStderrIsNotATerminal) {
  if (::isatty(STDERR_FILENO)) GTEST_SKIP() << "stderr is a terminal here";
  testing::internal::CaptureStderr();
  {
    ProgressBar bar("loading", 100, 1, "tensors");
    ::usleep(1'100'000);  // past the one second after which a terminal would see the bar
    bar.Update(50, 0);
    bar.Finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace dt
