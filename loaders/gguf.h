#pragma once
// GGUF files (llama.cpp's checkpoint format, versions 2 and 3): validated header, metadata,
// tensor infos, and rank-sliced reads dequantized to the compute dtype.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; metadata as
// (string key, u32 value type, value); tensor infos as (string name, u32 dims, u64 ne[dims],
// u32 ggml type, u64 offset); padding to `general.alignment` (default 32); the data section.
// A string is u64 length + bytes; an array is u32 element type + u64 count + elements (arrays of
// arrays allowed). ne[0] is the fastest-varying dim: dtensor's shape is ne reversed, so a linear
// weight [out, in] (PyTorch's layout) is stored as ne = [in, out], rows of `in` elements, each row
// a whole number of quant blocks (loaders/gguf_quants.h).
//
// Every file is hostile until validated. Open() reads the header with pread (nothing is mapped
// until it passed) and rejects, naming the file and the field:
//
//   problem                                   message (abridged)
//   empty, or shorter than the magic          "is empty (0 bytes); expected a GGUF file"
//   not "GGUF", version not 2 or 3            "is not a GGUF file (magic ...)", "version 1 ..."
//   a count, length or dim past the file      "metadata 'k': string length 9999 runs past the end"
//   (checked before anything is allocated)
//   unknown value type, arrays nested > 8     "metadata 'k': unknown value type 13"
//   duplicate key or tensor name              "duplicate metadata key 'k'"
//   more keys or nested arrays than 65536     "metadata count 70000: more than the 65536 keys"
//   dims > 4, a dim < 1, too many elements    "tensor 'w': 5 dims (at most 4)", "tensor 'w': ne
//                                             [1073741824, 536870912] hold 576460752303423488
//                                             elements, more than a tensor may have (...)"
//   unknown ggml type                         "tensor 'w': unknown ggml type 99"
//   row not a whole number of blocks          "tensor 'w': Q4_K rows of 100 elements are not whole 256-element blocks"
//   offset past the file or unaligned, data   "tensor 'w': offset 9223372036854775808 is past the
//   past the data section, overlapping data   end of the file", "tensor 'w': data [a, b) overlaps
//                                             tensor 'v'"
//   non-finite weight (on read)               "tensor 'w' Q8_0[4, 512]: the block of elements
//                                             [2, 96:128] has scale d = nan" (Note [Non-finite
//                                             weights] in loaders/read_util.h)
//   general.alignment not a power of 2        "general.alignment 3 must be a power of two"
//
// Reads (ReadRanges): the ranges are dtensor's DimRanges as for safetensors. Only the quant blocks
// that hold a wanted element are read and dequantized — a colwise shard (rows) reads its rows, a
// rowwise shard (columns) reads the blocks of its columns in every row — and ReadStats counts the
// bytes of those blocks (bytes_copied) and the dequantized output (bytes_converted). Types dtensor
// does not dequantize (IQ*, Q2_K, Q3_K, ...) are listed and validated; reading one is
// Unimplemented naming the type.
//
// A read whose ReadOptions::dtype is the tensor's own quantized dtype (q4_1 for a Q4_1 tensor;
// Note [Quantized dtypes] in core/quant.h) copies the blocks as they are instead: every column
// range must then start and end on a block boundary ("columns [0, 144) are not whole 32-element
// blocks"), and another quantized dtype is refused (nothing is re-quantized).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/storage.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/gguf_quants.h"
#include "dtensor/loaders/read_options.h"
#include "dtensor/loaders/read_util.h"

namespace dt::loaders {

struct GgufValue;

// An array's elements, held compactly (Note [Compact metadata] in gguf.cc): numbers and bools as
// the file's bytes, strings back to back in one buffer, so that a file's metadata takes about its
// bytes in memory; only nested arrays are values of their own.
struct GgufArray {
  uint32_t element_type = 0;  // a GgufValue::Type
  int64_t size = 0;           // elements, kept or not
  // False for a tokenizer.* array of a file opened without GgufOpenOptions::tokenizer_arrays:
  // its type and size are known, its elements were validated and dropped.
  bool kept = true;
  std::string bytes;              // numbers, bools: `size` values as in the file (little-endian);
                                  // strings: their bytes, one after the other
  std::vector<int64_t> ends;      // strings: where each one ends in `bytes`
  std::vector<GgufValue> arrays;  // arrays of arrays: the elements
  // Element i (0 <= i < size of a kept array) as a value.
  GgufValue Element(int64_t i) const;
  // String element i (0 <= i < size of a kept array of strings).
  absl::string_view StringAt(int64_t i) const;
};

// A metadata value. Integers of every width are held as int64 or uint64 (by signedness), floats
// as double; `type` keeps the type written (GGUF's value type ids).
struct GgufValue {
  enum Type : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };
  Type type = kU8;
  std::variant<int64_t, uint64_t, double, bool, std::string, GgufArray> value;

  // An array's length (kept or not); 0 for a value that is not an array.
  int64_t ArrayLength() const;

  // An integer value (any width) that fits int64; nullopt otherwise.
  std::optional<int64_t> AsInt() const;
  // A float or integer value.
  std::optional<double> AsDouble() const;
  const std::string* AsString() const;
  const GgufArray* AsArray() const;
  // Short text: 42, "text", [1, 2, ...(n)].
  std::string ToString() const;
};

// "u32", "string", "array" ...; "type 13" for an unknown id.
std::string GgufTypeName(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  const GgmlType* type = nullptr;
  Shape shape;         // dtensor's order: ne reversed
  int64_t offset = 0;  // in the data section
  int64_t nbytes = 0;
  // "Q4_1[1536, 576]".
  std::string Describe() const;
};

struct GgufOpenOptions {
  // Keep the elements of the tokenizer.* arrays (the vocabulary, token types and merges: 1.8 MB
  // for SmolLM2's 49152 tokens). A reader of weights only (Checkpoint) does not, so that a rank's
  // memory while loading is its weights: those arrays keep their type and length
  // (GgufArray::kept) and asking for their elements is FailedPrecondition.
  bool tokenizer_arrays = true;
};

class GgufFile {
 public:
  // Header limits: dims of a tensor, nesting of arrays, and the metadata held as GgufValues of
  // their own (~200 bytes each with the key, where the file may spend 13: Note [Compact
  // metadata]): keys, and arrays inside arrays. Files in use have a few dozen keys and no nested
  // arrays.
  static constexpr int kMaxDims = 4;
  static constexpr int kMaxNesting = 8;
  static constexpr int64_t kMaxMetadataKeys = 65536;
  static constexpr int64_t kMaxNestedArrays = 65536;
  // A tensor's elements (so that its size in bytes fits int64 in every type).
  static constexpr int64_t kMaxElements = INT64_MAX / 64;

  // Opens and validates `path` (see the file comment); the file stays open for the reads.
  static absl::StatusOr<std::shared_ptr<const GgufFile>> Open(const std::string& path,
                                                              const GgufOpenOptions& options = {});
  // True when the file at `path` starts with the GGUF magic (false for a missing file).
  static bool HasMagic(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  int64_t alignment() const { return alignment_; }
  int64_t data_offset() const { return data_offset_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufValue* Find(absl::string_view key) const;
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  // Typed metadata: NotFound naming the key when absent (the optional forms return nullopt),
  // InvalidArgument naming it when of another type.
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<std::optional<int64_t>> GetOptionalInt(absl::string_view key) const;
  absl::StatusOr<std::optional<double>> GetOptionalDouble(absl::string_view key) const;
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<std::optional<std::string>> GetOptionalString(absl::string_view key) const;
  // An array of strings (tokenizer.ggml.tokens, .merges) or of integers.
  absl::StatusOr<std::vector<std::string>> GetStrings(absl::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetInts(absl::string_view key) const;

  // The elements of tensor `name` at `ranges` (one RangeList per dim of its shape, ascending and
  // disjoint), dequantized, as a contiguous tensor of `options.dtype` (f32 when unset), or its
  // blocks when `options.dtype` is the tensor's quantized dtype (see the file comment).
  absl::StatusOr<Tensor> ReadRanges(absl::string_view name, const DimRanges& ranges,
                                    const ReadOptions& options = {},
                                    ReadStats* stats = nullptr) const;
  // The tensor seen as a matrix [rows, ne0] (every dim but the last flattened): the given rows,
  // in the given order (any order, repeats allowed), at the column ranges `cols`, as a tensor
  // [rows.size(), cols' size]. ReadRanges is this with the rows of its leading ranges; a
  // permuted read (Q and K of a Llama GGUF, loaders/gguf_llama.h) passes its own order.
  absl::StatusOr<Tensor> ReadRows(absl::string_view name, absl::Span<const int64_t> rows,
                                  const RangeList& cols, const ReadOptions& options = {},
                                  ReadStats* stats = nullptr) const;

 private:
  GgufFile() = default;
  // ReadRows for options.dtype quantized: the blocks of `rows` x `cols` (validated rows).
  absl::StatusOr<Tensor> ReadBlocks(const GgufTensorInfo& t, absl::Span<const int64_t> rows,
                                    const RangeList& cols, DType dtype, ReadStats* stats) const;
  std::string path_;
  uint32_t version_ = 0;
  int64_t alignment_ = 32;
  int64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::shared_ptr<const OpenFile> file_;  // read with pread (Note [Blocks are read, not mapped])
};

}  // namespace dt::loaders
