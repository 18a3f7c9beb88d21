#pragma once
// What the kernel says about this process: its resident memory now (VmRSS in /proc/self/status)
// and at its peak (VmHWM), the figure the generators and bench/load print per rank.

#include <cstdint>

namespace dt {

// Peak resident set size in bytes since the process started or since ResetPeakResidentBytes;
// -1 where /proc is not readable.
int64_t PeakResidentBytes();
// Resident set size in bytes now; -1 where /proc is not readable.
int64_t ResidentBytes();
// Starts the peak over from the resident set size now (Linux 4.0+: /proc/self/clear_refs), so
// that a test can bound what one step costs at its peak; false where that is not possible.
bool ResetPeakResidentBytes();

}  // namespace dt
