#pragma once
// GGML tensor types as GGUF stores them, the dtensor dtype each one is read as, and their
// dequantization to f32.
//
//   type   block  bytes  dtype held in memory (when kept quantized)
//   F32    1      4      f32
//   F16    1      2      f16
//   BF16   1      2      bf16
//   Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS
//                         q8_0 ... iq4_xs: the block formats of Note [Quantized dtypes]
//                         (core/quant.h), byte for byte as in the file
//
// Every other type ggml defines (Q8_1, Q8_K, IQ1_*, IQ2_*, IQ3_*, TQ*, the integer types) is known
// (its block size is validated) but not read: a read of one names the file, the tensor, its type
// and DequantizableGgmlTypes(). Dequantization is core/quant.h's (ggml's reference, bit-identical).

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"

namespace dt::loaders {

struct GgmlType {
  uint32_t id = 0;
  const char* name = "";
  int64_t block = 1;        // elements per block
  int64_t block_bytes = 0;  // bytes per block
  std::optional<DType> dtype;  // what dtensor holds it as; nullopt: a known type dtensor does not read
  bool dequantizable() const { return dtype.has_value(); }
  bool quantized() const { return dtype && IsQuantized(*dtype); }
};

// The type with GGML id `id`, or nullptr for an id ggml does not define.
const GgmlType* FindGgmlType(uint32_t id);
// "F32, F16, Q4_0, ..." (what dtensor reads, in ggml's id order).
std::string DequantizableGgmlTypes();

// Dequantizes `blocks` consecutive blocks of `type` at `src` into blocks * type.block floats.
void Dequantize(const GgmlType& type, const uint8_t* src, int64_t blocks, float* out);

}  // namespace dt::loaders
