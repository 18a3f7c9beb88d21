#include "dtensor/mesh/view_stream.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "dtensor/core/strided.h"

namespace dt::internal {
namespace {

// Note [Copying between views]
// The copies go run by run (a row of the coalesced view). For a shard-dim change the source runs
// are rows of a few KiB at a stride of several rows, the destination one contiguous block; the
// raw all_to_all it is measured against copies each block with one memcpy. Measured on the
// 2-vCPU VM (2 and 4 threads each gathering [rows, 2-8 KiB] blocks from every thread's buffer;
// ratio = contiguous memcpy time / ours, median of interleaved repetitions):
//   memcpy per row                                       0.75-0.86
//   128-byte moves, source rows prefetched ahead         0.77-0.91
//   the same with streaming (non-temporal) stores        0.90-1.3
// A multi-MiB memcpy stays below glibc's non-temporal threshold here, so each destination line
// is read before it is written; a row-sized memcpy also pays its rep-movsb start-up, and the
// hardware prefetcher stops at every row (a new page). So:
//   - Copy and Unpack of kStreamBytes or more use streaming stores for runs contiguous on both
//     sides (threads S(0)->S(1) at 16 MiB on 4 ranks: 0.78-1.15x raw; with a 2 MiB threshold,
//     which leaves its 1 MiB blocks to memcpy, 0.44-0.56x); smaller copies keep their
//     destination in cache for whoever reads it next;
//   - source rows are prefetched about kPrefetchBytes ahead (1-4 rows here; 4-32 KiB measured
//     alike); Pack prefetches too but never streams: gloo sends the chunk it packs right away.
constexpr int64_t kStreamBytes = int64_t{1} << 20;
constexpr int64_t kPrefetchBytes = 8 << 10;
constexpr int64_t kLine = 64;

#if defined(__SSE2__)
// The widest register the build has: four of them move kBlock bytes (128 with AVX, 64 with SSE2).
#if defined(__AVX__)
using Vec = __m256i;
inline Vec LoadVec(const char* p) { return _mm256_loadu_si256(reinterpret_cast<const Vec*>(p)); }
inline void StreamVec(char* p, Vec v) { _mm256_stream_si256(reinterpret_cast<Vec*>(p), v); }
#else
using Vec = __m128i;
inline Vec LoadVec(const char* p) { return _mm_loadu_si128(reinterpret_cast<const Vec*>(p)); }
inline void StreamVec(char* p, Vec v) { _mm_stream_si128(reinterpret_cast<Vec*>(p), v); }
#endif
constexpr int64_t kVec = sizeof(Vec), kBlock = 4 * kVec;
#endif

// n contiguous bytes with streaming stores (cache-line aligned at the destination), prefetching
// the same offsets of `next` (a source row further on, or null) as we go.
void StreamCopy(char* dst, const char* src, int64_t n, const char* next) {
#if defined(__SSE2__)
  const int64_t head = std::min<int64_t>(n, (kLine - static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) % kLine)) % kLine);
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + kBlock <= n; i += kBlock) {
    if (next != nullptr) {
      for (int64_t line = 0; line < kBlock; line += kLine) __builtin_prefetch(next + i + line);
    }
    const Vec a = LoadVec(src + i), b = LoadVec(src + i + kVec);
    const Vec c = LoadVec(src + i + 2 * kVec), d = LoadVec(src + i + 3 * kVec);
    StreamVec(dst + i, a);
    StreamVec(dst + i + kVec, b);
    StreamVec(dst + i + 2 * kVec, c);
    StreamVec(dst + i + 3 * kVec, d);
  }
  std::memcpy(dst + i, src + i, static_cast<size_t>(n - i));
#else
  (void)next;
  std::memcpy(dst, src, static_cast<size_t>(n));
#endif
}

// n contiguous bytes in 128-byte moves (no rep-movsb start-up per row), prefetching `next` too.
void PrefetchCopy(char* dst, const char* src, int64_t n, const char* next) {
  int64_t i = 0;
  for (; i + 2 * kLine <= n; i += 2 * kLine) {
    __builtin_prefetch(next + i);
    __builtin_prefetch(next + i + kLine);
    std::memcpy(dst + i, src + i, 2 * kLine);
  }
  std::memcpy(dst + i, src + i, static_cast<size_t>(n - i));
}

void StreamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

template <typename T>
void StridedCopy(char* dst, int64_t ds, const char* src, int64_t ss, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
}

// n elements of `esz` bytes, strides in elements; `stream`: see Note [Copying between views].
void CopyRun(char* dst, int64_t ds, const char* src, int64_t ss, int64_t n, int64_t esz, bool stream = false,
             const char* next = nullptr) {
  if ((ds == 1 && ss == 1) || n == 1) {
    if (stream && n * esz >= 2 * kLine) {
      StreamCopy(dst, src, n * esz, next);
    } else if (next != nullptr) {
      PrefetchCopy(dst, src, n * esz, next);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(n * esz));
    }
    return;
  }
  switch (esz) {
    case 1: return StridedCopy<uint8_t>(dst, ds, src, ss, n);
    case 2: return StridedCopy<uint16_t>(dst, ds, src, ss, n);
    case 4: return StridedCopy<uint32_t>(dst, ds, src, ss, n);
    case 8: return StridedCopy<uint64_t>(dst, ds, src, ss, n);
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds * esz, src + i * ss * esz, static_cast<size_t>(esz));
  }
}

}  // namespace

// A position in the stream and the run (row) it is in: `left` elements from `ptr`, `stride` apart.
// Rows advance like an odometer over the part's outer dims.
class ViewStream::Cursor {
 public:
  Cursor(const ViewStream& s, int64_t pos) : s_(s) {
    if (pos >= s.numel_) {
      part_ = s.parts_.size();
      return;
    }
    auto it = std::upper_bound(s.parts_.begin(), s.parts_.end(), pos,
                               [](int64_t p, const Part& a) { return p < a.begin; });
    part_ = static_cast<size_t>(it - s.parts_.begin()) - 1;
    const Part& p = s.parts_[part_];
    const int64_t off = pos - p.begin;
    int64_t row = off / p.inner;
    idx_.assign(p.shape.size() - 1, 0);
    row_offset_ = 0;
    for (int i = static_cast<int>(p.shape.size()) - 2; i >= 0; --i) {
      idx_[i] = row % p.shape[i];
      row /= p.shape[i];
      row_offset_ += idx_[i] * p.strides[i];
    }
    Load(off % p.inner);
  }

  char* ptr = nullptr;
  int64_t left = 0;
  int64_t stride = 1;

  // The start of the row about kPrefetchBytes of data ahead in this view, when it is in the same
  // outer slice (for prefetching; see Note [Copying between views]).
  const char* RowAhead() const {
    if (part_ >= s_.parts_.size()) return nullptr;
    const Part& p = s_.parts_[part_];
    const int64_t ahead = std::clamp<int64_t>(kPrefetchBytes / (p.inner * s_.esz_), 1, 16);
    const int i = static_cast<int>(p.shape.size()) - 2;
    if (i < 0 || idx_[i] + ahead >= p.shape[i]) return nullptr;
    return p.base + (row_offset_ + ahead * p.strides[i]) * s_.esz_;
  }

  void Advance(int64_t k) {
    left -= k;
    if (left > 0) {
      ptr += k * stride * s_.esz_;
      return;
    }
    const Part& p = s_.parts_[part_];
    int i = static_cast<int>(p.shape.size()) - 2;
    for (; i >= 0; --i) {  // next row
      row_offset_ += p.strides[i];
      if (++idx_[i] < p.shape[i]) break;
      row_offset_ -= p.shape[i] * p.strides[i];
      idx_[i] = 0;
    }
    if (i < 0 && ++part_ < s_.parts_.size()) {  // next part
      idx_.assign(s_.parts_[part_].shape.size() - 1, 0);
      row_offset_ = 0;
    }
    if (part_ < s_.parts_.size()) Load(0);
  }

 private:
  void Load(int64_t col) {
    const Part& p = s_.parts_[part_];
    ptr = p.base + (row_offset_ + col * p.inner_stride) * s_.esz_;
    left = p.inner - col;
    stride = p.inner_stride;
  }

  const ViewStream& s_;
  size_t part_ = 0;
  Shape idx_;
  int64_t row_offset_ = 0;
};

ViewStream::ViewStream(const std::vector<Tensor>& views) {
  for (const Tensor& v : views) {
    if (!v.defined() || v.numel() == 0) continue;
    esz_ = DTypeSize(v.dtype());
    StridedLoop loop(v.shape(), v.strides(), {});
    Part p;
    p.base = static_cast<char*>(v.raw_data());
    p.shape = loop.shape;
    p.strides = loop.strides[0];
    p.inner = loop.inner();
    p.inner_stride = p.strides.back();
    p.begin = numel_;
    numel_ += v.numel();
    parts_.push_back(std::move(p));
  }
}

void ViewStream::Pack(int64_t begin, int64_t n, void* out) const {
  char* o = static_cast<char*>(out);
  Cursor c(*this, begin);
  while (n > 0) {
    const int64_t k = std::min(n, c.left);
    CopyRun(o, 1, c.ptr, c.stride, k, esz_, /*stream=*/false, c.RowAhead());
    o += k * esz_;
    n -= k;
    c.Advance(k);
  }
}

void ViewStream::Unpack(int64_t begin, int64_t n, const void* in) const {
  const char* i = static_cast<const char*>(in);
  const bool stream = n * esz_ >= kStreamBytes;
  Cursor c(*this, begin);
  while (n > 0) {
    const int64_t k = std::min(n, c.left);
    CopyRun(c.ptr, c.stride, i, 1, k, esz_, stream);
    i += k * esz_;
    n -= k;
    c.Advance(k);
  }
  if (stream) StreamFence();
}

char* ViewStream::Contiguous(int64_t begin, int64_t n) const {
  if (n <= 0 || begin + n > numel_) return nullptr;
  Cursor c(*this, begin);
  return c.left >= n && (c.stride == 1 || n == 1) ? c.ptr : nullptr;
}

void ViewStream::Copy(const ViewStream& dst, const ViewStream& src) {
  int64_t n = std::min(dst.numel_, src.numel_);
  const bool stream = n * dst.esz_ >= kStreamBytes;
  Cursor d(dst, 0), s(src, 0);
  while (n > 0) {
    const int64_t k = std::min({n, d.left, s.left});
    CopyRun(d.ptr, d.stride, s.ptr, s.stride, k, dst.esz_, stream, s.RowAhead());
    n -= k;
    d.Advance(k);
    s.Advance(k);
  }
  if (stream) StreamFence();
}

}  // namespace dt::internal
