#include "dtensor/core/random.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "dtensor/core/quant.h"

namespace dt {

namespace {

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
struct Philox {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  static void Round(uint32_t c[4], uint32_t k[2]) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c[0] = hi1 ^ c[1] ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k[1];
    c[3] = lo0;
  }
  static void Generate(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0};
    uint32_t k[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    for (int i = 0; i < 10; ++i) {
      Round(c, k);
      k[0] += kW0;
      k[1] += kW1;
    }
    for (int i = 0; i < 4; ++i) out[i] = c[i];
  }
};

// 24 random bits -> [0, 1).
inline float ToUnit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace

float UniformAt(uint64_t seed, uint64_t index) {
  uint32_t r[4];
  Philox::Generate(seed, index, r);
  return ToUnit(r[0]);
}

float NormalAt(uint64_t seed, uint64_t index) {
  uint32_t r[4];
  Philox::Generate(seed, index, r);
  // Box-Muller; u1 in (0, 1] so the log is finite.
  const double u1 = (static_cast<double>(r[0] >> 8) + 1.0) / 16777216.0;
  const double u2 = static_cast<double>(r[1] >> 8) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

absl::StatusOr<Tensor> RandomSlice(IntSpan global_shape, absl::Span<const std::vector<int64_t>> indices,
                                   uint64_t seed, Distribution dist, DType dtype, Device device) {
  if (indices.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RandomSlice: ", indices.size(), " index lists for shape ",
                                                   ShapeToString(global_shape)));
  }
  Shape local(indices.size());
  for (size_t d = 0; d < indices.size(); ++d) {
    local[d] = static_cast<int64_t>(indices[d].size());
    for (int64_t i : indices[d]) {
      if (i < 0 || i >= global_shape[d]) {
        return absl::OutOfRangeError(absl::StrCat("RandomSlice: index ", i, " out of range for dim ", d,
                                                  " of ", ShapeToString(global_shape)));
      }
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor f, Tensor::Empty(local, DType::kF32));
  float* p = f.data<float>();
  const Shape gstr = ContiguousStrides(global_shape);
  const int64_t n = Numel(local);
  const int nd = static_cast<int>(local.size());
  std::vector<int64_t> pos(static_cast<size_t>(nd), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t flat = 0;
    for (int d = 0; d < nd; ++d) flat += indices[d][pos[d]] * gstr[d];
    p[e] = dist == Distribution::kUniform ? UniformAt(seed, static_cast<uint64_t>(flat))
                                          : NormalAt(seed, static_cast<uint64_t>(flat));
    for (int d = nd - 1; d >= 0; --d) {
      if (++pos[d] < local[d]) break;
      pos[d] = 0;
    }
  }
  DT_ASSIGN_OR_RETURN(Tensor t, f.To(dtype));
  return t.To(device);
}

namespace {

// Rand / Randn: the random slice that is the whole tensor (every index of every dim). Here rather
// than in tensor.cc, so that tensor stays below random (Note [Include graph]).
absl::StatusOr<Tensor> WholeRandom(IntSpan shape, uint64_t seed, Distribution dist, DType dtype, Device device,
                                   absl::string_view op) {
  std::vector<std::vector<int64_t>> idx(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": negative size in shape ", ShapeToString(shape)));
    }
    idx[d].resize(static_cast<size_t>(shape[d]));
    std::iota(idx[d].begin(), idx[d].end(), 0);
  }
  return RandomSlice(shape, idx, seed, dist, dtype, device);
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Rand(IntSpan shape, uint64_t seed, DType dtype, Device device) {
  return WholeRandom(shape, seed, Distribution::kUniform, dtype, device, "Rand");
}

absl::StatusOr<Tensor> Tensor::Randn(IntSpan shape, uint64_t seed, DType dtype, Device device) {
  return WholeRandom(shape, seed, Distribution::kNormal, dtype, device, "Randn");
}

absl::StatusOr<Tensor> RandomQuantized(DType dtype, IntSpan shape, uint64_t seed) {
  if (!IsQuantized(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RandomQuantized: ", DTypeName(dtype), " is not a quantized dtype"));
  }
  DT_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, dtype));
  uint8_t* p = static_cast<uint8_t*>(t.raw_data());
  // SplitMix64 over (seed, position): any slice is reproducible.
  auto bits = [seed](uint64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ULL + i + 0x632BE59BD9B4E019ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  const int64_t n = t.nbytes();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(bits(static_cast<uint64_t>(i)));
  // Scale fields: a random sign and a magnitude in [0.5, 1) times `size`.
  auto half = [&](uint8_t* at, float size) {
    const uint64_t r = bits(static_cast<uint64_t>(at - p) | (uint64_t{1} << 62));
    const float v = ((r & 1) ? -1.0f : 1.0f) * (0.5f + 0.5f * static_cast<float>((r >> 8) & 0xFFFF) / 65536.0f) * size;
    const uint16_t h = Float16::FromFloat(v);
    std::memcpy(at, &h, 2);
  };
  const int64_t bytes = DTypeBlockBytes(dtype);
  for (int64_t b = 0; b < n / bytes; ++b) {
    uint8_t* blk = p + b * bytes;
    switch (dtype) {
      case DType::kQ8_0: half(blk, 1.0f / 64); break;
      case DType::kQ4_0: case DType::kQ5_0: half(blk, 1.0f / 8); break;
      case DType::kQ4_1: case DType::kQ5_1: half(blk, 1.0f / 8); half(blk + 2, 1.0f); break;
      case DType::kQ4_K: case DType::kQ5_K: half(blk, 1.0f / 256); half(blk + 2, 1.0f / 64); break;
      case DType::kQ6_K: half(blk + 208, 1.0f / 2048); break;
      case DType::kQ2_K: half(blk + 80, 1.0f / 32); half(blk + 82, 1.0f / 64); break;
      case DType::kQ3_K: half(blk + 108, 1.0f / 128); break;
      case DType::kIQ4_NL: half(blk, 1.0f / 128); break;
      case DType::kIQ4_XS: half(blk, 1.0f / 4096); break;
      default: break;
    }
  }
  return t;
}

}  // namespace dt
