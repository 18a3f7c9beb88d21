#include "dtensor/loaders/checkpoint.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/gguf_llama.h"
#include "dtensor/loaders/read_util.h"
#include "dtensor/loaders/small_file.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {

using Json = nlohmann::json;

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  Checkpoint c;
  c.path_ = path;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec)) {
      return absl::NotFoundError(absl::StrCat("checkpoint '", path, "' does not exist"));
    }
    if (GgufFile::HasMagic(path)) return OpenGguf(path);
    DT_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(path));
    c.files_.push_back(f);
    for (const TensorInfo& t : f->tensors()) c.where_[t.name] = Entry{0};
    return c;
  }
  const fs::path dir(path);
  // transformers names its files model.safetensors[.index.json], diffusers
  // diffusion_pytorch_model.safetensors[.index.json]; the first stem present wins.
  std::string stem = "model";
  for (const char* s : {"model", "diffusion_pytorch_model"}) {
    if (fs::exists(dir / absl::StrCat(s, ".safetensors.index.json"), ec) ||
        fs::exists(dir / absl::StrCat(s, ".safetensors"), ec)) {
      stem = s;
      break;
    }
  }
  const fs::path index = dir / absl::StrCat(stem, ".safetensors.index.json");
  const fs::path single = dir / absl::StrCat(stem, ".safetensors");
  if (!fs::exists(index, ec)) {
    if (!fs::exists(single, ec)) {
      const bool pickle = fs::exists(dir / "pytorch_model.bin", ec) ||
                          fs::exists(dir / "pytorch_model.bin.index.json", ec) ||
                          fs::exists(dir / "diffusion_pytorch_model.bin", ec);
      return absl::NotFoundError(absl::StrCat(
          "checkpoint '", path,
          "' has none of model.safetensors[.index.json], diffusion_pytorch_model.safetensors"
          "[.index.json]",
          pickle ? " (pickled .bin checkpoints are not read: convert them to safetensors)" : ""));
    }
    DT_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single.string()));
    c.files_.push_back(f);
    for (const TensorInfo& t : f->tensors()) c.where_[t.name] = Entry{0};
    return c;
  }
  const std::string what = index.string();
  DT_ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(what, kMaxHeaderBytes));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("'", what, "' is not a JSON object"));
  }
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", what, "' has no \"weight_map\" object (tensor name -> file)"));
  }
  std::map<std::string, size_t> file_index;
  std::vector<std::pair<std::string, std::string>> entries;  // tensor, file
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("'", what, "': weight_map entry '", it.key(),
                                                     "' must be a file name (a string)"));
    }
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        file.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", what, "': tensor '", it.key(), "' maps to '", file,
          "', which is not a plain file name in the checkpoint directory"));
    }
    if (!file_index.count(file)) {
      const size_t i = c.files_.size();
      DT_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((dir / file).string()));
      c.files_.push_back(f);
      file_index[file] = i;
    }
    entries.emplace_back(it.key(), file);
  }
  for (const auto& [name, file] : entries) {
    const size_t i = file_index[file];
    if (c.files_[i]->Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", what, "' maps tensor '", name, "' to '",
                                                     file, "', which does not contain it"));
    }
    c.where_[name] = Entry{i};
  }
  // Tensors the index does not list, and tensors stored twice.
  for (size_t i = 0; i < c.files_.size(); ++i) {
    for (const TensorInfo& t : c.files_[i]->tensors()) {
      auto it = c.where_.find(t.name);
      if (it == c.where_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("'", c.files_[i]->path(), "' holds tensor '",
                                                       t.name, "', which '", what,
                                                       "' does not list"));
      }
      if (it->second.file != i) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "' is stored in both '", c.files_[i]->path(), "' and '",
            c.files_[it->second.file]->path(), "'"));
      }
    }
  }
  return c;
}

absl::StatusOr<Checkpoint> Checkpoint::OpenGguf(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  // Weights only: the vocabulary arrays are not kept (GgufOpenOptions).
  GgufOpenOptions o;
  o.tokenizer_arrays = false;
  DT_ASSIGN_OR_RETURN(c.gguf_, GgufFile::Open(path, o));
  DT_ASSIGN_OR_RETURN(std::vector<GgufTensorName> names, DecoderGgufTensorNames(*c.gguf_));
  for (const GgufTensorName& n : names) {
    const GgufTensorInfo& t = *c.gguf_->FindTensor(n.gguf_name);
    Entry e;
    e.gguf_name = n.gguf_name;
    e.permute_heads = n.permute_heads;
    e.gguf_info.name = n.hf_name;
    e.gguf_info.dtype_name = t.type->name;
    e.gguf_info.dtype = t.type->dtype;
    e.gguf_info.shape = t.shape;
    e.gguf_info.begin = t.offset;
    e.gguf_info.end = t.offset + t.nbytes;
    if (!c.where_.emplace(n.hf_name, std::move(e)).second) {
      return absl::InvalidArgumentError(absl::StrCat("gguf '", path, "': two tensors map to '",
                                                     n.hf_name, "'"));
    }
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : where_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::InfoOf(const Entry& e, absl::string_view name) const {
  return gguf_ ? e.gguf_info : *files_[e.file]->Find(name);
}

absl::StatusOr<const TensorInfo*> Checkpoint::Info(absl::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", path_, "' has no tensor '", name, "'"));
  }
  return &InfoOf(it->second, name);
}

absl::StatusOr<Tensor> Checkpoint::Read(absl::string_view name, const ReadOptions& options,
                                        ReadStats* stats) const {
  DT_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  return ReadRanges(name, FullRanges(info->shape), options, stats);
}

absl::StatusOr<Tensor> Checkpoint::ReadRanges(absl::string_view name, const DimRanges& ranges,
                                              const ReadOptions& options,
                                              ReadStats* stats) const {
  DT_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  if (options.dtype && IsQuantized(*options.dtype) && info->dtype != options.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' is ", info->dtype_name, ShapeToString(info->shape), " in '", path_,
        "'; it cannot be read as ", DTypeName(*options.dtype), " (only a GGUF tensor of that type "
        "stays quantized)"));
  }
  const Entry& e = where_.find(name)->second;
  if (!gguf_) return files_[e.file]->ReadRanges(name, ranges, options, stats);
  if (e.permute_heads == 0) return gguf_->ReadRanges(e.gguf_name, ranges, options, stats);
  // Note [GGUF Q/K row order] (loaders/gguf_llama.h): HF rows gathered from their GGUF rows.
  const Shape& shape = e.gguf_info.shape;
  DT_RETURN_IF_ERROR(CheckRanges(absl::StrCat("gguf '", path_, "'"), name,
                                 e.gguf_info.Describe(), shape, ranges));
  std::vector<int64_t> rows;
  for (const IndexRange& r : ranges[0]) {
    for (int64_t i = r.start; i < r.stop; ++i) {
      rows.push_back(GgufRotaryRow(i, shape[0], e.permute_heads));
    }
  }
  return gguf_->ReadRows(e.gguf_name, rows, ranges[1], options, stats);
}

absl::StatusOr<Tensor> Checkpoint::ReadLocal(absl::string_view name, const DTensorSpec& spec,
                                             const ReadOptions& options, ReadStats* stats) const {
  DT_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  if (info->shape != spec.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': expected ",
                                                   ShapeToString(spec.shape()), ", got ",
                                                   ShapeToString(info->shape), " in '", path_,
                                                   "'"));
  }
  if (!spec.is_member()) return Tensor::Empty({0}, spec.dtype());
  if (IsQuantized(spec.dtype())) DT_RETURN_IF_ERROR(QuantizedShardsFit(name, spec));
  ReadOptions o = options;
  o.dtype = spec.dtype();
  return ReadRanges(name, spec.Ranges(), o, stats);
}

absl::Status QuantizedShardsFit(absl::string_view name, const DTensorSpec& spec) {
  const DType q = spec.dtype();
  const int last = spec.ndim() - 1;
  const DeviceMesh& mesh = spec.mesh();
  Shape coord(static_cast<size_t>(mesh.ndim()), 0);
  for (int64_t r = 0; r < mesh.Size(); ++r) {
    for (const IndexRange& c : spec.Ranges(coord)[last]) {
      if (c.start % DTypeBlock(q) != 0 || c.stop % DTypeBlock(q) != 0) {
        std::string sizes;
        for (int i = 0; i < mesh.ndim(); ++i) {
          absl::StrAppend(&sizes, i ? ", " : "", MeshDimName(mesh.names(), i), "=", mesh.shape()[i]);
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", name, "' ", spec.Describe(), ": the rank at ", ShapeToString(coord),
            " would hold columns [", c.start, ", ", c.stop, "), not whole ", DTypeBlock(q),
            "-element ", DTypeName(q), " blocks, so it cannot stay quantized at ", sizes,
            " (dequantize it, or pick a tensor-parallel size whose column shards are whole "
            "blocks)"));
      }
    }
    for (int i = mesh.ndim() - 1; i >= 0; --i) {
      if (++coord[i] < mesh.shape()[i]) break;
      coord[i] = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace dt::loaders
