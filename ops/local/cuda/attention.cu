// CUDA scaled dot-product attention (single pass, online softmax in f32, O(D) memory per row).
//
// Note [CUDA attention]
// Work is split by (batch, kv head g, tile of W rows, key split). The rows of a kv head are the
// pairs (query i, query head h of the group), ordered i-major, so one block serves all the query
// heads that share K/V (GQA) and, in decode (Sq = 1), a whole group at once. Each of the W warps
// owns one row. The block walks its key range in chunks of 32 keys staged in shared memory as f32:
//   - lane j of a warp computes the score of key j of the chunk (a length-D dot product against
//     the row's query, which sits in shared memory), masked to -inf when not visible;
//   - the warp updates the row's running max m and sum l (online softmax) and adds p·V into the
//     row's f32 accumulator [Dv] in shared memory (lane owns dims lane, lane + 32, ...).
// Rows see keys j < min(kv_length, q_offset + i + 1) (causal) or j < kv_length; chunks past a
// row's limit are skipped. A row without a visible key keeps l = 0 and is written as zeros.
// When there are too few blocks to fill the GPU (decode: fewer than four per SM), the keys are
// split across blocks (flash-decoding): each split writes (acc, m, l) to f32 scratch and a second
// kernel combines them with the usual log-sum-exp rescaling. Scores are dot·scale as in the CPU
// reference.

#include <cmath>
#include <utility>

#include "dtensor/ops/local/cuda/cuda_util.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cuda {

namespace {

constexpr absl::string_view kKernel = "Attention";
constexpr int kChunk = 32;  // keys per shared-memory chunk (one per lane)
constexpr int kMaxWarps = 8;

// A [B, H, S, X] operand: pointer and element strides.
template <typename T>
struct Operand4 {
  const T* p;
  int64_t s0, s1, s2, s3;
  __device__ __forceinline__ float At(int64_t b, int64_t h, int64_t s, int64_t x) const {
    return Load(p[b * s0 + h * s1 + s * s2 + x * s3]);
  }
};

template <typename T>
Operand4<T> Operand4Of(const Tensor& t) {
  return {static_cast<const T*>(t.raw_data()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Rows c0 .. c0 + rows - 1 of t[b, h] (each `width` wide) into dst (row stride ld) as f32, by the
// whole block; with `vec` through 16-byte loads (VectorLanes of t along its last dim).
template <typename T>
__device__ __forceinline__ void LoadRows(const Operand4<T>& t, int64_t b, int64_t h, int64_t c0,
                                         int64_t rows, int64_t width, bool vec, float* dst,
                                         int64_t ld) {
  const T* base = t.p + b * t.s0 + h * t.s1 + c0 * t.s2;
  if (vec) {
    constexpr int kV = kVec<T>;
    const int64_t per_row = width / kV;
    for (int64_t e = threadIdx.x; e < rows * per_row; e += blockDim.x) {
      const int64_t j = e / per_row, x = (e - j * per_row) * kV;
      float v[kV];
      LoadVec(base + j * t.s2 + x, v);
#pragma unroll
      for (int u = 0; u < kV; ++u) dst[j * ld + x + u] = v[u];
    }
  } else {
    for (int64_t e = threadIdx.x; e < rows * width; e += blockDim.x) {
      const int64_t j = e / width, x = e - j * width;
      dst[j * ld + x] = Load(base[j * t.s2 + x * t.s3]);
    }
  }
}

struct Shape4 {
  int64_t batch, hq, hkv, sq, d, dv;
  int64_t group;      // Hq / Hkv
  int64_t rows;       // rows per (batch, kv head): group * Sq
  int64_t tiles;      // ceil(rows / warps)
  int64_t split_len;  // keys per split (a multiple of kChunk)
  int nsplit;
  bool vec_k, vec_v;  // K / V rows can be read with 16-byte loads
};

size_t SharedBytes(int warps, int64_t d, int64_t dv) {
  return sizeof(float) * static_cast<size_t>(warps * d + kChunk * (d + 1) + kChunk * dv +
                                             warps * kChunk + warps * dv);
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Grid: x = tile + tiles * (b * Hkv + g), y = split. Block: 32 * warps threads.
// With one split, writes out; otherwise writes partials [B*Hq*Sq, nsplit, Dv + 2] = (acc, m, l).
template <typename T>
__global__ void AttentionKernel(Operand4<T> q, Operand4<T> k, Operand4<T> v, AttentionParams p,
                                Shape4 s, T* out, float* partial) {
  extern __shared__ float smem[];
  const int warps = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t d = s.d, dv = s.dv;
  float* qs = smem;                   // [warps][d]
  float* ks = qs + warps * d;         // [kChunk][d + 1]
  float* vs = ks + kChunk * (d + 1);  // [kChunk][dv]
  float* ps = vs + kChunk * dv;       // [warps][kChunk]
  float* acc = ps + warps * kChunk;   // [warps][dv]
  float* my_q = qs + w * d;
  float* my_p = ps + w * kChunk;
  float* my_acc = acc + w * dv;

  const int64_t tile = blockIdx.x % s.tiles, bg = blockIdx.x / s.tiles;
  const int64_t b = bg / s.hkv, g = bg % s.hkv;
  const int split = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(split) * s.split_len;
  const int64_t end = min(p.kv_length, begin + s.split_len);

  // Visible keys [0, limit) of row t.
  auto limit_of = [&](int64_t t) -> int64_t {
    if (!p.causal) return p.kv_length;
    const int64_t i = t / s.group;
    return max(int64_t{0}, min(p.kv_length, p.q_offset + i + 1));
  };
  const int64_t t = tile * warps + w;
  const bool valid = t < s.rows;
  const int64_t i = t / s.group, h = g * s.group + t % s.group;
  const int64_t row_end = valid ? min(limit_of(t), end) : 0;
  const int64_t last_row = min(tile * warps + warps, s.rows) - 1;
  const int64_t block_end = min(limit_of(last_row), end);  // rows are i-major: the last sees most

  if (valid) {
    for (int64_t x = lane; x < d; x += 32) my_q[x] = q.At(b, h, i, x);
  }
  for (int64_t x = lane; x < dv; x += 32) my_acc[x] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int64_t c0 = begin; c0 < block_end; c0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed (and the queries are stored)
    const int64_t nk = min(static_cast<int64_t>(kChunk), block_end - c0);
    LoadRows(k, b, g, c0, nk, d, s.vec_k, ks, d + 1);
    LoadRows(v, b, g, c0, nk, dv, s.vec_v, vs, dv);
    __syncthreads();
    if (c0 >= row_end) continue;  // warp-uniform: nothing visible in this chunk for this row
    const int64_t nvis = min(static_cast<int64_t>(kChunk), row_end - c0);
    float score = -INFINITY;
    if (lane < nvis) {
      const float* kr = ks + lane * (d + 1);
      float dot = 0.0f;
      for (int64_t x = 0; x < d; ++x) dot += my_q[x] * kr[x];
      score = dot * p.scale;
    }
    const float m_new = fmaxf(m, WarpMax(score));
    const float pj = lane < nvis ? expf(score - m_new) : 0.0f;
    const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * corr + WarpSum(pj);
    m = m_new;
    my_p[lane] = pj;
    __syncwarp();
    for (int64_t x = lane; x < dv; x += 32) {
      float a = my_acc[x] * corr;
      for (int64_t j = 0; j < nvis; ++j) a += my_p[j] * vs[j * dv + x];
      my_acc[x] = a;
    }
    __syncwarp();
  }
  if (!valid) return;
  const int64_t row = (b * s.hq + h) * s.sq + i;
  if (partial == nullptr) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t x = lane; x < dv; x += 32)
      out[row * dv + x] = Store<T>(l > 0.0f ? my_acc[x] * inv : 0.0f);
  } else {
    float* dst = partial + (row * s.nsplit + split) * (dv + 2);
    for (int64_t x = lane; x < dv; x += 32) dst[x] = my_acc[x];
    if (lane == 0) {
      dst[dv] = m;
      dst[dv + 1] = l;
    }
  }
}

// out[row, x] from the splits' partials (log-sum-exp rescaling); rows without a visible key are 0.
template <typename T>
__global__ void CombineKernel(const float* partial, int nsplit, int64_t dv, T* out, int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / dv, x = e - row * dv;
    const float* base = partial + row * nsplit * (dv + 2);
    float mx = -INFINITY;
    for (int sp = 0; sp < nsplit; ++sp) mx = fmaxf(mx, base[sp * (dv + 2) + dv]);
    float l = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int sp = 0; sp < nsplit; ++sp) {
        const float* part = base + sp * (dv + 2);
        const float ms = part[dv];
        if (ms == -INFINITY) continue;
        const float f = expf(ms - mx);
        l += part[dv + 1] * f;
        o += part[x] * f;
      }
    }
    out[e] = Store<T>(l > 0.0f ? o / l : 0.0f);
  }
}

template <typename T>
absl::Status RunAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionParams& params, const Tensor& out) {
  Shape4 s;
  s.batch = q.size(0);
  s.hq = q.size(1);
  s.sq = q.size(2);
  s.d = q.size(3);
  s.hkv = k.size(1);
  s.dv = v.size(3);
  s.group = s.hq / s.hkv;
  s.rows = s.group * s.sq;
  s.vec_k = VectorLanes(k, 3);
  s.vec_v = VectorLanes(v, 3);

  // Warps per block: up to kMaxWarps, no more than the rows of a kv head, within shared memory.
  DT_ASSIGN_OR_RETURN(const int smem_optin,
                      DeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, out, kKernel));
  int warps = static_cast<int>(std::min<int64_t>(kMaxWarps, s.rows));
  while (warps > 1 && SharedBytes(warps, s.d, s.dv) > static_cast<size_t>(smem_optin)) --warps;
  const size_t smem = SharedBytes(warps, s.d, s.dv);
  if (smem > static_cast<size_t>(smem_optin)) {
    return absl::UnimplementedError(
        absl::StrCat(kKernel, " on CUDA: head dims D=", s.d, ", Dv=", s.dv, " need ", smem,
                     " bytes of shared memory per block, the device allows ", smem_optin));
  }
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        AttentionKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return CudaError(e, kKernel);
  }
  s.tiles = (s.rows + warps - 1) / warps;
  const int64_t blocks = s.tiles * s.batch * s.hkv;

  // Key splits when the blocks would not give every SM four (Note [CUDA attention]); each split
  // keeps at least 4 chunks.
  DT_ASSIGN_OR_RETURN(const int sms, DeviceAttribute(cudaDevAttrMultiProcessorCount, out, kKernel));
  const int64_t chunks = (params.kv_length + kChunk - 1) / kChunk;
  const int64_t want_blocks = 4 * static_cast<int64_t>(sms);
  int64_t nsplit = 1;
  if (blocks < want_blocks) {
    nsplit =
        std::max<int64_t>(1, std::min<int64_t>((want_blocks + blocks - 1) / blocks, chunks / 4));
  }
  nsplit = std::min<int64_t>(nsplit, 65535);
  const int64_t chunks_per_split = std::max<int64_t>(1, (chunks + nsplit - 1) / nsplit);
  s.split_len = chunks_per_split * kChunk;
  s.nsplit =
      static_cast<int>(std::max<int64_t>(1, (params.kv_length + s.split_len - 1) / s.split_len));
  if (blocks > 2147483647) {
    return absl::UnimplementedError(
        absl::StrCat(kKernel, " on CUDA: too many blocks (", blocks, ")"));
  }

  Tensor partial;
  if (s.nsplit > 1) {
    DT_ASSIGN_OR_RETURN(partial, Scratch(static_cast<int64_t>(sizeof(float)) * s.batch * s.hq *
                                             s.sq * s.nsplit * (s.dv + 2),
                                         out));
  }
  T* po = static_cast<T*>(out.raw_data());
  float* pp = s.nsplit > 1 ? static_cast<float*>(partial.raw_data()) : nullptr;
  DT_RETURN_IF_ERROR(Launch(kKernel, AttentionKernel<T>,
                            dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(s.nsplit)),
                            dim3(32 * warps), smem, Operand4Of<T>(q), Operand4Of<T>(k),
                            Operand4Of<T>(v), params, s, po, pp));
  if (s.nsplit == 1) return absl::OkStatus();
  const int64_t total = out.numel();
  return Launch(kKernel, CombineKernel<T>, GridFor(total, 256), 256, 0, pp, s.nsplit, s.dv, po,
                total);
}

}  // namespace

absl::Status Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& params, const Tensor& out) {
  // Note [Attention options] in ops/local/cpu/attention.cc: the CPU kernel's, not written here.
  for (const auto& [set, name] : {std::pair<bool, const char*>{params.softcap > 0, "softcap"},
                                  {params.window > 0, "window"},
                                  {params.sinks != nullptr, "sinks"},
                                  {params.mask != nullptr, "mask"}}) {
    if (set) {
      return absl::UnimplementedError(
          absl::StrCat(kKernel, " on CUDA: the attention option ", name, " is CPU only"));
    }
  }
  DT_RETURN_IF_ERROR(UseDevice(out, kKernel));
  auto run = [&](const Tensor& o) {
    return DT_CUDA_DISPATCH_FLOAT(q.dtype(), T, [&] { return RunAttention<T>(q, k, v, params, o); });
  };
  if (out.is_contiguous()) return run(out);
  // The kernels write rows of a contiguous output; another layout (the kernel contract allows any
  // with a unit stride along Dv) is written through a contiguous one.
  DT_ASSIGN_OR_RETURN(Tensor dense, Tensor::Empty(out.shape(), out.dtype(), out.device()));
  DT_RETURN_IF_ERROR(run(dense));
  return out.CopyFrom(dense);
}

}  // namespace dt::ops::cuda
