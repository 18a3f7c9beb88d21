#include "dtensor/loaders/gguf_quants.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "dtensor/core/quant.h"

namespace dt::loaders {
namespace {

constexpr std::nullopt_t kNo = std::nullopt;

// Every type id of ggml's ggml_type enum (ids 4 and 5, the removed Q4_2/Q4_3, stay unknown).
const GgmlType kTypes[] = {
    {0, "F32", 1, 4, DType::kF32},            {1, "F16", 1, 2, DType::kF16},
    {2, "Q4_0", 32, 18, DType::kQ4_0},        {3, "Q4_1", 32, 20, DType::kQ4_1},
    {6, "Q5_0", 32, 22, DType::kQ5_0},        {7, "Q5_1", 32, 24, DType::kQ5_1},
    {8, "Q8_0", 32, 34, DType::kQ8_0},        {9, "Q8_1", 32, 36, kNo},
    {10, "Q2_K", 256, 84, DType::kQ2_K},      {11, "Q3_K", 256, 110, DType::kQ3_K},
    {12, "Q4_K", 256, 144, DType::kQ4_K},     {13, "Q5_K", 256, 176, DType::kQ5_K},
    {14, "Q6_K", 256, 210, DType::kQ6_K},     {15, "Q8_K", 256, 292, kNo},
    {16, "IQ2_XXS", 256, 66, kNo},            {17, "IQ2_XS", 256, 74, kNo},
    {18, "IQ3_XXS", 256, 98, kNo},            {19, "IQ1_S", 256, 50, kNo},
    {20, "IQ4_NL", 32, 18, DType::kIQ4_NL},   {21, "IQ3_S", 256, 110, kNo},
    {22, "IQ2_S", 256, 82, kNo},              {23, "IQ4_XS", 256, 136, DType::kIQ4_XS},
    {24, "I8", 1, 1, kNo},                    {25, "I16", 1, 2, kNo},
    {26, "I32", 1, 4, kNo},                   {27, "I64", 1, 8, kNo},
    {28, "F64", 1, 8, kNo},                   {29, "IQ1_M", 256, 56, kNo},
    {30, "BF16", 1, 2, DType::kBF16},         {34, "TQ1_0", 256, 54, kNo},
    {35, "TQ2_0", 256, 66, kNo},
};

}  // namespace

const GgmlType* FindGgmlType(uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::string DequantizableGgmlTypes() {
  std::string out;
  for (const GgmlType& t : kTypes) {
    if (t.dequantizable()) absl::StrAppend(&out, out.empty() ? "" : ", ", t.name);
  }
  return out;
}

void Dequantize(const GgmlType& type, const uint8_t* src, int64_t blocks, float* out) {
  switch (*type.dtype) {
    case DType::kF32: std::memcpy(out, src, static_cast<size_t>(blocks) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < blocks; ++i) out[i] = LoadHalf(src + 2 * i);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < blocks; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = BitsFloat(uint32_t{h} << 16);
      }
      return;
    default: DequantizeBlocks(*type.dtype, src, blocks * type.block, out);
  }
}

}  // namespace dt::loaders
