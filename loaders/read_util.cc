#include "dtensor/loaders/read_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dt::loaders {

absl::Status CheckRanges(absl::string_view what, absl::string_view name,
                         absl::string_view describe, IntSpan shape, const DimRanges& ranges) {
  if (ranges.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor '", name, "' ", describe, " has ", shape.size(),
        " dims, but ranges were given for ", ranges.size()));
  }
  for (size_t d = 0; d < ranges.size(); ++d) {
    int64_t prev = 0;
    for (const IndexRange& r : ranges[d]) {
      if (r.start < prev || r.start >= r.stop || r.stop > shape[d]) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": tensor '", name, "' ", describe, ": ranges of dim ", d,
            " (", RangesToString(ranges[d]), ") must be ascending, disjoint, non-empty and inside [0, ",
            shape[d], ")"));
      }
      prev = r.stop;
    }
  }
  return absl::OkStatus();
}

// Note [Copies leave no mapped pages]
// A strided read (column ranges, interleaved shards) touches every page that holds a wanted
// element, which for a rowwise shard is every page of the tensor: those file pages would count in
// this process's RSS for as long as the file stays mapped, although the piece was copied out.
// After a copy the tensor's whole pages are released from this mapping (MADV_DONTNEED on a
// read-only file mapping only unmaps: a zero-copy view sharing a page faults it back in from the
// page cache), so a rank's peak RSS is its pieces, not every tensor it sliced.
void DropMappedPages(const char* begin, int64_t nbytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(begin) + nbytes) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

std::optional<NonFinite> FindNonFinite(DType dtype, const void* src, int64_t n) {
  // Each value's exponent bits all set: NaN or infinite. Chunks are tested without branches (so
  // that the loop vectorizes), the element found only in a chunk that holds one.
  auto first = [n](const char* p, auto bits, auto mask) -> int64_t {
    using Bits = decltype(bits);
    constexpr int64_t kChunk = 4096;
    auto at = [p](int64_t i) {
      Bits v;
      std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
      return v;
    };
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t end = std::min(n, c + kChunk);
      Bits any = 0;
      for (int64_t i = c; i < end; ++i) any |= static_cast<Bits>((at(i) & mask) == mask);
      if (any == 0) continue;
      for (int64_t i = c; i < end; ++i) {
        if ((at(i) & mask) == mask) return i;
      }
    }
    return -1;
  };
  const char* p = static_cast<const char*>(src);
  int64_t i = -1;
  uint16_t half = 0;
  switch (dtype) {
    case DType::kF32: {
      i = first(p, uint32_t{0}, uint32_t{0x7F800000});
      float v = 0;
      if (i >= 0) std::memcpy(&v, p + 4 * i, 4);
      return i < 0 ? std::nullopt : std::optional<NonFinite>({i, v});
    }
    case DType::kF16:
      i = first(p, uint16_t{0}, uint16_t{0x7C00});
      if (i >= 0) std::memcpy(&half, p + 2 * i, 2);
      return i < 0 ? std::nullopt : std::optional<NonFinite>({i, Float16::ToFloat(half)});
    case DType::kBF16:
      i = first(p, uint16_t{0}, uint16_t{0x7F80});
      if (i >= 0) std::memcpy(&half, p + 2 * i, 2);
      return i < 0 ? std::nullopt : std::optional<NonFinite>({i, BitsFloat(uint32_t{half} << 16)});
    default:
      return std::nullopt;
  }
}

std::string PieceElement(const DimRanges& ranges, int64_t i) {
  std::vector<int64_t> index(ranges.size());
  for (size_t d = ranges.size(); d-- > 0;) {
    const int64_t size = RangesSize(ranges[d]);
    int64_t local = size > 0 ? i % size : 0;
    i = size > 0 ? i / size : 0;
    for (const IndexRange& r : ranges[d]) {  // the local index's global one in dim d
      if (local < r.size()) {
        index[d] = r.start + local;
        break;
      }
      local -= r.size();
    }
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

absl::Status OpenError(int err, absl::string_view what) {
  const std::string msg = absl::StrCat("cannot open ", what, ": ", std::strerror(err));
  switch (err) {
    case EACCES: case EPERM: return absl::PermissionDeniedError(msg);
    case ENOENT: case ENOTDIR: return absl::NotFoundError(msg);
    case EISDIR: case ELOOP: case ENAMETOOLONG: return absl::InvalidArgumentError(msg);
    default: return absl::UnavailableError(msg);
  }
}

absl::Status TooShort(absl::string_view what, int64_t size, absl::string_view expected,
                      absl::string_view need) {
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": is empty (0 bytes); expected ", expected));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": is ", size, " byte", size == 1 ? "" : "s",
                                                 ", too short for ", expected, " (", need, ")"));
}

OpenFile::~OpenFile() {
  if (fd >= 0) ::close(fd);
}

absl::StatusOr<OpenFile> OpenForRead(const std::string& path, absl::string_view what) {
  OpenFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return OpenError(errno, what);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", what, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(what, ": not a regular file"));
  f.size = st.st_size;
  return f;
}

absl::Status PreadAll(int fd, void* dst, int64_t n, int64_t offset, absl::string_view what) {
  char* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, static_cast<size_t>(n), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::InternalError(absl::StrCat(what, ": read failed at offset ", offset, ": ",
                                              r < 0 ? std::strerror(errno) : "end of file"));
    }
    out += r;
    offset += r;
    n -= r;
  }
  return absl::OkStatus();
}

void AccountRead(ReadStats* stats, int64_t viewed, int64_t copied, int64_t converted) {
  if (stats == nullptr) return;
  stats->tensors += 1;
  stats->bytes_viewed += viewed;
  stats->bytes_copied += copied;
  stats->bytes_converted += converted;
  stats->max_piece_bytes = std::max(stats->max_piece_bytes, viewed + copied);
  // While converting, the source piece and the converted one are held together; then the source
  // is dropped.
  const int64_t held = converted > 0 ? converted : viewed + copied;
  const int64_t transient = converted > 0 ? viewed + copied : 0;
  stats->peak_bytes = std::max(stats->peak_bytes, stats->resident_bytes + held + transient);
  stats->resident_bytes += held;
}

}  // namespace dt::loaders
