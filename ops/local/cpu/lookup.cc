// CPU Embedding kernel: masked row gather.

#include <cstring>

#include "dtensor/core/quant.h"

#include "dtensor/ops/local/cpu/loops.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

absl::Status Embedding(const Tensor& table, const Tensor& ids, int64_t index_offset,
                       const Tensor& out) {
  const int64_t vocab = table.size(0), h = table.size(1), n = ids.numel();
  const int64_t esz = DTypeSize(out.dtype()), ts0 = table.stride(0), ts1 = table.stride(1);
  const DType q = table.dtype();  // a quantized table: its rows dequantized (f32 out)
  const char* pt = static_cast<const char*>(table.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  const std::array<Shape, 1> id_strides = {ids.strides()};
  ParallelFor(n, h, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t off = Offsets<1>(i, ids.shape(), id_strides)[0];
      const int64_t id = ids.dtype() == DType::kI64 ? ids.data<int64_t>()[off]
                                                    : int64_t{ids.data<int32_t>()[off]};
      char* dst = po + i * h * esz;
      // In unsigned arithmetic so that extreme ids and offsets cannot overflow.
      if (id < index_offset ||
          static_cast<uint64_t>(id) - static_cast<uint64_t>(index_offset) >= static_cast<uint64_t>(vocab)) {
        std::memset(dst, 0, static_cast<size_t>(h * esz));
      } else if (IsQuantized(q)) {
        DequantizeBlocks(q, pt + DTypeBytes(q, (id - index_offset) * ts0), h,
                         reinterpret_cast<float*>(dst));
      } else if (ts1 == 1) {
        std::memcpy(dst, pt + (id - index_offset) * ts0 * esz, static_cast<size_t>(h * esz));
      } else {
        const char* src = pt + (id - index_offset) * ts0 * esz;
        for (int64_t j = 0; j < h; ++j) std::memcpy(dst + j * esz, src + j * ts1 * esz, static_cast<size_t>(esz));
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace dt::ops::cpu
