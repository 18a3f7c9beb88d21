#pragma once
// What a checkpoint read is asked (ReadOptions) and what it cost (ReadStats): the same for every
// reader (safetensors, GGUF, Checkpoint over either).

#include <cstdint>
#include <optional>

#include "dtensor/core/dtype.h"

namespace dt::loaders {

// What reads cost. Sums over every read that was given the same ReadStats.
struct ReadStats {
  int64_t tensors = 0;          // pieces returned
  int64_t bytes_viewed = 0;     // zero-copy views of the mapped file
  int64_t bytes_copied = 0;     // memcpy'd out of the mapped file
  int64_t bytes_converted = 0;  // produced by dtype conversion (ReadOptions::dtype)
  int64_t max_piece_bytes = 0;  // the largest piece read from a file (bytes_viewed or copied)
  // What the returned pieces hold, and the most held at once counting a conversion's source copy
  // (freed once converted): the loader's peak memory.
  int64_t resident_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t bytes_read() const { return bytes_viewed + bytes_copied; }
};

struct ReadOptions {
  // Return mmap views for contiguous, aligned pieces (read-only tensors); false: always copy.
  bool zero_copy = true;
  // Convert to this dtype (a fresh tensor); nullopt keeps the file's dtype.
  std::optional<DType> dtype;
};

}  // namespace dt::loaders
