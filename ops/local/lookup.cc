// Embedding lookup (masked, for vocab-sharded tables).

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/checks.h"
#include "dtensor/ops/local/kernels.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops {

absl::StatusOr<Tensor> Embedding(const Tensor& table, const Tensor& ids, int64_t index_offset) {
  constexpr absl::string_view kOp = "Embedding";
  DT_RETURN_IF_ERROR(internal::CheckDefined(kOp, "table", table));
  DT_RETURN_IF_ERROR(internal::CheckDefined(kOp, "ids", ids));
  DT_RETURN_IF_ERROR(internal::CheckSameDevice(kOp, {{"table", &table}, {"ids", &ids}}));
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": table must have shape [V, H], got ", table.Describe()));
  }
  if (ids.dtype() != DType::kI64 && ids.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ids must be i64 or i32, got ", ids.Describe()));
  }
  if (IsQuantized(table.dtype()) && !table.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat("Embedding with a quantized table on ",
                                                 table.device().ToString(), ": quantized kernels are CPU only"));
  }
  if (IsQuantized(table.dtype()) && table.size(1) > 0 && table.stride(1) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": a quantized table must have rows with unit stride, got ",
                     table.Describe()));
  }
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  // A quantized table's rows come out dequantized, in f32.
  const DType out_dtype = IsQuantized(table.dtype()) ? DType::kF32 : table.dtype();
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(shape, out_dtype, table.device()));
  if (out.numel() > 0) {
    DT_RETURN_IF_ERROR(DT_OPS_KERNEL(out.device(), Embedding, table, ids, index_offset, out));
  }
  return out;
}

absl::StatusOr<Tensor> Embedding(const Tensor& table, const Tensor& ids) {
  return Embedding(table, ids, 0);
}

}  // namespace dt::ops
