#include "dtensor/nn/save.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/safetensors_writer.h"

namespace dt::nn {
namespace {

namespace fs = std::filesystem;

struct Item {
  const Parameter* param;
  loaders::TensorEntry entry;
};

absl::Status Io(absl::string_view what, const fs::path& path, const std::error_code& ec) {
  return absl::InternalError(absl::StrCat("SaveGathered: ", what, " '", path.string(), "': ",
                                          ec ? ec.message() : std::strerror(errno)));
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Io("cannot write", path, {});
  return absl::OkStatus();
}

// A weight file of a checkpoint directory (what a save replaces rather than carries over).
bool IsWeightFile(const std::string& name) {
  return absl::EndsWith(name, ".safetensors") || absl::EndsWith(name, ".safetensors.index.json");
}

absl::Status SyncDir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Io("cannot open", dir, {});
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Io("cannot sync", dir, {});
  return absl::OkStatus();
}

// Note [Saving atomically]: `staged` replaces `dir`.
absl::Status PutInPlace(const fs::path& staged, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::rename(staged, dir, ec);
    if (ec) return Io("cannot rename into", dir, ec);
    return SyncDir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveGathered: '", dir.string(), "' exists and is not a directory"));
  }
  // Carry over what the save does not write.
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (IsWeightFile(name) || fs::exists(staged / name)) continue;
    fs::copy(e.path(), staged / name, fs::copy_options::recursive, ec);
    if (ec) return Io("cannot copy", e.path(), ec);
  }
  if (ec) return Io("cannot list", dir, ec);
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    return Io("cannot exchange with", dir, {});
  }
  fs::remove_all(staged, ec);  // now the old checkpoint; a failure here loses nothing
  return SyncDir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
}

// A quantized DTensor's pieces dequantized where they lie (f32, same placements: no
// communication; Note [Quantized tensors stay put]); any other DTensor as it is.
absl::StatusOr<DTensor> Dequantized(const DTensor& d) {
  if (!IsQuantized(d.dtype())) return d;
  DT_ASSIGN_OR_RETURN(DTensorSpec spec,
                      DTensorSpec::Create(d.mesh(), d.placements(), d.shape(), DType::kF32));
  DT_ASSIGN_OR_RETURN(Tensor local, d.ToLocal().To(DType::kF32));
  return DTensor(std::move(spec), std::move(local));
}

// The writing rank's part: every tensor streamed into a staged directory, then put in place.
class Writer {
 public:
  Writer(fs::path dir, const SaveOptions& options) : dir_(std::move(dir)), options_(options) {}

  absl::Status Begin(const std::vector<Item>& items) {
    std::error_code ec;
    // Leftovers of a save that died (Note [Saving atomically]).
    const fs::path parent = dir_.parent_path().empty() ? fs::path(".") : dir_.parent_path();
    fs::create_directories(parent, ec);
    if (ec) return Io("cannot create", parent, ec);
    const std::string prefix = dir_.filename().string() + ".saving-";
    for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
      if (absl::StartsWith(e.path().filename().string(), prefix)) fs::remove_all(e.path(), ec);
    }
    staged_ = parent / absl::StrCat(prefix, ::getpid());
    fs::create_directory(staged_, ec);
    if (ec) return Io("cannot create", staged_, ec);
    std::vector<loaders::TensorEntry> entries;
    for (const Item& it : items) entries.push_back(it.entry);
    files_ = loaders::PlanCheckpointFiles(entries, options_.max_file_bytes, options_.file_stem);
    return absl::OkStatus();
  }

  // The next tensor in item order.
  absl::Status Append(const Tensor& t) {
    if (!current_.has_value()) {
      const loaders::CheckpointFile& f = files_[file_];
      DT_ASSIGN_OR_RETURN(loaders::SafetensorsWriter w,
                          loaders::SafetensorsWriter::Create((staged_ / f.name).string(), f.entries,
                                                             options_.metadata));
      current_.emplace(std::move(w));
    }
    DT_RETURN_IF_ERROR(current_->Append(t));
    if (current_->written() == current_->entries().size()) {
      DT_RETURN_IF_ERROR(current_->Finish());
      current_.reset();
      ++file_;
    }
    return absl::OkStatus();
  }

  absl::Status End() {
    DT_RETURN_IF_ERROR(loaders::WriteCheckpointIndex(staged_.string(), files_, options_.file_stem));
    for (const auto& [name, text] : options_.files) {
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat("SaveGathered: file name '", name, "' must be a plain name"));
      }
      DT_RETURN_IF_ERROR(WriteText(staged_ / name, text));
    }
    DT_RETURN_IF_ERROR(SyncDir(staged_));
    DT_RETURN_IF_ERROR(PutInPlace(staged_, dir_));
    staged_.clear();
    return absl::OkStatus();
  }

  ~Writer() {
    current_.reset();
    if (!staged_.empty()) {
      std::error_code ec;
      fs::remove_all(staged_, ec);
    }
  }

 private:
  fs::path dir_, staged_;
  const SaveOptions& options_;
  std::vector<loaders::CheckpointFile> files_;
  size_t file_ = 0;
  std::optional<loaders::SafetensorsWriter> current_;
};

std::vector<int> SortedRanks(const DeviceMesh& m) {
  std::vector<int> r = m.ranks();
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace

absl::Status SaveGathered(const Module& model, const std::string& dir, const SaveOptions& options) {
  std::vector<Item> items;
  std::set<std::string> names;
  const DeviceMesh* mesh = nullptr;
  for (const auto& [path, p] : model.NamedParameters()) {
    if (!p->materialized()) {
      return absl::FailedPreconditionError(
          absl::StrCat("SaveGathered: parameter '", path, "' holds no value"));
    }
    const std::string name = options.checkpoint_name ? options.checkpoint_name(path) : path;
    if (name.empty()) continue;
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SaveGathered: two parameters map to checkpoint tensor '", name, "' (one is '", path,
          "')"));
    }
    // Every rank takes part in every gather: the parameters' meshes must span the same ranks
    // (an (ep, tp) mesh and its tp rows do not; a unit view of the tp mesh does: Note [Unit
    // meshes] in nn/styles.h).
    const DeviceMesh& m = p->value().mesh();
    if (mesh == nullptr) {
      mesh = &m;
    } else if (!(m == *mesh) && SortedRanks(m) != SortedRanks(*mesh)) {
      return absl::InvalidArgumentError(absl::StrCat("SaveGathered: parameter '", path, "' is on ",
                                                     m.ToString(), ", the others on ",
                                                     mesh->ToString()));
    }
    // A quantized weight is written dequantized (safetensors has no GGUF blocks), in f32.
    const DType stored = IsQuantized(p->dtype()) ? DType::kF32 : p->dtype();
    items.push_back({p, {name, options.dtype.value_or(stored), p->shape()}});
  }
  if (mesh == nullptr) {
    return absl::InvalidArgumentError("SaveGathered: the model has no parameters to save");
  }
  const bool writes = mesh->my_rank() == mesh->ranks()[0];
  std::vector<int> all_dims(mesh->ndim());
  for (int i = 0; i < mesh->ndim(); ++i) all_dims[i] = i;
  DT_ASSIGN_OR_RETURN(CommPtr comm, mesh->Comm(all_dims));

  // The writer's failures do not stop the gathers (every rank must take part in each), so the
  // first error is kept and the remaining tensors are gathered and dropped.
  absl::Status status;
  std::optional<Writer> writer;
  if (writes) {
    writer.emplace(fs::path(dir), options);
    status = writer->Begin(items);
  }
  int64_t done = 0, bytes = 0;
  for (const Item& it : items) {
    DT_ASSIGN_OR_RETURN(DTensor value, Dequantized(it.param->value()));
    DT_ASSIGN_OR_RETURN(Tensor full, value.FullTensor());
    absl::Cleanup progress = [&] {
      bytes += it.entry.nbytes();
      if (options.on_progress) options.on_progress(++done, static_cast<int64_t>(items.size()), bytes);
    };
    if (!writes || !status.ok()) continue;
    if (full.dtype() != it.entry.dtype) {
      absl::StatusOr<Tensor> cast = full.To(it.entry.dtype);
      if (!cast.ok()) {
        status = cast.status();
        continue;
      }
      full = *std::move(cast);
    }
    status = writer->Append(full);
  }
  if (writes && status.ok()) status = writer->End();
  writer.reset();

  // Everyone learns the outcome: 0 ok, else the status code (the message stays with the writer).
  DT_ASSIGN_OR_RETURN(Tensor code, Tensor::Full({1}, static_cast<double>(status.raw_code()),
                                                DType::kI64));
  DT_RETURN_IF_ERROR(comm->Broadcast(code, 0));
  if (writes) return status;
  const int64_t c = code.data<int64_t>()[0];
  if (c == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(c),
                      absl::StrCat("SaveGathered: the writing rank ", mesh->ranks()[0],
                                   " failed to save '", dir, "' (its log has the reason)"));
}

}  // namespace dt::nn
