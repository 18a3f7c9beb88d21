// CUDA TopK kernel, exact for any k.
//
// Note [TopK on the GPU]
// 1. Every element becomes an unsigned order key (larger key = earlier in the result): floats by
//    their IEEE bits flipped into unsigned order, with every NaN mapped to the largest key and -0
//    to +0 (the CPU treats NaNs as equal to each other and -0 == +0, breaking ties by index);
//    integers with the sign bit flipped. For `largest == false` the key is inverted.
// 2. When k < n, one block per lane finds the k-th largest key T by radix selection (8-bit digits
//    from the top, a shared histogram per pass) and then compacts, in index order, every key > T
//    and the first (k - #{key > T}) keys == T. Ties at T thus keep the lowest indices.
// 3. One block per lane sorts its k candidates by (key descending, index ascending) with a bitonic
//    network: in shared memory for up to 4096 candidates, in place in global memory beyond.
// 4. The values are gathered from x at the sorted indices (bit-exact copies).
// Cost per lane: O(n · key bytes) for the selection plus O(k log² k) for the sort.

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

constexpr absl::string_view kKernel = "TopK";
constexpr int64_t kSharedSortMax = 4096;  // candidates sorted in shared memory (48 KiB)
constexpr uint32_t kPadIndex = 0xffffffffu;

template <typename T>
__device__ __forceinline__ uint64_t OrderKey(T v) {
  if constexpr (kIsFloat<T>) {
    float f = Load(v);
    if (isnan(f)) return 0xffffffffull;
    if (f == 0.0f) f = 0.0f;  // -0 -> +0
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return static_cast<uint64_t>(v) ^ 0x8000000000000000ull;
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<uint32_t>(v) ^ 0x80000000u;
  } else {
    return static_cast<uint64_t>(v);  // u8
  }
}

// Keys of every element, lane-major. With `cand` (k == n) they go straight to the candidate
// arrays (row stride p) with their indices; otherwise into keys [lanes, n].
template <typename T>
__global__ void KeysKernel(const T* x, LaneIndexer<1> li, bool largest, uint64_t key_mask,
                           uint64_t* keys, uint32_t* cand_idx, int64_t p, int64_t total) {
  const int64_t n = li.n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t lane = e / n, j = e - lane * n;
    int64_t off[1];
    li.outer.Offsets(lane, off);
    uint64_t key = OrderKey(x[off[0] + j * li.lane_stride[0]]);
    if (!largest) key = ~key & key_mask;
    if (cand_idx != nullptr) {
      keys[lane * p + j] = key;
      cand_idx[lane * p + j] = static_cast<uint32_t>(j);
    } else {
      keys[e] = key;
    }
  }
}

// Exclusive count of `flag` over the threads before this one in the block (blockDim.x a multiple
// of 32), and the block's total. All threads must call it.
__device__ __forceinline__ unsigned BlockRank(bool flag, unsigned* warp_counts, unsigned* total) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const unsigned in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  unsigned before = 0, all = 0;
  for (unsigned w = 0; w < warps; ++w) {
    const unsigned c = warp_counts[w];
    if (w < warp) before += c;
    all += c;
  }
  __syncthreads();
  *total = all;
  return before + in_warp;
}

// Step 2 of Note [TopK on the GPU]: candidates [lanes, p] (first k of each row) in index order.
__global__ void SelectKernel(const uint64_t* keys, int64_t lanes, int64_t n, int64_t k,
                             int key_bits, uint64_t* cand_key, uint32_t* cand_idx, int64_t p) {
  __shared__ unsigned hist[256];
  __shared__ unsigned warp_counts[32];
  __shared__ uint64_t s_prefix;
  __shared__ int64_t s_rem;
  for (int64_t lane = blockIdx.x; lane < lanes; lane += gridDim.x) {
    const uint64_t* kl = keys + lane * n;
    uint64_t prefix = 0, mask = 0;
    int64_t rem = k;  // rank (1-based) of the wanted key among those matching `prefix`
    for (int shift = key_bits - 8; shift >= 0; shift -= 8) {
      for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const uint64_t u = kl[j];
        if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int64_t above = 0;
        int d = 255;
        for (; d > 0 && above + hist[d] < rem; --d) above += hist[d];
        s_prefix = prefix | (static_cast<uint64_t>(d) << shift);
        s_rem = rem - above;
      }
      __syncthreads();
      prefix = s_prefix;
      rem = s_rem;
      mask |= static_cast<uint64_t>(255) << shift;
      __syncthreads();
    }
    // prefix is now the k-th largest key T; take all keys > T and the first `rem` keys == T.
    int64_t eq_seen = 0, sel_seen = 0;
    for (int64_t base = 0; base < n && sel_seen < k; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      const bool in = j < n;
      const uint64_t u = in ? kl[j] : 0;
      const bool eq = in && u == prefix;
      unsigned eq_total, sel_total;
      const unsigned eq_rank = BlockRank(eq, warp_counts, &eq_total);
      const bool sel = (in && u > prefix) || (eq && eq_seen + eq_rank < rem);
      const unsigned pos = BlockRank(sel, warp_counts, &sel_total);
      if (sel) {
        cand_key[lane * p + sel_seen + pos] = u;
        cand_idx[lane * p + sel_seen + pos] = static_cast<uint32_t>(j);
      }
      eq_seen += eq_total;
      sel_seen += sel_total;
    }
  }
}

// (key, index) a comes before b: larger key first, then lower index.
__device__ __forceinline__ bool Before(uint64_t ka, uint32_t ia, uint64_t kb, uint32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// Step 3: sorts the first m candidates of each row (padded to p, a power of two).
__global__ void SortKernel(uint64_t* cand_key, uint32_t* cand_idx, int64_t lanes, int64_t m,
                           int64_t p, bool shared) {
  extern __shared__ uint64_t smem[];
  for (int64_t lane = blockIdx.x; lane < lanes; lane += gridDim.x) {
    uint64_t* gk = cand_key + lane * p;
    uint32_t* gi = cand_idx + lane * p;
    uint64_t* sk = shared ? smem : gk;
    uint32_t* si = shared ? reinterpret_cast<uint32_t*>(smem + p) : gi;
    for (int64_t t = threadIdx.x; t < p; t += blockDim.x) {
      if (t < m) {
        if (shared) {
          sk[t] = gk[t];
          si[t] = gi[t];
        }
      } else {
        sk[t] = 0;  // padding sorts after every real candidate (index kPadIndex)
        si[t] = kPadIndex;
      }
    }
    __syncthreads();
    for (int64_t size = 2; size <= p; size <<= 1) {
      for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
        for (int64_t t = threadIdx.x; t < p / 2; t += blockDim.x) {
          const int64_t i = 2 * stride * (t / stride) + (t % stride), j = i + stride;
          const bool ascending = (i & size) == 0;
          if (Before(sk[j], si[j], sk[i], si[i]) == ascending) {
            const uint64_t tk = sk[i];
            sk[i] = sk[j];
            sk[j] = tk;
            const uint32_t ti = si[i];
            si[i] = si[j];
            si[j] = ti;
          }
        }
        __syncthreads();
      }
    }
    if (shared) {
      for (int64_t t = threadIdx.x; t < m; t += blockDim.x) gi[t] = si[t];
    }
    __syncthreads();
  }
}

// Step 4: values and indices (same shape and strides) from the sorted candidate indices.
template <typename E>
__global__ void GatherKernel(const E* x, LaneIndexer<1> xl, const uint32_t* cand_idx, int64_t p,
                             LaneIndexer<1> ol, E* values, int64_t* indices, int64_t k,
                             int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t lane = e / k, i = e - lane * k;
    const int64_t idx = cand_idx[lane * p + i];
    int64_t xo[1], oo[1];
    xl.outer.Offsets(lane, xo);
    ol.outer.Offsets(lane, oo);
    const int64_t o = oo[0] + i * ol.lane_stride[0];
    values[o] = x[xo[0] + idx * xl.lane_stride[0]];
    indices[o] = idx;
  }
}

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <typename E>
absl::Status LaunchGather(const Tensor& x, const LaneIndexer<1>& xl, const Tensor& cand_idx,
                          int64_t p, const LaneIndexer<1>& ol, const Tensor& values,
                          const Tensor& indices, int64_t k) {
  const int64_t total = xl.lanes * k;
  return Launch(kKernel, GatherKernel<E>, GridFor(total, 256), 256, 0, x.raw_data(), xl,
                cand_idx.raw_data(), p, ol, values.raw_data(), indices.raw_data(), k, total);
}

}  // namespace

absl::Status TopK(const Tensor& x, int64_t k, int dim, bool largest, const Tensor& values,
                  const Tensor& indices) {
  DT_RETURN_IF_ERROR(UseDevice(values, kKernel));
  const int64_t n = x.size(dim);
  if (n >= static_cast<int64_t>(kPadIndex)) {
    return absl::UnimplementedError(absl::StrCat(kKernel, " on CUDA: dim ", dim, " of ",
                                                 x.Describe(), " has 2^32 or more elements"));
  }
  DT_ASSIGN_OR_RETURN(LaneIndexer<1> xl,
                      MakeLaneIndexer<1>(kKernel, x.shape(), dim, {IntSpan(x.strides())}));
  DT_ASSIGN_OR_RETURN(LaneIndexer<1> ol, MakeLaneIndexer<1>(kKernel, values.shape(), dim,
                                                            {IntSpan(values.strides())}));
  const int64_t lanes = xl.lanes, p = NextPow2(k);
  const int key_bits = x.dtype() == DType::kI64 ? 64 : 32;
  const uint64_t key_mask = key_bits == 64 ? ~0ull : 0xffffffffull;

  DT_ASSIGN_OR_RETURN(Tensor cand_key, Scratch(lanes * p * 8, values));
  DT_ASSIGN_OR_RETURN(Tensor cand_idx, Scratch(lanes * p * 4, values));
  auto* ck = static_cast<uint64_t*>(cand_key.raw_data());
  auto* ci = static_cast<uint32_t*>(cand_idx.raw_data());
  const int64_t total = lanes * n;
  Tensor keys;
  if (k < n) {
    DT_ASSIGN_OR_RETURN(keys, Scratch(total * 8, values));
  }
  DT_RETURN_IF_ERROR(DT_CUDA_DISPATCH_NUMERIC(x.dtype(), T, [&] {
    return Launch(kKernel, KeysKernel<T>, GridFor(total, 256), 256, 0, x.raw_data(), xl, largest,
                  key_mask, k < n ? keys.raw_data() : ck, k < n ? nullptr : ci, p, total);
  }));

  const unsigned lane_blocks = static_cast<unsigned>(std::min<int64_t>(lanes, 1 << 16));
  if (k < n) {
    const int threads = static_cast<int>(std::clamp<int64_t>(NextPow2(n), 32, 512));
    DT_RETURN_IF_ERROR(Launch(kKernel, SelectKernel, lane_blocks, threads, 0, keys.raw_data(),
                              lanes, n, k, key_bits, ck, ci, p));
  }
  if (k > 1) {
    const bool shared = p <= kSharedSortMax;
    const int threads = static_cast<int>(std::clamp<int64_t>(p / 2, 32, 512));
    const size_t smem = shared ? static_cast<size_t>(p) * 12 : 0;
    DT_RETURN_IF_ERROR(
        Launch(kKernel, SortKernel, lane_blocks, threads, smem, ck, ci, lanes, k, p, shared));
  }
  switch (DTypeSize(x.dtype())) {
    case 1: return LaunchGather<uint8_t>(x, xl, cand_idx, p, ol, values, indices, k);
    case 2: return LaunchGather<uint16_t>(x, xl, cand_idx, p, ol, values, indices, k);
    case 4: return LaunchGather<uint32_t>(x, xl, cand_idx, p, ol, values, indices, k);
    default: return LaunchGather<uint64_t>(x, xl, cand_idx, p, ol, values, indices, k);
  }
}

}  // namespace dt::ops::cuda
