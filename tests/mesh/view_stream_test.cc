// ViewStream (mesh/view_stream.h): the element stream of a list of strided views, checked against
// reading the views element by element (Tensor::ToDoubles, row-major), including the streaming
// copy of large runs at odd alignments (Note [Copying between views]).

#include <vector>

#include "gtest/gtest.h"
#include "dtensor/mesh/view_stream.h"
#include "rapidcheck/gtest.h"

namespace dt::internal {
namespace {

// The stream read directly: every view's elements in row-major order, one view after another.
std::vector<double> Direct(const std::vector<Tensor>& views) {
  std::vector<double> out;
  for (const Tensor& v : views) {
    const std::vector<double> d = v.ToDoubles();
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

// A view of `shape` with arbitrary strides: `perm` of a base padded by `pad`, narrowed back. The
// base holds distinct values (its flat index + offset, wrapped to the dtype).
Tensor Strided(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, const std::vector<int64_t>& pad,
               DType dtype, double offset) {
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> base(nd), inverse(nd);
  for (int i = 0; i < nd; ++i) base[i] = shape[perm[i]] + pad[i];
  for (int i = 0; i < nd; ++i) inverse[perm[i]] = i;
  const int64_t numel = Numel(base);
  std::vector<double> vals(numel);
  for (int64_t i = 0; i < numel; ++i) vals[i] = static_cast<double>(static_cast<int64_t>(i + offset) % 100);
  Tensor v = Tensor::FromDoubles(base, vals, dtype).value().Permute(inverse).value();
  for (int d = 0; d < nd; ++d) v = v.Narrow(d, pad[inverse[d]] / 2, shape[d]).value();
  return v;
}

std::vector<Tensor> RandomViews(DType dtype, double offset) {
  const int count = *rc::gen::inRange(1, 4);
  std::vector<Tensor> views;
  for (int k = 0; k < count; ++k) {
    const int nd = *rc::gen::inRange(1, 4);
    const auto shape = *rc::gen::container<std::vector<int64_t>>(nd, rc::gen::inRange<int64_t>(0, 6));
    std::vector<int64_t> perm(nd);
    for (int i = 0; i < nd; ++i) perm[i] = i;
    for (int i = nd; i > 1; --i) std::swap(perm[i - 1], perm[*rc::gen::inRange(0, i)]);
    const auto pad = *rc::gen::container<std::vector<int64_t>>(nd, rc::gen::inRange<int64_t>(0, 3));
    views.push_back(Strided(shape, perm, pad, dtype, offset + 1000 * k));
  }
  return views;
}

const auto kDTypes = rc::gen::element(DType::kF32, DType::kF16, DType::kI64, DType::kU8, DType::kBool);

RC_GTEST_PROP(ViewStream, PackUnpackAndContiguousMatchTheViews, ()) {
  const DType dtype = *kDTypes;
  const std::vector<Tensor> views = RandomViews(dtype, 0);
  const ViewStream s(views);
  const std::vector<double> want = Direct(views);
  RC_ASSERT(s.numel() == static_cast<int64_t>(want.size()));
  const int64_t begin = *rc::gen::inRange<int64_t>(0, s.numel() + 1);
  const int64_t n = *rc::gen::inRange<int64_t>(0, s.numel() - begin + 1);
  // Pack: elements [begin, begin + n) of the stream.
  Tensor packed = Tensor::Empty({n}, dtype).value();
  s.Pack(begin, n, packed.raw_data());
  const std::vector<double> got = packed.ToDoubles();
  RC_ASSERT(got == std::vector<double>(want.begin() + begin, want.begin() + begin + n));
  // Contiguous: a pointer only where the range really is contiguous memory holding those values.
  if (char* at = s.Contiguous(begin, n)) {
    RC_ASSERT(std::memcmp(at, packed.raw_data(), static_cast<size_t>(n * DTypeSize(dtype))) == 0);
  }
  // Unpack: writes exactly that range of the views.
  std::vector<double> fill(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) fill[i] = dtype == DType::kBool ? 1 - got[i] : static_cast<double>((i * 7 + 3) % 90);
  s.Unpack(begin, n, Tensor::FromDoubles({n}, fill, dtype).value().raw_data());
  std::vector<double> expect = want;
  std::copy(fill.begin(), fill.end(), expect.begin() + begin);
  RC_ASSERT(Direct(views) == expect);
}

RC_GTEST_PROP(ViewStream, CopyPairsTwoListsOfDifferentShapes, ()) {
  const DType dtype = *kDTypes;
  const std::vector<Tensor> src = RandomViews(dtype, 0);
  const ViewStream s(src);
  // The destination: the same count as a 1-d strided view and a 2-d transposed one.
  const int64_t total = s.numel(), rows = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t second = total / rows * rows, first = total - second;
  Tensor a = Tensor::Zeros({2 * first + 1}, dtype).value();
  const std::vector<Tensor> dst = {a.View({first * 2 + 1}).value().Narrow(0, 1, 2 * first).value().View({first, 2}).value().Select(1, 0).value(),
                                   Tensor::Zeros({second / rows, rows}, dtype).value().Transpose(0, 1).value()};
  ViewStream::Copy(ViewStream(dst), s);
  RC_ASSERT(Direct(dst) == Direct(src));
}

TEST(ViewStream, LargeCopiesStreamAtAnyAlignment) {
  // Runs of a few KiB, more than the streaming threshold in all, at destinations and sources that
  // are not cache-line aligned, strided source rows (prefetched) and a contiguous destination.
  for (int64_t shift : {0, 1, 3, 17}) {
    for (DType dtype : {DType::kF32, DType::kU8, DType::kI64}) {
      const int64_t rows = 300, cols = 1000 + shift;
      std::vector<double> vals(static_cast<size_t>(rows * (2 * cols + 5)));
      for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<double>(i % 97);
      Tensor base = Tensor::FromDoubles({rows, 2 * cols + 5}, vals, dtype).value();
      Tensor src = base.Narrow(1, shift, cols).value();  // rows of `cols`, stride 2*cols+5
      Tensor out = Tensor::Zeros({rows * cols + 64}, dtype).value();
      Tensor dst = out.Narrow(0, shift, rows * cols).value().View({rows, cols}).value();
      ViewStream::Copy(ViewStream({dst}), ViewStream({src}));
      EXPECT_TRUE(Equal(dst.Contiguous().value(), src.Contiguous().value())) << DTypeName(dtype) << " shift " << shift;
      EXPECT_EQ(out.Narrow(0, 0, shift).value().ToDoubles(), std::vector<double>(shift, 0.0));
      EXPECT_EQ(out.Narrow(0, shift + rows * cols, 64 - shift).value().ToDoubles(), std::vector<double>(64 - shift, 0.0));
      // And back, unpacking a contiguous buffer into the strided rows.
      Tensor again = Tensor::Zeros({rows, 2 * cols + 5}, dtype).value();
      ViewStream({again.Narrow(1, shift, cols).value()}).Unpack(0, rows * cols, dst.raw_data());
      EXPECT_TRUE(Equal(again.Narrow(1, shift, cols).value().Contiguous().value(), src.Contiguous().value()));
    }
  }
}

}  // namespace
}  // namespace dt::internal
