// Cat, Split, Chunk and Pad: device-independent, built from views and strided copies.

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

absl::StatusOr<Tensor> Cat(absl::Span<const Tensor> tensors, int64_t dim) {
  constexpr absl::string_view kOp = "Cat";
  if (tensors.empty()) return absl::InvalidArgumentError("Cat: no tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    DT_RETURN_IF_ERROR(internal::CheckDefined(kOp, absl::StrCat("tensors[", i, "]"), tensors[i]));
  }
  const Tensor& first = tensors[0];
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, first.dim(), "Cat: dim"));
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bool same = t.dim() == first.dim() && t.dtype() == first.dtype() && t.device() == first.device();
    for (int j = 0; same && j < t.dim(); ++j) same = j == d || t.size(j) == first.size(j);
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": tensors[", i, "] ", t.Describe(), " does not match tensors[0] ", first.Describe(),
          " (same dtype, device, rank and sizes except dim ", d, " needed)"));
    }
    shape[d] += t.size(d);
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(shape, first.dtype(), first.device()));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) {
      DT_ASSIGN_OR_RETURN(Tensor slot, out.Narrow(d, offset, t.size(d)));
      DT_RETURN_IF_ERROR(slot.CopyFrom(t));
    }
    offset += t.size(d);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> Split(const Tensor& x, absl::Span<const int64_t> sizes,
                                          int64_t dim) {
  DT_RETURN_IF_ERROR(internal::CheckDefined("Split", "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), "Split: dim"));
  int64_t total = 0;
  bool ok = true;
  for (int64_t s : sizes) {
    ok &= s >= 0;
    total += s;
  }
  if (!ok || total != x.size(d)) {
    return absl::InvalidArgumentError(absl::StrCat("Split: sizes [", absl::StrJoin(sizes, ", "),
                                                   "] do not partition dim ", d, " of ", x.Describe()));
  }
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    DT_ASSIGN_OR_RETURN(Tensor piece, x.Narrow(d, offset, s));
    out.push_back(std::move(piece));
    offset += s;
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> Chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  DT_RETURN_IF_ERROR(internal::CheckDefined("Chunk", "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), "Chunk: dim"));
  if (chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Chunk: chunks must be >= 1, got ", chunks));
  }
  return Split(x, ChunkSizes(x.size(d), chunks), d);
}

absl::StatusOr<Tensor> Pad(const Tensor& x, int64_t dim, int64_t before, int64_t after,
                           double value) {
  DT_RETURN_IF_ERROR(internal::CheckDefined("Pad", "x", x));
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, x.dim(), "Pad: dim"));
  if (before < 0 || after < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Pad: before ", before, " and after ", after,
                                                   " must be >= 0 (x ", x.Describe(), ")"));
  }
  Shape shape = x.shape();
  shape[d] += before + after;
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Full(shape, value, x.dtype(), x.device()));
  if (x.numel() > 0) {
    DT_ASSIGN_OR_RETURN(Tensor slot, out.Narrow(d, before, x.size(d)));
    DT_RETURN_IF_ERROR(slot.CopyFrom(x));
  }
  return out;
}

}  // namespace dt::ops
