#include "dtensor/nn/value.h"

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::nn {

const DTensor& Value::dtensor() const {
  DT_CHECK(is_dtensor(), "Value::dtensor() on ", Describe());
  return dtensor_;
}

std::string Value::Describe() const {
  if (is_dtensor()) return dtensor_.ToString();
  if (is_local()) return absl::StrCat("local ", local_.Describe());
  return "undefined";
}

}  // namespace dt::nn
