#include "dtensor/ops/value.h"

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt {

const DTensor& Value::dtensor() const {
  DT_CHECK(is_dtensor(), "Value::dtensor() on ", Describe());
  return dtensor_;
}

Value Value::Piece(DTensor whole, std::string source) {
  bool replicated = true;
  for (const Placement& p : whole.placements()) replicated = replicated && p.is_replicate();
  Value v(whole.ToLocal());
  if (replicated) return v;
  v.dtensor_ = std::move(whole);
  v.source_ = std::move(source);
  return v;
}

absl::StatusOr<Tensor> WholeTensor(const Value& v) {
  if (v.is_dtensor()) return v.dtensor().FullTensor();
  if (const DTensor* whole = v.piece_of()) return whole->FullTensor();
  return v.local();
}

Value PlainLocal(const Value& v) {
  if (v.piece_of() == nullptr) return v;
  return Value(v.local());
}

std::string Value::Describe() const {
  if (is_dtensor()) return dtensor_.ToString();
  if (piece_of() != nullptr) {
    return absl::StrCat("local ", local_.Describe(), ", this rank's piece of ",
                        DTypeName(dtensor_.dtype()), ShapeToString(dtensor_.shape()), " ",
                        PlacementsToString(dtensor_.placements()),
                        source_.empty() ? " from the root module" : absl::StrCat(" from '", source_, "'"));
  }
  if (is_local()) return absl::StrCat("local ", local_.Describe());
  return "undefined";
}

}  // namespace dt
