#include "dtensor/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/core/quant.h"
#include "dtensor/core/strided.h"

namespace dt {

namespace {

absl::Status CheckShape(IntSpan shape, absl::string_view op) {
  for (int64_t s : shape) {
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": negative size in shape ", ShapeToString(shape)));
    }
  }
  return absl::OkStatus();
}

// Float -> integer truncates toward zero, saturates to the i64 range (NaN gives 0) and then wraps
// to the destination's width, so that no value is undefined behaviour (a plain static_cast of an
// out-of-range float is): -1.5 -> u8 gives 255, like PyTorch on x86.
template <typename D>
inline D FloatToInt(double v) {
  int64_t i = 0;
  if (v >= 9223372036854775807.0) {
    i = INT64_MAX;
  } else if (v <= -9223372036854775808.0) {
    i = INT64_MIN;
  } else if (v == v) {
    i = static_cast<int64_t>(v);
  }
  return static_cast<D>(i);
}

template <typename D, typename S>
inline D Convert(S v) {
  constexpr bool kSrcFloat = std::is_floating_point_v<S> || std::is_same_v<S, BFloat16> ||
                             std::is_same_v<S, Float16>;
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, bool>) {
    return static_cast<double>(v) != 0.0;
  } else if constexpr (std::is_same_v<D, BFloat16> || std::is_same_v<D, Float16>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<D> && kSrcFloat) {
    return FloatToInt<D>(static_cast<double>(v));
  } else if constexpr (std::is_same_v<S, BFloat16> || std::is_same_v<S, Float16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// One element at any address (Note [Unaligned host elements]); a bool is its byte, nonzero true.
template <typename S>
S LoadElement(const char* p) {
  if constexpr (std::is_same_v<S, bool>) {
    uint8_t byte;
    std::memcpy(&byte, p, 1);
    return byte != 0;
  } else {
    S v;
    std::memcpy(&v, p, sizeof(S));
    return v;
  }
}

thread_local CopyCount host_copies;

// Copies elements of `src` into `dst` (both on the host), converting dtypes.
void HostCopy(const Tensor& dst, const Tensor& src) {
  internal::StridedLoop loop(dst.shape(), dst.strides(), src.strides());
  const int64_t ds = loop.strides[0].back(), ss = loop.strides[1].back();
  char* dbase = static_cast<char*>(dst.raw_data());
  const char* sbase = static_cast<const char*>(src.raw_data());
  // Note [Unaligned host elements]
  // Elements are read and written through memcpy, never through a typed pointer: a tensor may view
  // a mapped checkpoint whose data starts at any byte (safetensors allows any header length), and
  // a typed load from a misaligned address is undefined behaviour. On x86 and ARM64 the memcpy of
  // one element compiles to the same single load or store. A copy without conversion moves bytes
  // and never looks at them (a file's byte need not be a valid bool); a bool converted to another
  // dtype is read as a byte, nonzero meaning true.
  if (dst.dtype() == src.dtype()) {
    const int64_t esz = DTypeSize(dst.dtype());
    loop.ForEachRun([&](int64_t o0, int64_t o1, int64_t n) {
      char* dp = dbase + o0 * esz;
      const char* sp = sbase + o1 * esz;
      if (ds == 1 && ss == 1) {
        std::memcpy(dp, sp, static_cast<size_t>(n * esz));
        return;
      }
      // A constant element size, so that each memcpy is one load and one store.
      auto strided = [&](auto size) {
        constexpr int64_t k = decltype(size)::value;
        for (int64_t i = 0; i < n; ++i) std::memcpy(dp + i * ds * k, sp + i * ss * k, k);
      };
      switch (esz) {
        case 1: strided(std::integral_constant<int64_t, 1>()); break;
        case 2: strided(std::integral_constant<int64_t, 2>()); break;
        case 4: strided(std::integral_constant<int64_t, 4>()); break;
        default: strided(std::integral_constant<int64_t, 8>()); break;
      }
    });
    return;
  }
  DT_DISPATCH_DTYPE(dst.dtype(), D, [&] {
    DT_DISPATCH_DTYPE(src.dtype(), S, [&] {
      loop.ForEachRun([&](int64_t o0, int64_t o1, int64_t n) {
        char* dp = dbase + o0 * static_cast<int64_t>(sizeof(D));
        const char* sp = sbase + o1 * static_cast<int64_t>(sizeof(S));
        for (int64_t i = 0; i < n; ++i) {
          const D w = Convert<D>(LoadElement<S>(sp + i * ss * static_cast<int64_t>(sizeof(S))));
          std::memcpy(dp + i * ds * static_cast<int64_t>(sizeof(D)), &w, sizeof(D));
        }
      });
    });
  });
}

// The rows of `t` (every dim but the last) as element offsets, in row-major order.
std::vector<int64_t> RowOffsets(const Tensor& t) {
  const Shape lead(t.shape().begin(), t.shape().end() - 1);
  const Shape strides(t.strides().begin(), t.strides().end() - 1);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(Numel(lead)));
  Shape idx(lead.size(), 0);
  for (int64_t r = 0; r < Numel(lead); ++r) {
    int64_t off = 0;
    for (size_t d = 0; d < lead.size(); ++d) off += idx[d] * strides[d];
    out.push_back(off);
    for (int d = static_cast<int>(lead.size()) - 1; d >= 0; --d) {
      if (++idx[d] < lead[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

absl::Status CheckRows(const Tensor& t, absl::string_view what) {
  if (t.dim() < 1 || (t.size(-1) > 1 && t.stride(-1) != 1)) {
    return absl::UnimplementedError(absl::StrCat("CopyFrom: ", what, " ", t.Describe(),
                                                 " must have rows with unit stride (quantized)"));
  }
  return CheckQuantizedShape(t.dtype(), t.shape());
}

// Tensor::CopyFrom when either side is quantized (Note [Quantized dtypes] in core/quant.h): same
// quantized dtype, rows with unit stride: the blocks are copied; quantized into an element dtype:
// dequantized, then converted; anything else is Unimplemented naming both.
absl::Status CopyQuantized(const Tensor& dst, const Tensor& src) {
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat("CopyFrom ", src.Describe(), " into ",
                                                 dst.Describe(),
                                                 ": quantized tensors live on the CPU"));
  }
  if (dst.dtype() == src.dtype()) {
    DT_RETURN_IF_ERROR(CheckRows(src, "source"));
    DT_RETURN_IF_ERROR(CheckRows(dst, "destination"));
    const int64_t row = DTypeBytes(src.dtype(), src.size(-1));
    const std::vector<int64_t> so = RowOffsets(src), d_o = RowOffsets(dst);
    const DType q = src.dtype();
    for (size_t r = 0; r < so.size(); ++r) {
      std::memcpy(static_cast<char*>(dst.raw_data()) + DTypeBytes(q, d_o[r]),
                  static_cast<const char*>(src.raw_data()) + DTypeBytes(q, so[r]),
                  static_cast<size_t>(row));
    }
    return absl::OkStatus();
  }
  if (IsQuantized(src.dtype()) && !IsQuantized(dst.dtype())) {
    DT_RETURN_IF_ERROR(CheckRows(src, "source"));
    DT_ASSIGN_OR_RETURN(Tensor f, Tensor::Empty(src.shape(), DType::kF32));
    const int64_t cols = src.size(-1);
    const std::vector<int64_t> so = RowOffsets(src);
    for (size_t r = 0; r < so.size(); ++r) {
      DequantizeBlocks(src.dtype(),
                       static_cast<const char*>(src.raw_data()) + DTypeBytes(src.dtype(), so[r]),
                       cols, f.data<float>() + static_cast<int64_t>(r) * cols);
    }
    return dst.CopyFrom(f);
  }
  return absl::UnimplementedError(absl::StrCat(
      "CopyFrom ", src.Describe(), " into ", dst.Describe(),
      ": quantizing is not supported (only quantized -> element dtypes and same-dtype copies)"));
}

// Strides for viewing (shape, strides) as new_shape without copying, or nullopt (PyTorch's rule).
std::optional<Shape> ViewStrides(IntSpan old_shape, IntSpan old_strides, IntSpan new_shape) {
  Shape out(new_shape.size());
  if (Numel(old_shape) == 0 || old_shape.empty()) {
    return ContiguousStrides(new_shape);
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor::Tensor(Storage storage, Shape shape, Shape strides, int64_t storage_offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      storage_offset_(storage_offset),
      dtype_(dtype) {}

absl::StatusOr<Tensor> Tensor::Empty(IntSpan shape, DType dtype, Device device) {
  DT_RETURN_IF_ERROR(CheckShape(shape, "Empty"));
  if (IsQuantized(dtype)) DT_RETURN_IF_ERROR(CheckQuantizedShape(dtype, shape));
  DT_ASSIGN_OR_RETURN(Storage st, Storage::Allocate(DTypeBytes(dtype, Numel(shape)), device));
  return Tensor(std::move(st), Shape(shape.begin(), shape.end()), ContiguousStrides(shape), 0, dtype);
}

absl::StatusOr<Tensor> Tensor::Full(IntSpan shape, double value, DType dtype, Device device) {
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape, dtype, device));
  DT_RETURN_IF_ERROR(t.Fill(value));
  return t;
}
absl::StatusOr<Tensor> Tensor::Zeros(IntSpan shape, DType dtype, Device device) {
  return Full(shape, 0.0, dtype, device);
}
absl::StatusOr<Tensor> Tensor::Ones(IntSpan shape, DType dtype, Device device) {
  return Full(shape, 1.0, dtype, device);
}

absl::StatusOr<Tensor> Tensor::Arange(double start, double end, double step, DType dtype, Device device) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step) ||
      (end - start) * step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Arange(", start, ", ", end, ", ", step,
                                                   "): bad range"));
  }
  const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i) * step;
  DT_ASSIGN_OR_RETURN(Tensor t, FromDoubles({n}, v, dtype));
  if (device.is_cpu()) return t;
  return t.To(device);
}

absl::StatusOr<Tensor> Tensor::FromDoubles(IntSpan shape, const std::vector<double>& values, DType dtype) {
  DT_RETURN_IF_ERROR(CheckShape(shape, "FromDoubles"));
  if (Numel(shape) != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("FromDoubles: shape ", ShapeToString(shape), " has ",
                                                   Numel(shape), " elements, got ", values.size(), " values"));
  }
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape, dtype));
  DT_DISPATCH_DTYPE(dtype, T, [&] {
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = Convert<T>(values[i]);
  });
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (shape_[i] == 0) return true;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

absl::StatusOr<Tensor> Tensor::Narrow(int64_t dim, int64_t start, int64_t length) const {
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, this->dim(), "Narrow: dim"));
  if (start < 0 || length < 0 || start + length > shape_[d]) {
    return absl::OutOfRangeError(absl::StrCat("Narrow(dim ", d, ", start ", start, ", length ", length,
                                              ") out of range for size ", shape_[d], " of ", Describe()));
  }
  if (IsQuantized(dtype_) && d == this->dim() - 1 &&
      (start % DTypeBlock(dtype_) != 0 || length % DTypeBlock(dtype_) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("Narrow(dim ", d, ", start ", start, ", length ",
                                                   length, ") of ", Describe(), ": not whole ",
                                                   DTypeBlock(dtype_), "-element blocks"));
  }
  Tensor t = *this;
  t.shape_[d] = length;
  if (length > 0) t.storage_offset_ += start * strides_[d];
  return t;
}

absl::StatusOr<Tensor> Tensor::Select(int64_t dim, int64_t index) const {
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, this->dim(), "Select: dim"));
  const int64_t i = index < 0 ? index + shape_[d] : index;
  if (i < 0 || i >= shape_[d]) {
    return absl::OutOfRangeError(absl::StrCat("Select(dim ", d, ", index ", index,
                                              ") out of range for size ", shape_[d], " of ", Describe()));
  }
  if (IsQuantized(dtype_) && d == this->dim() - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Select(dim ", d, ") of ", Describe(), ": an element of a block"));
  }
  Tensor t = *this;
  t.storage_offset_ += i * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

absl::StatusOr<Tensor> Tensor::Transpose(int64_t dim0, int64_t dim1) const {
  DT_ASSIGN_OR_RETURN(int a, NormalizeDim(dim0, dim(), "Transpose: dim0"));
  DT_ASSIGN_OR_RETURN(int b, NormalizeDim(dim1, dim(), "Transpose: dim1"));
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

absl::StatusOr<Tensor> Tensor::Permute(IntSpan dims) const {
  if (static_cast<int>(dims.size()) != dim()) {
    return absl::InvalidArgumentError(absl::StrCat("Permute: got ", dims.size(), " dims for a tensor of ",
                                                   dim(), " dims"));
  }
  Tensor t = *this;
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dims[i], dim(), "Permute: dim"));
    if (seen[d]) {
      return absl::InvalidArgumentError(absl::StrCat("Permute: dim ", d, " repeated in ", ShapeToString(dims)));
    }
    seen[d] = true;
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

absl::StatusOr<Tensor> Tensor::View(IntSpan shape) const {
  DT_ASSIGN_OR_RETURN(Shape s, InferShape(shape, numel(), "View"));
  std::optional<Shape> st = ViewStrides(shape_, strides_, s);
  if (!st) {
    return absl::InvalidArgumentError(absl::StrCat("View: cannot view ", Describe(), " with strides ",
                                                   ShapeToString(strides_), " as ", ShapeToString(s),
                                                   " without a copy; use Reshape"));
  }
  Tensor t = *this;
  t.shape_ = std::move(s);
  t.strides_ = std::move(*st);
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshape(IntSpan shape) const {
  DT_ASSIGN_OR_RETURN(Shape s, InferShape(shape, numel(), "Reshape"));
  if (ViewStrides(shape_, strides_, s)) return View(s);
  DT_ASSIGN_OR_RETURN(Tensor c, Clone());
  return c.View(s);
}

absl::StatusOr<Tensor> Tensor::Unsqueeze(int64_t dim) const {
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, this->dim() + 1, "Unsqueeze: dim"));
  Tensor t = *this;
  const int64_t st = d < this->dim() ? strides_[d] * shape_[d] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, st);
  return t;
}

absl::StatusOr<Tensor> Tensor::Squeeze(int64_t dim) const {
  DT_ASSIGN_OR_RETURN(int d, NormalizeDim(dim, this->dim(), "Squeeze: dim"));
  if (shape_[d] != 1) {
    return absl::InvalidArgumentError(absl::StrCat("Squeeze: dim ", d, " of ", Describe(), " has size ",
                                                   shape_[d], ", not 1"));
  }
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

absl::StatusOr<Tensor> Tensor::Expand(IntSpan shape) const {
  if (shape.size() < shape_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Expand: cannot expand ", Describe(), " to ",
                                                   ShapeToString(shape), " (fewer dims)"));
  }
  const size_t lead = shape.size() - shape_.size();
  Tensor t = *this;
  t.shape_.assign(shape.begin(), shape.end());
  t.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0) return absl::InvalidArgumentError(absl::StrCat("Expand: -1 not allowed for new dim ", i));
      continue;
    }
    const int64_t cur = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? cur : shape[i];
    t.shape_[i] = want;
    if (want < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Expand: bad size ", shape[i], " at dim ", i, " in ",
                                                     ShapeToString(shape)));
    }
    if (cur == want) {
      t.strides_[i] = strides_[i - lead];
    } else if (cur == 1) {
      t.strides_[i] = 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("Expand: cannot expand ", Describe(), " to ",
                                                     ShapeToString(shape), " (dim ", i, ": ", cur, " vs ",
                                                     want, ")"));
    }
  }
  return t;
}

absl::StatusOr<Tensor> Tensor::Flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return View({1});
  DT_ASSIGN_OR_RETURN(Shape s, FlattenShape(shape_, start_dim, end_dim, Describe()));
  return Reshape(s);
}

CopyCount HostCopies() { return host_copies; }

uint32_t internal::TensorBytes() { return sizeof(Tensor); }

absl::Status Tensor::CopyFrom(const Tensor& src) const {
  if (!defined() || !src.defined()) return absl::InvalidArgumentError("CopyFrom: undefined tensor");
  if (shape_ != src.shape_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFrom: shape ", ShapeToString(src.shape_),
                                                   " into ", ShapeToString(shape_)));
  }
  if (read_only()) {
    return absl::FailedPreconditionError(absl::StrCat("CopyFrom: destination ", Describe(),
                                                      " is read-only (a mapped checkpoint)"));
  }
  if (numel() == 0) return absl::OkStatus();
  if (device().is_cpu() && src.device().is_cpu()) {  // Note [Host copy counter]
    ++host_copies.copies;
    host_copies.bytes += nbytes();
  }
  if (IsQuantized(dtype_) || IsQuantized(src.dtype_)) return CopyQuantized(*this, src);
  if (device().is_cpu() && src.device().is_cpu()) {
    HostCopy(*this, src);
    return absl::OkStatus();
  }
  if (device() == src.device()) {
    absl::StatusOr<const internal::CudaModule*> cuda = internal::LoadCudaModule();
    if (!cuda.ok()) {
      return internal::InContext(cuda.status(), absl::StrCat("CopyFrom ", src.Describe(), " into ", Describe()));
    }
    return (*cuda)->memory.strided_copy(*this, src);
  }
  // Across devices: make the source contiguous in the destination dtype on its own device, copy
  // the bytes, then scatter into the destination's strides on the destination device.
  DT_ASSIGN_OR_RETURN(Tensor s, src.To(dtype_));
  DT_ASSIGN_OR_RETURN(s, s.Contiguous());
  if (is_contiguous()) return CopyBytes(raw_data(), device(), s.raw_data(), s.device(), nbytes());
  DT_ASSIGN_OR_RETURN(Tensor tmp, Empty(shape_, dtype_, device()));
  DT_RETURN_IF_ERROR(CopyBytes(tmp.raw_data(), device(), s.raw_data(), s.device(), nbytes()));
  return CopyFrom(tmp);
}

absl::Status Tensor::Fill(double value) const {
  if (read_only()) return absl::FailedPreconditionError(absl::StrCat("Fill: ", Describe(), " is read-only"));
  if (IsQuantized(dtype_)) {
    return absl::UnimplementedError(absl::StrCat("Fill: ", Describe(), " is quantized"));
  }
  if (numel() == 0) return absl::OkStatus();
  if (device().is_cuda()) {
    absl::StatusOr<const internal::CudaModule*> cuda = internal::LoadCudaModule();
    if (!cuda.ok()) return internal::InContext(cuda.status(), absl::StrCat("Fill ", Describe()));
    return (*cuda)->memory.fill(*this, value);
  }
  internal::StridedLoop loop(shape_, strides_, {});
  const int64_t st = loop.strides[0].back();
  DT_DISPATCH_DTYPE(dtype_, T, [&] {
    const T v = Convert<T>(value);
    T* base = data<T>();
    loop.ForEachRun([&](int64_t o, int64_t, int64_t n) {
      T* p = base + o;
      for (int64_t i = 0; i < n; ++i) p[i * st] = v;
    });
  });
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Tensor::Clone() const {
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape_, dtype_, device()));
  DT_RETURN_IF_ERROR(t.CopyFrom(*this));
  return t;
}

absl::StatusOr<Tensor> Tensor::Contiguous() const {
  if (is_contiguous()) return *this;
  return Clone();
}

absl::StatusOr<Tensor> Tensor::To(Device device) const {
  if (device == this->device()) return *this;
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape_, dtype_, device));
  DT_RETURN_IF_ERROR(t.CopyFrom(*this));
  return t;
}

absl::StatusOr<Tensor> Tensor::To(DType dtype) const {
  if (dtype == dtype_) return *this;
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape_, dtype, device()));
  DT_RETURN_IF_ERROR(t.CopyFrom(*this));
  return t;
}

std::vector<double> Tensor::ToDoubles() const {
  std::vector<double> out;
  if (!defined()) return out;
  if (IsQuantized(dtype_)) {
    auto f = To(DType::kF32);
    DT_CHECK_OK(f);
    return f->ToDoubles();
  }
  Tensor host = *this;
  if (!device().is_cpu()) {
    auto h = To(kCPU);
    DT_CHECK_OK(h);
    host = *h;
  }
  out.resize(static_cast<size_t>(numel()));
  if (out.empty()) return out;
  // Walk the source strides alongside a row-major index.
  const Shape cstr = ContiguousStrides(host.shape_);
  internal::StridedLoop both(host.shape_, host.strides_, cstr);
  const int64_t ss = both.strides[0].back(), ds = both.strides[1].back();
  DT_DISPATCH_DTYPE(dtype_, T, [&] {
    const T* base = host.data<T>();
    both.ForEachRun([&](int64_t o0, int64_t o1, int64_t n) {
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(o1 + i * ds)] = Convert<double>(base[o0 + i * ss]);
    });
  });
  return out;
}

double Tensor::Item() const {
  DT_CHECK(numel() == 1, "Item() on ", Describe());
  return ToDoubles()[0];
}

std::string Tensor::Describe() const {
  if (!defined()) return "undefined tensor";
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), " ", device().ToString());
}

std::string Tensor::ToString(int64_t max_elements) const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> v = ToDoubles();
  std::string s = "tensor(";
  std::function<void(int, int64_t&)> rec = [&](int d, int64_t& pos) {
    if (d == dim()) {
      if (pos < max_elements) absl::StrAppend(&s, v[static_cast<size_t>(pos)]);
      else if (pos == max_elements) absl::StrAppend(&s, "...");
      ++pos;
      return;
    }
    s += "[";
    for (int64_t i = 0; i < shape_[d]; ++i) {
      if (i) s += ", ";
      rec(d + 1, pos);
      if (pos > max_elements + 1) break;
    }
    s += "]";
  };
  int64_t pos = 0;
  rec(0, pos);
  absl::StrAppend(&s, ", ", DTypeName(dtype_), ")");
  return s;
}

bool Equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  auto ac = a.To(kCPU).value().Contiguous().value();
  auto bc = b.To(kCPU).value().Contiguous().value();
  return std::memcmp(ac.raw_data(), bc.raw_data(), static_cast<size_t>(ac.nbytes())) == 0;
}

absl::Status AllClose(const Tensor& got, const Tensor& want, double atol, double rtol) {
  if (got.shape() != want.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("shape mismatch: got ", ShapeToString(got.shape()),
                                                   ", want ", ShapeToString(want.shape())));
  }
  std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool gn = std::isnan(g[i]), wn = std::isnan(w[i]);
    const bool ok = (gn && wn) || (!gn && !wn && (g[i] == w[i] || std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i])));
    if (!ok) {
      Shape idx(got.shape().size());
      int64_t r = static_cast<int64_t>(i);
      for (int d = got.dim() - 1; d >= 0; --d) {
        idx[d] = r % got.shape()[d];
        r /= got.shape()[d];
      }
      return absl::InvalidArgumentError(absl::StrCat("at ", ShapeToString(idx), ": got ", g[i], ", want ", w[i],
                                                     " (atol ", atol, ", rtol ", rtol, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MaxRelativeDiff(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("shape mismatch: got ", ShapeToString(got.shape()),
                                                   ", want ", ShapeToString(want.shape())));
  }
  const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(g[i] - w[i]));
    scale = std::max(scale, std::abs(w[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace dt
