#pragma once
// What the checkpoint readers (safetensors, GGUF) share: range validation, read accounting, and
// releasing the mapped pages a copy touched.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/safetensors.h"

namespace dt::loaders {

// `ranges` must hold one list per dim of `shape`, each ascending, disjoint, non-empty and inside
// the dim. `what` names the file ("safetensors 'a.safetensors'"), `describe` the tensor ("F32[4]").
absl::Status CheckRanges(absl::string_view what, absl::string_view name,
                         absl::string_view describe, IntSpan shape, const DimRanges& ranges);

// A file opened read-only for header parsing: closed when this goes out of scope.
struct OpenFile {
  int fd = -1;
  int64_t size = 0;
  OpenFile() = default;
  OpenFile(const OpenFile&) = delete;
  OpenFile(OpenFile&& o) noexcept : fd(o.fd), size(o.size) { o.fd = -1; }
  ~OpenFile();
};
// Opens `path`, a regular file; `what` names it in errors ("gguf 'x.gguf'"): NotFound when it
// cannot be opened, InvalidArgument when it is not a regular file.
absl::StatusOr<OpenFile> OpenForRead(const std::string& path, absl::string_view what);

// Reads exactly n bytes at `offset` of `fd` into dst (retrying short reads and EINTR); Internal
// naming `what` and the offset otherwise. Note [Blocks are read, not mapped] in gguf.cc.
absl::Status PreadAll(int fd, void* dst, int64_t n, int64_t offset, absl::string_view what);

// Counts one piece: `viewed` bytes of zero-copy views, `copied` bytes copied out of the file,
// `converted` bytes produced by a dtype conversion (its source freed once converted).
void AccountRead(ReadStats* stats, int64_t viewed, int64_t copied, int64_t converted);

// Releases this mapping's whole pages in [begin, begin + nbytes) (Note [Copies leave no mapped
// pages] in read_util.cc).
void DropMappedPages(const char* begin, int64_t nbytes);

}  // namespace dt::loaders
