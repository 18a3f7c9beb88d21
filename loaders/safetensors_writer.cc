#include "dtensor/loaders/safetensors_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/safetensors.h"
#include "nlohmann/json.hpp"

namespace dt::loaders {

int64_t TensorEntry::nbytes() const { return Numel(shape) * DTypeSize(dtype); }

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorEntry> entries,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  int64_t at = 0;
  for (const TensorEntry& e : entries) {
    if (e.name.empty() || e.name == "__metadata__" || !names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors '", path, "': bad or repeated tensor name '", e.name, "'"));
    }
    header[e.name] = {{"dtype", std::string(SafetensorsDTypeName(e.dtype))},
                      {"shape", std::vector<int64_t>(e.shape.begin(), e.shape.end())},
                      {"data_offsets", {at, at + e.nbytes()}}};
    at += e.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the reference pads the header to 8 bytes

  SafetensorsWriter w;
  w.path_ = path;
  w.tmp_ = absl::StrCat(path, ".tmp.", ::getpid());
  w.entries_ = std::move(entries);
  w.fp_ = std::fopen(w.tmp_.c_str(), "wb");
  if (w.fp_ == nullptr) {
    return absl::InternalError(
        absl::StrCat("safetensors: cannot create '", w.tmp_, "': ", std::strerror(errno)));
  }
  unsigned char len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, w.fp_) != 8 || std::fwrite(text.data(), 1, n, w.fp_) != n) {
    return absl::InternalError(absl::StrCat("safetensors: cannot write '", w.tmp_, "'"));
  }
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      entries_(std::move(other.entries_)),
      next_(other.next_),
      fp_(other.fp_) {
  other.fp_ = nullptr;
}

SafetensorsWriter::~SafetensorsWriter() { Abandon(); }

void SafetensorsWriter::Abandon() {
  if (fp_ == nullptr) return;
  std::fclose(fp_);
  fp_ = nullptr;
  std::remove(tmp_.c_str());
}

absl::Status SafetensorsWriter::Append(const Tensor& t) {
  if (fp_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors '", path_, "': writer closed"));
  }
  if (next_ >= entries_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "safetensors '", path_, "': all ", entries_.size(), " tensors are already written"));
  }
  const TensorEntry& e = entries_[next_];
  if (!t.defined() || t.dtype() != e.dtype || t.shape() != e.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors '", path_, "': tensor '", e.name, "' is declared ",
                     SafetensorsDTypeName(e.dtype), ShapeToString(e.shape), ", got ",
                     t.defined() ? t.Describe() : std::string("an undefined tensor")));
  }
  DT_ASSIGN_OR_RETURN(Tensor host, t.To(kCPU));
  DT_ASSIGN_OR_RETURN(host, host.Contiguous());
  const size_t bytes = static_cast<size_t>(host.nbytes());
  if (bytes > 0 && std::fwrite(host.raw_data(), 1, bytes, fp_) != bytes) {
    Abandon();
    return absl::InternalError(absl::StrCat("safetensors: cannot write '", tmp_, "': ",
                                            std::strerror(errno)));
  }
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (fp_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors '", path_, "': writer closed"));
  }
  if (next_ != entries_.size()) {
    Abandon();
    return absl::FailedPreconditionError(absl::StrCat("safetensors '", path_, "': ", next_, " of ",
                                                      entries_.size(), " tensors written"));
  }
  const bool ok = std::fflush(fp_) == 0 && ::fsync(::fileno(fp_)) == 0;
  const bool closed = std::fclose(fp_) == 0;
  fp_ = nullptr;
  if (!ok || !closed || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    return absl::InternalError(absl::StrCat("safetensors: cannot write '", path_, "'"));
  }
  return absl::OkStatus();
}

std::vector<CheckpointFile> PlanCheckpointFiles(absl::Span<const TensorEntry> entries,
                                                int64_t max_file_bytes, absl::string_view stem) {
  std::vector<CheckpointFile> files(1);
  int64_t in_file = 0;
  for (const TensorEntry& e : entries) {
    if (max_file_bytes > 0 && in_file > 0 && in_file + e.nbytes() > max_file_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().entries.push_back(e);
    in_file += e.nbytes();
  }
  if (files.size() == 1) {
    files[0].name = absl::StrCat(stem, ".safetensors");
  } else {
    for (size_t i = 0; i < files.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", i + 1, files.size());
      files[i].name = absl::StrCat(stem, name);
    }
  }
  return files;
}

absl::Status WriteCheckpointIndex(const std::string& dir, absl::Span<const CheckpointFile> files,
                                  absl::string_view stem) {
  if (files.size() <= 1) return absl::OkStatus();
  int64_t total = 0;
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (const CheckpointFile& f : files) {
    for (const TensorEntry& e : f.entries) {
      map[e.name] = f.name;
      total += e.nbytes();
    }
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = map;
  const std::string path =
      (std::filesystem::path(dir) / absl::StrCat(stem, ".safetensors.index.json")).string();
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  const std::string text = index.dump(2) + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), fp) == text.size();
  if (std::fclose(fp) != 0 || !ok) {
    return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

namespace {

std::vector<TensorEntry> EntriesOf(absl::Span<const std::pair<std::string, Tensor>> tensors) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, t] : tensors) {
    entries.push_back({name, t.defined() ? t.dtype() : DType::kF32,
                       t.defined() ? t.shape() : Shape{}});
  }
  return entries;
}

// Writes `entries` to `path`, taking each tensor from `tensors` by position.
absl::Status WriteFile(const std::string& path, std::vector<TensorEntry> entries,
                       absl::Span<const std::pair<std::string, Tensor>> tensors,
                       const std::map<std::string, std::string>& metadata) {
  DT_ASSIGN_OR_RETURN(SafetensorsWriter w,
                      SafetensorsWriter::Create(path, std::move(entries), metadata));
  for (const auto& nt : tensors) DT_RETURN_IF_ERROR(w.Append(nt.second));
  return w.Finish();
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const std::pair<std::string, Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors '", path, "': tensor '", name, "' is undefined"));
    }
  }
  return WriteFile(path, EntriesOf(tensors), tensors, metadata);
}

absl::Status WriteCheckpoint(const std::string& dir,
                             absl::Span<const std::pair<std::string, Tensor>> tensors,
                             int64_t max_file_bytes,
                             const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", ec.message()));
  const std::vector<CheckpointFile> files = PlanCheckpointFiles(EntriesOf(tensors), max_file_bytes);
  size_t at = 0;
  for (const CheckpointFile& f : files) {
    DT_RETURN_IF_ERROR(WriteSafetensors((std::filesystem::path(dir) / f.name).string(),
                                        tensors.subspan(at, f.entries.size()), metadata));
    at += f.entries.size();
  }
  return WriteCheckpointIndex(dir, files);
}

}  // namespace dt::loaders
