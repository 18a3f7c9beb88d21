#pragma once
// What the kernel says about this process: its peak resident memory (VmHWM in /proc/self/status),
// the figure the generators and bench/load print per rank.

#include <cstdint>

namespace dt {

// Peak resident set size in bytes since the process started; -1 where /proc is not readable.
int64_t PeakResidentBytes();

}  // namespace dt
