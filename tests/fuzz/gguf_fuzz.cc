// A fuzz target for the GGUF reader (loaders/gguf.h): any bytes give a GgufFile or a clean error,
// an accepted file gives a decoder config or a clean error (loaders/gguf_llama.h), a tokenizer
// or a clean error (loaders/tokenizer.h: byte-level or SentencePiece BPE) that encodes and
// decodes a fixed text, and reads every tensor it lists (whole, a sliced piece, and that piece
// kept as quantized blocks) without faulting.
// Built as `gguf_fuzz` (libFuzzer, the fuzz preset) and `gguf_fuzz_replay` (any compiler): see
// tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>

#include "dtensor/core/quant.h"
#include "dtensor/core/shape.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/gguf_llama.h"
#include "dtensor/loaders/tokenizer.h"
#include "dtensor/tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dt::loaders::GgufFile::Open(dt::fuzz::WriteInput(data, size, "gguf"));
  if (!f.ok()) return 0;
  for (const auto& [key, value] : (*f)->metadata()) (void)value.ToString();
  (void)dt::loaders::DecoderConfigFromGguf(**f);
  if (auto tok = dt::loaders::Tokenizer::FromGguf(**f); tok.ok()) {
    auto ids = (*tok)->Encode("Hi  <start_of_turn>w\xc3\xb6rld 12\t\xe2\x98\x83 \xe2\x96\x81", true);
    if (ids.ok()) (void)(*tok)->Decode(*ids);
  }
  for (const dt::loaders::GgufTensorInfo& t : (*f)->tensors()) {
    if (!t.type->dequantizable() || dt::Numel(t.shape) > (1 << 20)) continue;
    (void)(*f)->ReadRanges(t.name, dt::FullRanges(t.shape));
    // The second half of the rows: a piece that starts inside the tensor.
    dt::DimRanges half = dt::FullRanges(t.shape);
    if (!t.shape.empty() && t.shape[0] > 1) half[0] = {{t.shape[0] / 2, t.shape[0]}};
    (void)(*f)->ReadRanges(t.name, half);
    // The same piece kept as its blocks (Note [Quantized dtypes]), then dequantized from them.
    if (dt::IsQuantized(*t.type->dtype)) {
      dt::loaders::ReadOptions blocks;
      blocks.dtype = *t.type->dtype;
      auto kept = (*f)->ReadRanges(t.name, half, blocks);
      if (kept.ok()) (void)kept->To(dt::DType::kF32);
    }
  }
  return 0;
}
