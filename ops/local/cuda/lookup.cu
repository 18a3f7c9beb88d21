// CUDA Embedding kernel: masked row gather, one thread per output element. The table's dtype only
// matters through its element size.

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

// out [n, h] (contiguous): out[r, c] = table[ids[r] - index_offset, c], or 0 when that row does not
// exist.
template <typename E>
__global__ void EmbeddingKernel(const E* table, int64_t vocab, int64_t ts0, int64_t ts1,
                                const void* ids, bool ids64, Indexer<1> ix, int64_t index_offset,
                                E* out, int64_t h, int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / h, c = e - r * h;
    int64_t off[1];
    ix.Offsets(r, off);
    const int64_t id = ids64 ? static_cast<const int64_t*>(ids)[off[0]]
                             : static_cast<int64_t>(static_cast<const int32_t*>(ids)[off[0]]);
    // Compare without a signed subtraction that could overflow for extreme ids.
    const bool present =
        id >= index_offset && static_cast<uint64_t>(id) - static_cast<uint64_t>(index_offset) <
                                  static_cast<uint64_t>(vocab);
    out[e] = present ? table[(id - index_offset) * ts0 + c * ts1] : E(0);
  }
}

template <typename E>
absl::Status RunEmbedding(const Tensor& table, const Tensor& ids, const Indexer<1>& ix,
                          int64_t index_offset, const Tensor& out) {
  const int64_t h = table.size(1), total = out.numel();
  return Launch("Embedding", EmbeddingKernel<E>, GridFor(total, 256), 256, 0, table.raw_data(),
                table.size(0), table.stride(0), table.stride(1), ids.raw_data(),
                ids.dtype() == DType::kI64, ix, index_offset, out.raw_data(), h, total);
}

}  // namespace

absl::Status Embedding(const Tensor& table, const Tensor& ids, int64_t index_offset,
                       const Tensor& out) {
  constexpr absl::string_view kKernel = "Embedding";
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  DT_ASSIGN_OR_RETURN(Indexer<1> ix,
                      MakeIndexer<1>(kKernel, ids.shape(), {IntSpan(ids.strides())}));
  switch (DTypeSize(table.dtype())) {
    case 1: return RunEmbedding<uint8_t>(table, ids, ix, index_offset, out);
    case 2: return RunEmbedding<uint16_t>(table, ids, ix, index_offset, out);
    case 4: return RunEmbedding<uint32_t>(table, ids, ix, index_offset, out);
    default: return RunEmbedding<uint64_t>(table, ids, ix, index_offset, out);
  }
}

}  // namespace dt::ops::cuda
