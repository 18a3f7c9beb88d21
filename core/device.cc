#include "dtensor/core/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dt {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return Device::CUDA(0);
  if (text.substr(0, 5) == "cuda:") {
    int i = 0;
    if (absl::SimpleAtoi(text.substr(5), &i) && i >= 0) return Device::CUDA(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", text, "'; expected cpu, cuda or cuda:N"));
}

}  // namespace dt
