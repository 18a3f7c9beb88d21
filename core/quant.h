#pragma once
// Quantized dtypes: GGUF's block formats kept as they are in memory, and their reading as floats.
//
// Note [Quantized dtypes]
// A quantized tensor holds llama.cpp's blocks: every run of DTypeBlock(dtype) consecutive elements
// of a row is one block of DTypeBlockBytes(dtype) bytes that carries its own scales.
//
//   dtype  block  bytes  layout of one block (little-endian)              value
//   q8_0   32     34     f16 d, i8 q[32]                                  d*q
//   q4_0   32     18     f16 d, u8 q[16] (low nibbles: 0..15, high: 16..31) d*(q-8)
//   q4_1   32     20     f16 d, f16 m, u8 q[16]                           d*q + m
//   q5_0   32     22     f16 d, u8 qh[4] (5th bits), u8 q[16]             d*(q-16)
//   q5_1   32     24     f16 d, f16 m, u8 qh[4], u8 q[16]                 d*q + m
//   q4_k   256    144    f16 d, f16 dmin, u8 scales[12] (8 6-bit scale/min (d*sc)*q - dmin*m
//                        pairs), u8 q[128]                                per 32 values
//   q5_k   256    176    f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 q[128]   as q4_k, 5 bits
//   q6_k   256    210    u8 ql[128], u8 qh[64], i8 scales[16], f16 d      (d*sc)*(q-32) per 16
//   q2_k   256    84     u8 scales[16] (4-bit scale | 4-bit min << 4 per  (d*sc)*q - dmin*m
//                        16 values), u8 q[64] (2 bits), f16 d, f16 dmin   per 16
//   q3_k   256    110    u8 hmask[32] (3rd bits), u8 q[64] (2 bits),      (d*(sc-32))*(q-4)
//                        u8 scales[12] (16 6-bit scales), f16 d           per 16
//   iq4_nl 32     18     f16 d, u8 q[16] (as q4_0)                        d*kv[q]
//   iq4_xs 256    136    f16 d, u16 scales_h, u8 scales_l[4] (8 6-bit     (d*(sc-32))*kv[q]
//                        scales), u8 q[128]                               per 32
//
// kv is ggml's non-linear 4-bit codebook (kIq4Values below); the 2- and 3-bit types' values and
// the order of their elements inside a super-block follow ggml's dequantize_row_q2_K/_q3_K (quant.cc
// spells out which bits make each element).
//
// The tensor's shape stays in elements (a q4_1 weight [576, 1536] is 576 rows of 48 blocks, 552960
// bytes); its strides and storage offset are in elements too, and every row must be whole blocks
// with unit stride along the last dim, so that an element offset is always a whole number of
// blocks (DTypeBytes converts). Views: whole rows, and Narrow of the last dim by whole blocks.
//
// What understands them: Linear's weight (integer dot products against activations quantized to
// 16-bit integers, ops/local/cpu/qgemm.cc), the embedding table (rows dequantized on lookup),
// Cast/To and CopyFrom into an element dtype (dequantization, below) and copies between tensors of
// the same quantized dtype. Elementwise kernels and collectives refuse them, and a DTensor of a quantized
// dtype is never redistributed (Note [Quantized tensors stay put] in dtensor/planner.cc): it is
// sharded at load on block boundaries and stays so.
//
// Dequantization is ggml's reference (dequantize_row_*) in f32, in its order of operations, so the
// results are bit-identical to ggml's and to gguf-py's numpy versions (tests/loaders/gguf_test.cc
// checks every type against gguf.quants.dequantize); quant.cc is compiled with -ffp-contract=off
// (Note [Dequantization without FMA] in core/CMakeLists.txt).

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"

namespace dt {

class Tensor;  // core/tensor.h, which stays above this header (Note [Include graph])

// f16 bits at `p` (unaligned) as f32.
float LoadHalf(const void* p);

// The values of iq4_nl's and iq4_xs's 4-bit indices (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
// q3_k: scale i (0..15) of the twelve packed scale bytes at `s`, minus 32 (ggml's layout: the low
// four bits of scale i are the low nibble of s[i] for i < 8, the high nibble of s[i - 8] after;
// its top two bits are bits 2 (i / 4), 2 (i / 4) + 1 of s[8 + i % 4]).
inline int Q3KScale(const uint8_t* s, int i) {
  const int low = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | high << 4) - 32;
}
// iq4_xs: the scale of 32-element sub-block i (0..7), minus 32, from the block's scales_h (a
// little-endian u16 at byte 2) and scales_l (bytes 4..7).
inline int Iq4XsScale(const uint8_t* b, int i) {
  const int high = ((b[2] | b[3] << 8) >> (2 * i)) & 3;
  const int low = (b[4 + i / 2] >> (4 * (i % 2))) & 0xF;
  return (low | high << 4) - 32;
}

// Dequantizes `n` elements (a whole number of blocks) of quantized `dtype` at `src` into `out`.
void DequantizeBlocks(DType dtype, const void* src, int64_t n, float* out);

// Note [Non-finite scales]
// Every value of a block is its integer times an f16 scale (d; plus dmin or m where the type has
// one, table above), so one NaN or infinite scale makes the whole block NaN or infinite: a GEMM
// against it spreads NaN into every output it touches, and greedy decoding then prints token 0
// or 7 forever without an error. Such a block cannot come from a quantizer (it divides finite
// weights by a finite maximum), so the GGUF reader refuses it as it reads the block
// (loaders/gguf.cc, one 16-bit test per scale). A finite scale is never refused: its size says
// nothing that holds for every model, so bytes of another type read under a wrong label are
// caught only where they put a NaN or an infinity into a scale (docs/limits.md).
struct NonFiniteScale {
  int64_t block = 0;          // among the blocks given
  const char* field = "";     // "d", "dmin" or "m"
  float value = 0;            // NaN or +-inf
};
// The first of `n_blocks` blocks of quantized `dtype` at `src` with a non-finite scale, or nullopt.
std::optional<NonFiniteScale> FindNonFiniteScale(DType dtype, const void* src, int64_t n_blocks);

// OK when a tensor of quantized `dtype` can have `shape`: at least one dim, the last a whole
// number of blocks ("q4_k [4, 100]: rows of 100 elements are not whole 256-element blocks").
absl::Status CheckQuantizedShape(DType dtype, IntSpan shape);

// A contiguous tensor of quantized `dtype` and `shape` (last dim whole blocks) whose blocks are
// random (counter-based from `seed`, like Tensor::Rand): every quant byte uniform, every f16 scale
// of a random sign and a magnitude that keeps the values of order one (random bytes there would
// give NaNs and 1e4s). For tests and benchmarks of the quantized kernels. Defined in
// core/random.cc, beside Tensor::Rand.
absl::StatusOr<Tensor> RandomQuantized(DType dtype, IntSpan shape, uint64_t seed);

}  // namespace dt
