#pragma once
// GGML tensor types as GGUF stores them, and their dequantization to f32.
//
//   type   block  bytes  layout of one block (little-endian)              value
//   F32    1      4      f32                                              x
//   F16    1      2      f16                                              x
//   BF16   1      2      bf16                                             x
//   Q8_0   32     34     f16 d, i8 q[32]                                  d*q
//   Q4_0   32     18     f16 d, u8 q[16] (low nibbles: 0..15, high: 16..31) d*(q-8)
//   Q4_1   32     20     f16 d, f16 m, u8 q[16]                           d*q + m
//   Q5_0   32     22     f16 d, u8 qh[4] (5th bits), u8 q[16]             d*(q-16)
//   Q5_1   32     24     f16 d, f16 m, u8 qh[4], u8 q[16]                 d*q + m
//   Q4_K   256    144    f16 d, f16 dmin, u8 scales[12] (8 6-bit scale/min (d*sc)*q - dmin*m
//                        pairs), u8 q[128]                                per 32 values
//   Q5_K   256    176    f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 q[128]   as Q4_K, 5 bits
//   Q6_K   256    210    u8 ql[128], u8 qh[64], i8 scales[16], f16 d      (d*sc)*(q-32)
//
// The arithmetic is ggml's reference dequantization (dequantize_row_*) in f32, in its order of
// operations, so the results are bit-identical to ggml's and to gguf-py's numpy versions
// (tests/loaders/gguf_test.cc checks every type against gguf.quants.dequantize); the file is
// compiled with -ffp-contract=off (Note [Dequantization without FMA] in loaders/CMakeLists.txt).

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dt::loaders {

struct GgmlType {
  uint32_t id = 0;
  const char* name = "";
  int64_t block = 1;        // elements per block
  int64_t block_bytes = 0;  // bytes per block
  bool dequantizable = false;  // false: a known type dtensor does not read
};

// The type with GGML id `id`, or nullptr for an id ggml does not define.
const GgmlType* FindGgmlType(uint32_t id);
// "F32 F16 BF16 Q8_0 ..." (what dtensor dequantizes).
std::string DequantizableGgmlTypes();

// Dequantizes `blocks` consecutive blocks of `type` at `src` into blocks * type.block floats.
void Dequantize(const GgmlType& type, const uint8_t* src, int64_t blocks, float* out);

}  // namespace dt::loaders
