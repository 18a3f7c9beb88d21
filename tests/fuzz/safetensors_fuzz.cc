// A fuzz target for the safetensors reader (loaders/safetensors.h): any bytes give a file or a
// clean error, and an accepted file reads every tensor it lists without faulting: whole (a view
// when aligned), copied and converted to f32, and a strided piece (every other element of the last
// dim), which goes through the element-wise copy. Built as `safetensors_fuzz` (libFuzzer, the fuzz
// preset) and `safetensors_fuzz_replay` (any compiler): see tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>

#include "dtensor/core/shape.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dt::loaders::SafetensorsFile::Open(dt::fuzz::WriteInput(data, size, "safetensors"));
  if (!f.ok()) return 0;
  dt::loaders::ReadOptions copy;
  copy.zero_copy = false;
  copy.dtype = dt::DType::kF32;
  for (const dt::loaders::TensorInfo& t : (*f)->tensors()) {
    if (dt::Numel(t.shape) > (1 << 20)) continue;
    (void)(*f)->Read(t.name);
    (void)(*f)->Read(t.name, copy);
    // Not for empty tensors: a [0, 10^6] tensor would make half a million ranges of nothing.
    if (t.shape.empty() || t.shape.back() < 2 || dt::Numel(t.shape) == 0) continue;
    dt::DimRanges strided = dt::FullRanges(t.shape);
    strided.back().clear();
    for (int64_t i = 0; i < t.shape.back(); i += 2) strided.back().push_back({i, i + 1});
    (void)(*f)->ReadRanges(t.name, strided, copy);
  }
  return 0;
}
