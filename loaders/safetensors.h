#pragma once
// safetensors checkpoints: validated headers, zero-copy mmap views and rank-sliced reads.
//
// File layout (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N,
// N bytes of JSON {"name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [b, e]}, ...,
// "__metadata__": {"k": "v"}}, then the data section; offsets are relative to its start.
//
// Every file is hostile until validated. Open() reads the 8-byte length and the JSON with pread
// (nothing is mapped before the header passed), and rejects, naming the file and the tensor:
//
//   problem                                  message (abridged)
//   empty, shorter than 8 bytes              "is empty (0 bytes); expected a safetensors file",
//                                            "is 5 bytes, too short for a safetensors file"
//   header length > 100 MB or past EOF       "header length 9999 runs past the end of the file"
//   not JSON, not an object, duplicate name  "header is not valid JSON", "duplicate tensor 'w'"
//   unknown dtype                            "tensor 'w': unknown dtype 'F33'"
//   shape not a list of integers >= 0        "tensor 'w': shape [2, -1]: dims must be integers >= 0"
//   element count or byte size overflow      "tensor 'w': shape [...] has more than 2^64 elements",
//                                            "F64[...]: ... elements take more than 2^63 bytes"
//   offsets not [begin <= end], wrong size   "data_offsets [0, 10] hold 10 bytes, F32[3] needs 12"
//   out of bounds, overlaps, gaps            "tensor 'b': data_offsets [8, 20] overlap tensor 'a'"
//   a NaN or infinite f32/f16/bf16 element   "tensor 'w' F32[4, 6]: element [2, 3] is nan" (on read:
//                                            Note [Non-finite weights] in loaders/read_util.h)
//
// The data section must be covered exactly, tensor after tensor (the reference implementation's
// rule), so an accepted file is one `safe_open` accepts too. Known dtypes dtensor does not compute
// with (F64, I8, U16, F8_E4M3, ...) are listed and validated; reading one is Unimplemented naming
// the dtype. Supported: F32 F16 BF16 I64 I32 U8 BOOL.
//
// Reads. A tensor's piece is given per dim as ascending, disjoint index ranges (dtensor's
// DimRanges, i.e. DTensorSpec::Ranges() of this rank), and only those elements are touched:
//
//   piece                                    how                         bytes touched
//   whole tensor, or one run of rows (S(0))  one mmap view, zero copy    the piece
//                                            (a copy when unaligned or
//                                            ReadOptions::zero_copy off)
//   column ranges (S(1)), interleaved        one memcpy per contiguous   the piece
//   shards (_S(0,2)), nested shards          run of the file
//
// ReadStats counts what was viewed and copied, so tests and the Llama loader can prove that no
// rank ever reads a full sharded weight. The file stays mapped while any view of it lives.
// A file truncated after Open would fault on access (mmap semantics); checkpoints are immutable.
//
// Checkpoint (a model directory, an index over several files, or a GGUF file): loaders/checkpoint.h.
//
// Writers (WriteSafetensors, WriteCheckpoint, the streaming SafetensorsWriter):
// loaders/safetensors_writer.h. ReadOptions and ReadStats: loaders/read_options.h.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/storage.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/read_options.h"

namespace dt::loaders {

// The header's limit in the reference implementation (safetensors' MAX_HEADER_SIZE).
inline constexpr int64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype_name;     // as written: "BF16"
  std::optional<DType> dtype;  // nullopt for dtypes dtensor does not compute with
  Shape shape;
  int64_t begin = 0;  // byte offsets in the data section
  int64_t end = 0;
  int64_t nbytes() const { return end - begin; }
  // "BF16[4096, 4096]".
  std::string Describe() const;
};

// The dtensor dtype of a safetensors dtype name; Unimplemented for a known dtype dtensor does not
// support, InvalidArgument for an unknown name.
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name);
// "F32", "BF16", ... (the names the writer uses).
absl::string_view SafetensorsDTypeName(DType dtype);

class SafetensorsFile {
 public:
  // Opens and validates `path` (see the file comment); the data section is mapped read-only.
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  // Validates a header (the JSON text) for a data section of `data_size` bytes; `what` names the
  // file in messages. Entries come back sorted by offset. Open() uses it; exposed for tests.
  struct Header {
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
  };
  static absl::StatusOr<Header> ParseHeader(absl::string_view what, absl::string_view json,
                                            int64_t data_size);

  const std::string& path() const { return path_; }
  int64_t data_offset() const { return data_offset_; }  // 8 + header length
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;

  // The whole tensor (a view when possible).
  absl::StatusOr<Tensor> Read(absl::string_view name, const ReadOptions& options = {},
                              ReadStats* stats = nullptr) const;
  // The elements of tensor `name` at `ranges` (one RangeList per dim, ascending and disjoint), as
  // a contiguous tensor of the ranges' sizes. Only those elements are read.
  absl::StatusOr<Tensor> ReadRanges(absl::string_view name, const DimRanges& ranges,
                                    const ReadOptions& options = {},
                                    ReadStats* stats = nullptr) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int64_t data_offset_ = 0;
  Header header_;
  std::map<std::string, size_t, std::less<>> index_;
  Storage data_;  // the mapped data section
};

}  // namespace dt::loaders
