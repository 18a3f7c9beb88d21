// Views and copies of core/tensor.h against plain index arithmetic.
//
// A "model" pairs a Tensor with a function giving the value each logical index must hold. The base
// tensor holds its row-major flat index as value; every view applied to the tensor is applied to the
// model as index arithmetic, and at the end every element is read back through the tensor's own
// strides (raw pointer arithmetic) and through ToDoubles.

#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/core/storage.h"
#include "dtensor/core/tensor.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

using Index = Shape;
using ValueFn = std::function<double(const Index&)>;

struct Model {
  Tensor t;
  ValueFn value;
};

int64_t Flat(const Index& idx, IntSpan shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
Index Unravel(int64_t flat, IntSpan shape) {
  Index idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

Shape RandomShape(int max_rank, int64_t max_size) {
  Shape s;
  for (int i = *rc::gen::inRange(0, max_rank + 1); i > 0; --i) s.push_back(*rc::gen::inRange<int64_t>(0, max_size + 1));
  return s;
}

// Element `idx` read through the strides (f32 tensors only).
double RawAt(const Tensor& t, const Index& idx) {
  int64_t off = 0;
  for (int d = 0; d < t.dim(); ++d) off += idx[d] * t.stride(d);
  return t.data<float>()[off];
}

// "" when every element of m.t equals m.value (read raw and through ToDoubles), else the first
// difference.
std::string Check(const Model& m) {
  const std::vector<double> all = m.t.ToDoubles();
  if (static_cast<int64_t>(all.size()) != m.t.numel()) return "ToDoubles size";
  for (int64_t i = 0; i < m.t.numel(); ++i) {
    const Index idx = Unravel(i, m.t.shape());
    const double want = m.value(idx);
    if (all[i] != want || (m.t.dtype() == DType::kF32 && RawAt(m.t, idx) != want)) {
      return absl::StrCat("at ", ShapeToString(idx), " of ", m.t.Describe(), " strides ",
                          ShapeToString(m.t.strides()), ": got ", all[i], ", want ", want);
    }
  }
  return "";
}

Model Base(IntSpan shape) {
  std::vector<double> v(static_cast<size_t>(Numel(shape)));
  std::iota(v.begin(), v.end(), 0.0);
  const Shape s(shape.begin(), shape.end());
  return {Tensor::FromDoubles(shape, v).value(), [s](const Index& idx) { return static_cast<double>(Flat(idx, s)); }};
}

// Applies one random view (or Reshape) to the model; returns false when none applies.
bool RandomView(Model* m) {
  const Tensor& t = m->t;
  const int nd = t.dim();
  const ValueFn f = m->value;
  const Shape shape = t.shape();
  switch (*rc::gen::inRange(0, 10)) {
    case 0: {  // Narrow
      if (nd == 0) return false;
      const int d = *rc::gen::inRange(0, nd);
      const int64_t start = *rc::gen::inRange<int64_t>(0, shape[d] + 1);
      const int64_t len = *rc::gen::inRange<int64_t>(0, shape[d] - start + 1);
      m->t = t.Narrow(d, start, len).value();
      m->value = [f, d, start](Index idx) { idx[d] += start; return f(idx); };
      return true;
    }
    case 1: {  // Select
      if (nd == 0) return false;
      const int d = *rc::gen::inRange(0, nd);
      if (shape[d] == 0) return false;
      const int64_t i = *rc::gen::inRange<int64_t>(0, shape[d]);
      m->t = t.Select(*rc::gen::arbitrary<bool>() ? d : d - nd, i).value();
      m->value = [f, d, i](Index idx) { idx.insert(idx.begin() + d, i); return f(idx); };
      return true;
    }
    case 2: {  // Transpose
      if (nd == 0) return false;
      const int a = *rc::gen::inRange(0, nd), b = *rc::gen::inRange(0, nd);
      m->t = t.Transpose(a, b).value();
      m->value = [f, a, b](Index idx) { std::swap(idx[a], idx[b]); return f(idx); };
      return true;
    }
    case 3: {  // Permute
      std::vector<int64_t> p(static_cast<size_t>(nd));
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), std::mt19937(*rc::gen::arbitrary<uint32_t>()));
      m->t = t.Permute(p).value();
      m->value = [f, p](const Index& idx) {
        Index src(idx.size());
        for (size_t j = 0; j < p.size(); ++j) src[p[j]] = idx[j];
        return f(src);
      };
      return true;
    }
    case 4:
    case 5: {  // View (when the strides allow it) or Reshape, to a random factorisation
      const int64_t n = t.numel();
      Shape ns;
      int64_t left = n;
      for (int i = *rc::gen::inRange(0, 3); i > 0 && left > 1; --i) {
        std::vector<int64_t> divisors;
        for (int64_t q = 1; q <= left; ++q) {
          if (left % q == 0) divisors.push_back(q);
        }
        ns.push_back(*rc::gen::elementOf(divisors));
        left /= ns.back();
      }
      ns.push_back(left);
      if (n == 0) ns = {*rc::gen::inRange<int64_t>(0, 3), 0};
      auto v = t.View(ns);
      const bool viewed = v.ok();
      m->t = viewed ? *v : t.Reshape(ns).value();
      const bool shared = m->t.storage().data() == t.storage().data();
      if (viewed) RC_ASSERT(shared);
      m->value = [f, shape, ns](const Index& idx) { return f(Unravel(Flat(idx, ns), shape)); };
      return true;
    }
    case 6: {  // Unsqueeze
      const int d = *rc::gen::inRange(0, nd + 1);
      m->t = t.Unsqueeze(d).value();
      m->value = [f, d](Index idx) { idx.erase(idx.begin() + d); return f(idx); };
      return true;
    }
    case 7: {  // Squeeze a size-1 dim
      std::vector<int> ones;
      for (int d = 0; d < nd; ++d) {
        if (shape[d] == 1) ones.push_back(d);
      }
      if (ones.empty()) return false;
      const int d = *rc::gen::elementOf(ones);
      m->t = t.Squeeze(d).value();
      m->value = [f, d](Index idx) { idx.insert(idx.begin() + d, 0); return f(idx); };
      return true;
    }
    case 8: {  // Expand size-1 dims and add leading dims
      Shape ns;
      const int lead = *rc::gen::inRange(0, 3);
      for (int i = 0; i < lead; ++i) ns.push_back(*rc::gen::inRange<int64_t>(0, 4));
      for (int64_t s : shape) ns.push_back(s == 1 ? *rc::gen::inRange<int64_t>(0, 4) : (*rc::gen::arbitrary<bool>() ? s : -1));
      m->t = t.Expand(ns).value();
      m->value = [f, shape, lead](const Index& idx) {
        Index src(shape.size());
        for (size_t d = 0; d < shape.size(); ++d) src[d] = shape[d] == 1 ? 0 : idx[lead + d];
        return f(src);
      };
      return true;
    }
    case 9: {  // Flatten a range of dims
      if (nd == 0) return false;
      const int a = *rc::gen::inRange(0, nd), b = *rc::gen::inRange(a, nd);
      m->t = t.Flatten(a, b).value();
      // Flatten keeps the row-major order: the new index maps through the flat position.
      const Shape ns = m->t.shape();
      m->value = [f, shape, ns](const Index& idx) { return f(Unravel(Flat(idx, ns), shape)); };
      return true;
    }
  }
  return false;
}

RC_GTEST_PROP(TensorViewTest, ChainsOfViewsAgreeWithIndexArithmetic, ()) {
  Model m = Base(RandomShape(4, 4));
  const void* storage = m.t.storage().data();
  bool copied = false;
  for (int steps = *rc::gen::inRange(1, 5); steps > 0; --steps) {
    const void* before = m.t.storage().data();
    if (!RandomView(&m)) continue;
    copied |= m.t.storage().data() != before;
    RC_ASSERT(Check(m) == "");
  }
  // Only Reshape of a non-viewable layout may copy.
  const bool shared = m.t.storage().data() == storage;
  RC_ASSERT(copied || shared);
}

RC_GTEST_PROP(TensorCopyTest, CopiesAgreeWithIndexArithmetic, ()) {
  Model m = Base(RandomShape(4, 4));
  for (int steps = *rc::gen::inRange(0, 4); steps > 0; --steps) RandomView(&m);
  // Contiguous / Clone.
  const Tensor c = m.t.Contiguous().value();
  RC_ASSERT(c.is_contiguous());
  RC_ASSERT(Check({c, m.value}) == "");
  const Tensor cl = m.t.Clone().value();
  RC_ASSERT(cl.is_contiguous());
  const bool fresh = cl.storage().data() != m.t.storage().data();
  RC_ASSERT(fresh);
  RC_ASSERT(Check({cl, m.value}) == "");
  // To(dtype): values below 2^8 are exact in every float dtype; integers and bool convert.
  const DType dtype = *rc::gen::elementOf(std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const Tensor conv = m.t.To(dtype).value();
  RC_ASSERT(conv.dtype() == dtype);
  const ValueFn f = m.value;
  const ValueFn want = [f, dtype](const Index& idx) {
    const double v = f(idx);
    switch (dtype) {
      case DType::kBool: return v != 0 ? 1.0 : 0.0;
      case DType::kU8: return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v)));
      case DType::kBF16: return static_cast<double>(BFloat16(static_cast<float>(v)));
      case DType::kF16: return static_cast<double>(Float16(static_cast<float>(v)));
      default: return v;
    }
  };
  RC_ASSERT(Check({conv, want}) == "");
  // CopyFrom into a destination with its own random (transposed) layout.
  Model dst = Base(m.t.shape());
  if (dst.t.dim() >= 2) {
    Shape rev(m.t.shape().rbegin(), m.t.shape().rend());
    dst.t = Tensor::Zeros(rev).value();
    std::vector<int64_t> p(rev.size());
    std::iota(p.rbegin(), p.rend(), 0);
    dst.t = dst.t.Permute(p).value();
  }
  RC_ASSERT(dst.t.CopyFrom(m.t).ok());
  RC_ASSERT(Check({dst.t, m.value}) == "");
}

// Note [Host block cache] (core/storage.cc): a freed host block of 64 KiB or more serves the next
// request it fits (within 1/8); small blocks and blocks over the cache's 64 MiB go back to malloc;
// under AddressSanitizer nothing is kept, so that a use after free is still caught.
TEST(StorageTest, FreedLargeBlocksServeTheNextRequest) {
  void* first = nullptr;
  {
    const Storage a = Storage::Allocate(int64_t{1} << 20, kCPU).value();
    first = a.data();
    std::memset(a.data(), 1, a.nbytes());
  }
  {
    const Storage b = Storage::Allocate((int64_t{1} << 20) - 1000, kCPU).value();
    EXPECT_EQ(b.data() == first, kHostBlockCache);
    const Storage c = Storage::Allocate(int64_t{1} << 20, kCPU).value();  // b holds that one
    EXPECT_NE(c.data(), b.data());
  }
  // Both 1 MiB blocks are free again: a 2 MiB request fits neither.
  const Storage larger = Storage::Allocate(int64_t{2} << 20, kCPU).value();
  EXPECT_NE(larger.data(), first);
}

TEST(TensorTest, Errors) {
  const Tensor x = Tensor::Zeros({2, 3}).value();
  auto s = x.Narrow(1, 2, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(dt::testing::Contains(s, "Narrow(dim 1, start 2, length 2) out of range for size 3"));
  s = x.Select(0, 2).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Select(dim 0, index 2) out of range"));
  s = x.Transpose(0, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dt::testing::Contains(s, "Transpose: dim1 2 is out of range for a tensor of 2 dims"));
  s = x.Permute({0, 0}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Permute: dim 0 repeated"));
  s = x.Transpose(0, 1).value().View({6}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "without a copy; use Reshape"));
  s = x.View({4, -1}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "View: cannot infer -1"));
  s = x.Reshape({5}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Reshape: shape [5] has 5 elements, the tensor has 6"));
  s = x.Squeeze(0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Squeeze: dim 0 of f32[2, 3] cpu has size 2, not 1"));
  s = x.Expand({4, 3}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Expand: cannot expand f32[2, 3] cpu to [4, 3]"));
  s = Tensor::Zeros({1}).value().Expand({-2}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = x.Flatten(1, 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Flatten: start_dim 1 is after end_dim 0 for f32[2, 3] cpu"));
  s = x.CopyFrom(Tensor::Zeros({3, 2}).value());
  EXPECT_TRUE(dt::testing::Contains(s, "CopyFrom: shape [3, 2] into [2, 3]"));
  s = Tensor::Empty({2, -1}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Empty: negative size in shape [2, -1]"));
  s = Tensor::FromDoubles({2}, {1, 2, 3}).status();
  EXPECT_TRUE(dt::testing::Contains(s, "FromDoubles: shape [2] has 2 elements, got 3 values"));
  s = Tensor::Arange(0, 1, 0).status();
  EXPECT_TRUE(dt::testing::Contains(s, "Arange(0, 1, 0): bad range"));
}

TEST(TensorTest, Golden) {
  const Tensor x = Tensor::Arange(0, 6).value().View({2, 3}).value();
  const Tensor col = x.Select(1, 2).value();
  EXPECT_EQ(col.ToVector<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(col.stride(0), 3);
  EXPECT_EQ(x.Transpose(0, 1).value().Contiguous().value().ToVector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(x.ToString(), "tensor([[0, 1, 2], [3, 4, 5]], f32)");
  EXPECT_EQ(x.Describe(), "f32[2, 3] cpu");
  // Float -> integer conversion truncates toward zero and wraps; NaN gives 0.
  const Tensor f = Tensor::FromVector<float>({4}, {-1.5f, 2.7f, 300.0f, NAN}).value();
  EXPECT_EQ(f.To(DType::kU8).value().ToVector<int64_t>(), (std::vector<int64_t>{255, 2, 44, 0}));
  EXPECT_EQ(f.To(DType::kI32).value().ToVector<int64_t>(), (std::vector<int64_t>{-1, 2, 300, 0}));
  EXPECT_EQ(f.To(DType::kBool).value().ToVector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_TRUE(AllClose(x, x).ok());
  const auto s = AllClose(x, Tensor::Zeros({2, 3}).value());
  EXPECT_TRUE(dt::testing::Contains(s, "at [0, 1]: got 1, want 0"));
}

}  // namespace
}  // namespace dt

namespace dt {
namespace {

TEST(TensorCompare, MaxRelativeDiffIsRelativeToTheReferenceScale) {
  const Tensor want = Tensor::FromVector<float>({3}, {1.0f, -4.0f, 2.0f}).value();
  const Tensor got = Tensor::FromVector<float>({3}, {1.5f, -4.0f, 2.0f}).value();
  EXPECT_DOUBLE_EQ(MaxRelativeDiff(got, want).value(), 0.5 / 4.0);
  EXPECT_DOUBLE_EQ(MaxRelativeDiff(want, want).value(), 0.0);
  const Tensor zeros = Tensor::Zeros({3}, DType::kF32).value();
  EXPECT_DOUBLE_EQ(MaxRelativeDiff(got, zeros).value(), 4.0);  // no scale: the absolute diff
  const Tensor nan = Tensor::FromVector<float>({3}, {1.0f, NAN, 2.0f}).value();
  EXPECT_TRUE(std::isinf(MaxRelativeDiff(nan, want).value()));
  EXPECT_FALSE(MaxRelativeDiff(Tensor::Zeros({2}, DType::kF32).value(), want).ok());
}

}  // namespace
}  // namespace dt
