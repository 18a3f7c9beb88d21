#pragma once
// What the checkpoint readers (safetensors, GGUF) share: range validation, read accounting, and
// releasing the mapped pages a copy touched.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/read_options.h"

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
// Opens `path`, a regular file; `what` names it in errors ("gguf 'x.gguf'"): OpenError when it
// cannot be opened, InvalidArgument when it is not a regular file.
absl::StatusOr<OpenFile> OpenForRead(const std::string& path, absl::string_view what);
// "cannot open <what>: <errno's text>" with the code the errno means: PermissionDenied (EACCES,
// EPERM), NotFound (ENOENT, ENOTDIR), InvalidArgument (EISDIR, ELOOP, ENAMETOOLONG), else
// Unavailable (EMFILE, EIO, ...).
absl::Status OpenError(int err, absl::string_view what);
// A file too short to be what it should: "<what>: is empty (0 bytes); expected <expected>" or
// "<what>: is 3 bytes, too short for <expected> (<need>)".
absl::Status TooShort(absl::string_view what, int64_t size, absl::string_view expected,
                      absl::string_view need);

// Note [Non-finite weights]
// A weight that is NaN or infinite makes every output it touches NaN, and a model computing on
// NaN does not fail: greedy decoding picks token 0 (or whichever its argmax does with NaN) and
// prints it forever, exit status 0. No trained weight is NaN or infinite, so the readers refuse
// one as they read it, naming the file, the tensor and where: every f32, f16 and bf16 element of
// a piece (safetensors and GGUF) and every scale of a GGUF quant block (Note [Non-finite scales]
// in core/quant.h). The check is one pass over bytes the read brings into the cache anyway
// (bench_load: docs/limits.md).
//
// The first of the `n` elements of float `dtype` (f32, f16, bf16) at `src` that is NaN or
// infinite: its index and value; nullopt when there is none (and for any other dtype).
struct NonFinite {
  int64_t index = 0;
  float value = 0;
};
std::optional<NonFinite> FindNonFinite(DType dtype, const void* src, int64_t n);
// The global index of element `i` (row-major) of the piece read at `ranges`: "[2, 17]".
std::string PieceElement(const DimRanges& ranges, int64_t i);

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
