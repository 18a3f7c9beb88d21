#pragma once
// Internal to mesh/: the elements of a list of strided host views as one stream — the layout
// contract of all_to_all_views (see Note [All-to-all over views] in mesh/collective.h): each view
// in row-major order, the views one after another. Backends copy between two streams directly
// (threads), or pack/unpack ranges of a stream around a transport that wants contiguous bytes
// (gloo's chunks, the default path's staging buffer).
//
//   views (f32)                           stream
//   x[0:2, 1:3] of x = [[0,1,2],[3,4,5]]  1 2 4 5
//   then y = [7]                          1 2 4 5 7
//
// Only shapes, strides and the element size matter: no dtype conversion, any element size.

#include <cstdint>
#include <vector>

#include "dtensor/core/tensor.h"

namespace dt::internal {

class ViewStream {
 public:
  ViewStream() = default;
  // `views`: host tensors of one element size; zero-size views are skipped.
  explicit ViewStream(const std::vector<Tensor>& views);

  int64_t numel() const { return numel_; }

  // Elements [begin, begin + n) of the stream to contiguous `out`, or from contiguous `in`.
  void Pack(int64_t begin, int64_t n, void* out) const;
  void Unpack(int64_t begin, int64_t n, const void* in) const;
  // The address of element `begin` when elements [begin, begin + n) are contiguous in memory
  // (n > 0), else null: such a range needs no packing.
  char* Contiguous(int64_t begin, int64_t n) const;
  // Copies every element of `src` into `dst` (same numel and element size), run by run.
  static void Copy(const ViewStream& dst, const ViewStream& src);

 private:
  // One non-empty view, its dims coalesced (core/strided.h): runs of `inner` elements.
  struct Part {
    char* base = nullptr;
    Shape shape, strides;  // coalesced; innermost last
    int64_t inner = 0, inner_stride = 0;
    int64_t begin = 0;  // stream position of its first element
  };
  class Cursor;

  std::vector<Part> parts_;
  int64_t numel_ = 0;
  int64_t esz_ = 1;
};

}  // namespace dt::internal
