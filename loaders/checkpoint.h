#pragma once
// A model's weights, whatever holds them:
//
//   path                                        tensors
//   directory with model.safetensors.index.json  "weight_map": name -> file, over several files
//   (or diffusers' diffusion_pytorch_model.*)
//   directory with model.safetensors, or a       that file's tensors
//   .safetensors file
//   a GGUF file (by its magic, or named .gguf)   its tensors under their Hugging Face names
//                                                (loaders/gguf_llama.h), dequantized on read,
//                                                or kept as blocks when read as their own
//                                                quantized dtype (Note [Quantized dtypes])
//
// Every read goes through the same calls (Read, ReadRanges, ReadLocal) and the same ReadStats,
// so the model loaders do not know which format they read.
//
// Note [Composite tensors]
// A model may hold as one tensor what a checkpoint stores as several: transformers 5 keeps a MoE
// layer's experts stacked ([E, 2I, H] gate|up, [E, H, I] down) while Hub checkpoints store each
// expert's projections, and GGUF stores gate and up as two [E, I, H] stacks. AddComposite names
// such a tensor and where each stored part sits in it (an offset per dim; a "stacked" part lacks
// the composite's dim 0 and fills one index there); its parts are then no longer listed. A read
// of a composite's ranges reads from each part only the ranges that intersect it, so a rank that
// holds two experts' rows reads those rows of those two experts and nothing else, and the read
// accounting is the parts' (loaders/moe_checkpoint.h builds the composites of a MoE family).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/tensor.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/safetensors.h"

namespace dt::loaders {

class GgufFile;  // loaders/gguf.h

class Checkpoint {
 public:
  // `path`: see the file comment. The index's file names must be plain names inside the directory
  // (no '/', no ".."); every tensor it lists must be in its file, and a tensor may live in one file
  // only.
  static absl::StatusOr<Checkpoint> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // `name` as its file spells it, where that differs (a GGUF's "blk.0.ffn_up.weight", a renamed
  // tensor's stored name), else `name`: what a message about the tensor should show the user.
  std::string NameInFile(absl::string_view name) const;
  // NotFound naming the tensor and the checkpoint. A GGUF tensor's dtype_name is its ggml type
  // ("Q4_1") and its dtype the one dtensor holds it as (q4_1, f32, f16, bf16; nullopt for types
  // it does not read).
  absl::StatusOr<const TensorInfo*> Info(absl::string_view name) const;
  // The safetensors files (none for a GGUF).
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }
  // The GGUF file behind this checkpoint, or nullptr for safetensors.
  const GgufFile* gguf() const { return gguf_.get(); }

  absl::StatusOr<Tensor> Read(absl::string_view name, const ReadOptions& options = {},
                              ReadStats* stats = nullptr) const;
  absl::StatusOr<Tensor> ReadRanges(absl::string_view name, const DimRanges& ranges,
                                    const ReadOptions& options = {},
                                    ReadStats* stats = nullptr) const;
  // This rank's piece of a tensor laid out as `spec`: checks that the file's shape equals
  // spec.shape() ("tensor 'w': expected [8, 8], got [8, 4]"), reads spec.Ranges() and converts to
  // spec.dtype(); a quantized spec.dtype() must be the tensor's own type and its shards whole
  // blocks (QuantizedShardsFit). A rank outside the spec's mesh gets an empty [0] tensor and
  // reads nothing.
  absl::StatusOr<Tensor> ReadLocal(absl::string_view name, const DTensorSpec& spec,
                                   const ReadOptions& options = {},
                                   ReadStats* stats = nullptr) const;

  // ---- composites (Note [Composite tensors])
  struct Part {
    std::string source;    // a tensor of this checkpoint (not itself a composite)
    Shape offset;          // where its element 0 sits in the composite, one entry per dim
    bool stacked = false;  // the source lacks the composite's dim 0 (fills one index there)
  };
  // `name` of `shape`, tiled exactly by `parts` (every element covered once), which share one
  // dtype; InvalidArgument naming the composite and the part that does not fit. The parts leave
  // names().
  absl::Status AddComposite(std::string name, Shape shape, std::vector<Part> parts);
  // `from` is listed (and read) as `to` instead.
  absl::Status Rename(absl::string_view from, std::string to);

 private:
  static absl::StatusOr<Checkpoint> OpenGguf(const std::string& path);
  // Where a tensor lives: its file (safetensors) or its GGUF entry.
  struct Entry {
    size_t file = 0;       // index in files_
    TensorInfo gguf_info;  // GGUF only: the info under the HF name
    std::string gguf_name;
    int64_t permute_heads = 0;
    double norm_offset = 0;   // GGUF only: GgufTensorName::norm_offset
    std::string stored_name;  // a renamed tensor's name in its file ("" when not renamed)
    std::vector<Part> parts;  // a composite's parts (its info in composite_info)
    TensorInfo composite_info;
    bool hidden = false;  // a composite's part: readable, not listed
  };
  absl::StatusOr<Tensor> ReadComposite(const Entry& e, const DimRanges& ranges,
                                       const ReadOptions& options, ReadStats* stats) const;
  const TensorInfo& InfoOf(const Entry& e, absl::string_view name) const;

  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::shared_ptr<const GgufFile> gguf_;
  std::map<std::string, Entry, std::less<>> where_;
};

// OK when every rank's piece of a quantized `spec` is whole blocks along the last dim, else
// InvalidArgument naming the tensor, the block size, the offending columns and the mesh sizes
// ("... not whole 32-element q4_1 blocks, so it cannot stay quantized at tp=4"). Reads nothing.
absl::Status QuantizedShardsFit(absl::string_view name, const DTensorSpec& spec);

}  // namespace dt::loaders
