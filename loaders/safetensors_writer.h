#pragma once
// Writing safetensors checkpoints, one tensor at a time.
//
// SafetensorsWriter streams one file: the header (names, dtypes, shapes, offsets) is known before
// any data, so it is written first, then each tensor's bytes as the caller hands them over. Nothing
// holds more than the tensor being written, which is what lets SaveGathered (nn/save.h) write a
// tensor-parallel model gathered piece by piece. The file is written under a temporary name and
// renamed into place by Finish(); a writer destroyed before Finish() (an error, a crash of the
// caller's logic) removes its temporary file and leaves any previous file untouched.
//
// PlanCheckpointFiles splits a list of tensors over files as save_pretrained does (greedy, in
// order, a new file when the next tensor would pass max_file_bytes), named model.safetensors or
// model-0000i-of-0000N.safetensors with model.safetensors.index.json (WriteCheckpointIndex).
//
// WriteSafetensors and WriteCheckpoint (whole tensors in memory: tests and tools) are the same
// writer over a list.

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dt::loaders {

// A tensor to be written: what the header says about it.
struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t nbytes() const;
};

class SafetensorsWriter {
 public:
  // Validates the entries (names unique, non-empty, not "__metadata__") and writes the header to
  // a temporary file beside `path`.
  static absl::StatusOr<SafetensorsWriter> Create(const std::string& path,
                                                  std::vector<TensorEntry> entries,
                                                  const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();

  // The next entry's data: `t` must have its dtype and shape (any strides, any device).
  absl::Status Append(const Tensor& t);
  // Every entry written: flushes, closes and renames the file into place.
  absl::Status Finish();

  const std::vector<TensorEntry>& entries() const { return entries_; }
  size_t written() const { return next_; }

 private:
  SafetensorsWriter() = default;
  void Abandon();
  std::string path_, tmp_;
  std::vector<TensorEntry> entries_;
  size_t next_ = 0;
  FILE* fp_ = nullptr;
};

// One file of a checkpoint: its name in the directory and its tensors, in order.
struct CheckpointFile {
  std::string name;
  std::vector<TensorEntry> entries;
};
// The files save_pretrained would write for `entries` (max_file_bytes 0: one file), named from
// `stem`: transformers' "model" (model.safetensors, model-00001-of-00002.safetensors), diffusers'
// "diffusion_pytorch_model".
std::vector<CheckpointFile> PlanCheckpointFiles(absl::Span<const TensorEntry> entries,
                                                int64_t max_file_bytes,
                                                absl::string_view stem = "model");
// <stem>.safetensors.index.json for `files` in `dir` (only when there are several files).
absl::Status WriteCheckpointIndex(const std::string& dir, absl::Span<const CheckpointFile> files,
                                  absl::string_view stem = "model");

// Writes `tensors` (any strides; names unique and non-empty) in the given order with `metadata`.
// The file appears atomically (written to a temporary name, then renamed).
absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const std::pair<std::string, Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes a checkpoint directory: one model.safetensors when everything fits in `max_file_bytes`
// (0: no limit), else model-00001-of-0000N.safetensors files plus model.safetensors.index.json,
// as save_pretrained does. The directory is created when missing.
absl::Status WriteCheckpoint(const std::string& dir,
                             absl::Span<const std::pair<std::string, Tensor>> tensors,
                             int64_t max_file_bytes = 0,
                             const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace dt::loaders
