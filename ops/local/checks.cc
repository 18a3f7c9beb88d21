#include "dtensor/ops/local/checks.h"

#include "absl/strings/str_cat.h"
#include "dtensor/core/cuda_module.h"

namespace dt::ops::internal {

absl::Status CheckDefined(absl::string_view op, absl::string_view name, const Tensor& t) {
  if (t.defined()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is an undefined tensor"));
}

absl::Status CheckFloat(absl::string_view op, absl::string_view name, const Tensor& t) {
  DT_RETURN_IF_ERROR(CheckDefined(op, name, t));
  if (IsFloating(t.dtype())) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be f32, bf16 or f16, got ", t.Describe()));
}

absl::Status CheckNotBool(absl::string_view op, absl::string_view name, const Tensor& t) {
  DT_RETURN_IF_ERROR(CheckDefined(op, name, t));
  if (t.dtype() != DType::kBool) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must not be bool, got ", t.Describe()));
}

absl::Status CheckSameDType(absl::string_view op, absl::string_view name_a, const Tensor& a,
                            absl::string_view name_b, const Tensor& b) {
  if (a.dtype() == b.dtype()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": dtypes differ: ", name_a, " ", a.Describe(),
                                                 ", ", name_b, " ", b.Describe(),
                                                 " (cast one with Cast)"));
}

absl::Status CheckSameDevice(absl::string_view op,
                             std::initializer_list<std::pair<absl::string_view, const Tensor*>> ts) {
  const std::pair<absl::string_view, const Tensor*>* first = nullptr;
  for (const auto& p : ts) {
    if (!p.second->defined()) continue;
    if (first == nullptr) {
      first = &p;
    } else if (p.second->device() != first->second->device()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": devices differ: ", first->first, " ",
                                                     first->second->Describe(), ", ", p.first, " ",
                                                     p.second->Describe()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(absl::string_view op, absl::string_view name, const Tensor& t,
                        IntSpan want) {
  if (t.shape() == Shape(want.begin(), want.end())) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must have shape ",
                                                 ShapeToString(want), ", got ", t.Describe()));
}

absl::Status CheckMinDims(absl::string_view op, absl::string_view name, const Tensor& t, int dims) {
  if (t.dim() >= dims) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must have at least ", dims, " dims, got ", t.Describe()));
}

absl::Status CheckInto(absl::string_view op, const Tensor& out, IntSpan shape,
                       std::pair<absl::string_view, const Tensor*> like,
                       std::initializer_list<std::pair<absl::string_view, const Tensor*>> inputs) {
  DT_RETURN_IF_ERROR(CheckDefined(op, "out", out));
  DT_RETURN_IF_ERROR(CheckSameDType(op, like.first, *like.second, "out", out));
  DT_RETURN_IF_ERROR(CheckSameDevice(op, {like, {"out", &out}}));
  DT_RETURN_IF_ERROR(CheckShape(op, "out", out, shape));
  if (out.read_only() || (out.dim() > 0 && out.size(-1) > 1 && out.stride(-1) != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": out ", out.Describe(),
        " must be writable with a unit stride along its last dim, got strides ",
        ShapeToString(out.strides()), out.read_only() ? " (read-only)" : ""));
  }
  for (const auto& [name, t] : inputs) {
    if (t->storage().data() == out.storage().data()) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": out ", out.Describe(),
                                                     " shares its storage with ", name, " ",
                                                     t->Describe()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const CudaKernels*> LoadCudaKernels(absl::string_view op, Device device) {
  absl::StatusOr<const dt::internal::CudaModule*> cuda = dt::internal::LoadCudaModule();
  if (!cuda.ok()) return dt::internal::InContext(cuda.status(), absl::StrCat(op, " on ", device.ToString()));
  return (*cuda)->kernels;
}

}  // namespace dt::ops::internal
