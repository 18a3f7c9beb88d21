#include "dtensor/loaders/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
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
    // A .gguf name is read as GGUF whatever it holds, so that an empty or damaged one is
    // reported as the GGUF file it should be, not as a safetensors file.
    if (GgufFile::HasMagic(path) || absl::EndsWith(path, ".gguf")) return OpenGguf(path);
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
    e.norm_offset = n.norm_offset;
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
  for (const auto& [name, e] : where_) {
    if (!e.hidden) out.push_back(name);
  }
  return out;
}

std::string Checkpoint::NameInFile(absl::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return std::string(name);
  if (!it->second.gguf_name.empty()) return it->second.gguf_name;
  return it->second.stored_name.empty() ? std::string(name) : it->second.stored_name;
}

const TensorInfo& Checkpoint::InfoOf(const Entry& e, absl::string_view name) const {
  if (!e.parts.empty()) return e.composite_info;
  if (gguf_) return e.gguf_info;
  return *files_[e.file]->Find(e.stored_name.empty() ? name : absl::string_view(e.stored_name));
}

absl::Status Checkpoint::Rename(absl::string_view from, std::string to) {
  auto it = where_.find(from);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path_, "' has no tensor '", from, "'"));
  }
  if (where_.count(to)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path_, "': cannot rename '",
                                                   from, "' to '", to, "', which exists"));
  }
  Entry e = it->second;
  if (gguf_) {
    e.gguf_info.name = to;
  } else if (e.stored_name.empty()) {
    e.stored_name = std::string(from);
  }
  where_.erase(it);
  where_.emplace(std::move(to), std::move(e));
  return absl::OkStatus();
}

absl::Status Checkpoint::AddComposite(std::string name, Shape shape, std::vector<Part> parts) {
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path_, "': composite '", name,
                                                   "' ", ShapeToString(shape), ": ", why));
  };
  if (where_.count(name)) return fail("a tensor of that name exists");
  if (parts.empty()) return fail("has no parts");
  std::optional<DType> dtype;
  std::string dtype_name;
  int64_t covered = 0;
  std::vector<DimRanges> boxes;
  for (const Part& p : parts) {
    auto it = where_.find(p.source);
    if (it == where_.end()) return fail(absl::StrCat("part '", p.source, "' is not in it"));
    if (!it->second.parts.empty()) return fail(absl::StrCat("part '", p.source, "' is a composite"));
    const TensorInfo& info = InfoOf(it->second, p.source);
    Shape ps = info.shape;
    if (p.stacked) ps.insert(ps.begin(), 1);
    if (ps.size() != shape.size() || p.offset.size() != shape.size()) {
      return fail(absl::StrCat("part '", p.source, "' ", info.Describe(), " at ",
                               ShapeToString(p.offset), " does not have its ", shape.size(),
                               " dims"));
    }
    DimRanges box;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (p.offset[d] < 0 || p.offset[d] + ps[d] > shape[d]) {
        return fail(absl::StrCat("part '", p.source, "' ", info.Describe(), " at ",
                                 ShapeToString(p.offset), " runs past dim ", d));
      }
      box.push_back(RangeList{{p.offset[d], p.offset[d] + ps[d]}});
    }
    for (size_t b = 0; b < boxes.size(); ++b) {
      bool overlap = true;
      for (size_t d = 0; d < shape.size() && overlap; ++d) {
        overlap = !IntersectRanges(boxes[b][d], box[d]).empty();
      }
      if (overlap) {
        return fail(absl::StrCat("parts '", parts[b].source, "' and '", p.source, "' overlap"));
      }
    }
    if (dtype_name.empty()) {
      dtype = info.dtype;
      dtype_name = info.dtype_name;
    } else if (info.dtype_name != dtype_name) {
      return fail(absl::StrCat("part '", p.source, "' is ", info.dtype_name, ", not ", dtype_name,
                               " like the first"));
    }
    covered += Numel(ps);
    boxes.push_back(std::move(box));
  }
  if (covered != Numel(shape)) {
    return fail(absl::StrCat("its parts cover ", covered, " of ", Numel(shape), " elements"));
  }
  Entry e;
  e.composite_info.name = name;
  e.composite_info.dtype = dtype;
  e.composite_info.dtype_name = dtype_name;
  e.composite_info.shape = shape;
  for (const Part& p : parts) where_.find(p.source)->second.hidden = true;
  e.parts = std::move(parts);
  where_.emplace(std::move(name), std::move(e));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Checkpoint::ReadComposite(const Entry& e, const DimRanges& ranges,
                                                 const ReadOptions& options,
                                                 ReadStats* stats) const {
  const TensorInfo& info = e.composite_info;
  DT_RETURN_IF_ERROR(CheckRanges(absl::StrCat("checkpoint '", path_, "'"), info.name,
                                 info.Describe(), info.shape, ranges));
  if (!info.dtype) {
    return absl::UnimplementedError(absl::StrCat("tensor '", info.name, "' has dtype ",
                                                 info.dtype_name, ", which dtensor cannot read"));
  }
  const DType dtype = options.dtype.value_or(*info.dtype);
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(RangesShape(ranges), dtype));
  if (stats != nullptr) {  // `out` is held from here; each part only until it is copied
    ++stats->tensors;
    stats->resident_bytes += out.nbytes();
    stats->peak_bytes = std::max(stats->peak_bytes, stats->resident_bytes);
  }
  ReadOptions o = options;
  o.dtype = dtype;
  o.zero_copy = true;  // the parts are copied into `out` right away
  for (const Part& p : e.parts) {
    const TensorInfo& pi = InfoOf(where_.find(p.source)->second, p.source);
    DimRanges box, src;
    bool empty = false;
    for (size_t d = 0; d < ranges.size(); ++d) {
      const int64_t size = p.stacked ? (d == 0 ? 1 : pi.shape[d - 1]) : pi.shape[d];
      RangeList in = IntersectRanges(ranges[d], RangeList{{p.offset[d], p.offset[d] + size}});
      empty = empty || in.empty();
      RangeList shifted;
      for (const IndexRange& r : in) shifted.push_back({r.start - p.offset[d], r.stop - p.offset[d]});
      if (!(p.stacked && d == 0)) src.push_back(std::move(shifted));
      box.push_back(std::move(in));
    }
    if (empty) continue;
    DT_ASSIGN_OR_RETURN(Tensor piece, ReadRanges(p.source, src, o, stats));
    if (p.stacked) {
      DT_ASSIGN_OR_RETURN(piece, piece.Unsqueeze(0));
    }
    DT_RETURN_IF_ERROR(CopyBox(out, ranges, piece, box, box));
    if (stats != nullptr) {
      stats->resident_bytes -= piece.nbytes();
      --stats->tensors;
    }
  }
  return out;
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
  if (!e.parts.empty()) return ReadComposite(e, ranges, options, stats);
  if (!gguf_) {
    return files_[e.file]->ReadRanges(e.stored_name.empty() ? name : absl::string_view(e.stored_name),
                                      ranges, options, stats);
  }
  if (e.norm_offset != 0) {
    // Gemma's norms stored as 1 + w (Note [GGUF Gemma] in gguf_llama.cc): read in f32, the
    // offset taken off there, then converted.
    if (options.dtype && IsQuantized(*options.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' in '", path_, "' is stored with an offset; it cannot stay ",
          DTypeName(*options.dtype)));
    }
    ReadOptions f32 = options;
    f32.dtype = DType::kF32;
    f32.zero_copy = false;
    DT_ASSIGN_OR_RETURN(Tensor t, gguf_->ReadRanges(e.gguf_name, ranges, f32, stats));
    std::vector<float> v = t.ToVector<float>();
    for (float& x : v) x = static_cast<float>(x - e.norm_offset);
    DT_ASSIGN_OR_RETURN(Tensor shifted, Tensor::FromVector(t.shape(), v));
    return options.dtype ? shifted.To(*options.dtype) : shifted;
  }
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
    for (const IndexRange& c :
         ShardRangesAlong(spec.shape(), mesh.shape(), spec.placements(), coord, last)) {
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
