#pragma once
// Tensor: a strided view of a refcounted Storage.
//
// Invariants
//   - shape().size() == strides().size() == dim(); every size >= 0; strides are in elements and may
//     be 0 (expanded dims) but are never negative.
//   - element (i0, ..., in) lives at data + (storage_offset + sum_k ik * stride_k) * DTypeSize(dtype);
//     a quantized dtype counts whole blocks instead (DTypeBytes; Note [Quantized dtypes] in
//     core/quant.h).
//   - views (Narrow, Select, Transpose, Permute, View, Unsqueeze, Squeeze, Expand) share storage and
//     never copy; Contiguous/Clone/To copy when they must.
//   - a default-constructed Tensor is undefined (defined() == false); every other one has a storage,
//     possibly of zero bytes.
//
// Example
//   auto x = Tensor::Arange(0, 6).value().View({2, 3}).value();  // [[0,1,2],[3,4,5]]
//   auto col = x.Select(1, 2).value();                            // [2, 5], stride 3
//
// Everything that can fail on user input (bad dims, mismatched shapes, missing CUDA) returns
// absl::StatusOr; messages name the operation and the values involved.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/device.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/status.h"
#include "dtensor/core/storage.h"

namespace dt {

class Tensor {
 public:
  Tensor() = default;
  Tensor(Storage storage, Shape shape, Shape strides, int64_t storage_offset, DType dtype);

  // ---- creation --------------------------------------------------------------------------------
  static absl::StatusOr<Tensor> Empty(IntSpan shape, DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<Tensor> Zeros(IntSpan shape, DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<Tensor> Ones(IntSpan shape, DType dtype = DType::kF32, Device device = kCPU);
  static absl::StatusOr<Tensor> Full(IntSpan shape, double value, DType dtype = DType::kF32,
                                     Device device = kCPU);
  // [start, end) with step, PyTorch arange semantics.
  static absl::StatusOr<Tensor> Arange(double start, double end, double step = 1.0,
                                       DType dtype = DType::kF32, Device device = kCPU);
  // Counter-based random values: element with flat index i of the tensor gets the value derived
  // from (seed, i) alone, so every rank can produce any slice of a global random tensor
  // identically (see core/random.h). Rand is uniform in [0, 1); Randn is standard normal.
  static absl::StatusOr<Tensor> Rand(IntSpan shape, uint64_t seed, DType dtype = DType::kF32,
                                     Device device = kCPU);
  static absl::StatusOr<Tensor> Randn(IntSpan shape, uint64_t seed, DType dtype = DType::kF32,
                                      Device device = kCPU);
  // Copies host values (converted to `dtype`, default the C++ type's own dtype).
  template <typename T>
  static absl::StatusOr<Tensor> FromVector(IntSpan shape, const std::vector<T>& values);
  static absl::StatusOr<Tensor> FromDoubles(IntSpan shape, const std::vector<double>& values,
                                            DType dtype = DType::kF32);

  // ---- metadata --------------------------------------------------------------------------------
  bool defined() const { return storage_.defined(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_[d < 0 ? d + dim() : d]; }
  int64_t stride(int d) const { return strides_[d < 0 ? d + dim() : d]; }
  int64_t numel() const { return Numel(shape_); }
  int64_t nbytes() const { return DTypeBytes(dtype_, numel()); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_.device(); }
  int64_t storage_offset() const { return storage_offset_; }
  const Storage& storage() const { return storage_; }
  bool is_contiguous() const;
  bool read_only() const { return storage_.read_only(); }

  // Pointer to element (0, ..., 0). data<T>() checks that T matches dtype().
  void* raw_data() const {
    return static_cast<char*>(storage_.data()) + DTypeBytes(dtype_, storage_offset_);
  }
  template <typename T>
  T* data() const {
    DT_CHECK(DTypeOf<T>::value == dtype_, "data<", DTypeName(DTypeOf<T>::value), "> on a ",
             DTypeName(dtype_), " tensor");
    return static_cast<T*>(raw_data());
  }

  // ---- views (no copy) -------------------------------------------------------------------------
  absl::StatusOr<Tensor> Narrow(int64_t dim, int64_t start, int64_t length) const;
  absl::StatusOr<Tensor> Select(int64_t dim, int64_t index) const;
  absl::StatusOr<Tensor> Transpose(int64_t dim0, int64_t dim1) const;
  absl::StatusOr<Tensor> Permute(IntSpan dims) const;
  // View needs strides compatible with the new shape (one -1 allowed); Reshape copies if not.
  absl::StatusOr<Tensor> View(IntSpan shape) const;
  absl::StatusOr<Tensor> Reshape(IntSpan shape) const;
  absl::StatusOr<Tensor> Unsqueeze(int64_t dim) const;
  absl::StatusOr<Tensor> Squeeze(int64_t dim) const;  // dim must have size 1
  // Broadcasts size-1 dims (stride 0) and prepends new dims; -1 keeps a size.
  absl::StatusOr<Tensor> Expand(IntSpan shape) const;
  absl::StatusOr<Tensor> Flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- copies ----------------------------------------------------------------------------------
  absl::StatusOr<Tensor> Contiguous() const;  // itself when already contiguous
  absl::StatusOr<Tensor> Clone() const;       // always a fresh contiguous copy
  absl::StatusOr<Tensor> To(Device device) const;
  absl::StatusOr<Tensor> To(DType dtype) const;
  // Copies `src` into this tensor's elements: same shape, any strides, dtypes and devices.
  absl::Status CopyFrom(const Tensor& src) const;
  absl::Status Fill(double value) const;

  // ---- host access (tests, printing) -----------------------------------------------------------
  // The values as T (converted), in row-major order; copies from the device when needed.
  template <typename T>
  std::vector<T> ToVector() const;
  std::vector<double> ToDoubles() const;
  double Item() const;  // the single element of a numel()==1 tensor
  // "tensor([[0, 1], [2, 3]], f32)" with at most `max_elements` shown.
  std::string ToString(int64_t max_elements = 64) const;
  // "f32[4, 1024] cpu" — for error messages.
  std::string Describe() const;

 private:
  Storage storage_;
  Shape shape_;
  Shape strides_;
  int64_t storage_offset_ = 0;
  DType dtype_ = DType::kF32;
};

// Note [Host copy counter]
// Every copy of elements into a host tensor from another tensor (CopyFrom, and through it
// Contiguous, Clone, To, a Reshape that no view can express, ops::Cast, a cache append) counts
// one, with the bytes it writes, for the thread that asked for it (ops run their kernels on other
// threads, but a copy is asked for by the op's caller). Tests read it around a forward to count
// the copies of activations per layer (tests/nn/forward_copies_test.cc); it costs two
// thread-local additions per copy.
struct CopyCount {
  int64_t copies = 0;
  int64_t bytes = 0;
};
// The copies this thread has made since it started.
CopyCount HostCopies();

// Bitwise equality of shape, dtype and values.
bool Equal(const Tensor& a, const Tensor& b);
// OK when shapes match and |a-b| <= atol + rtol*|b| elementwise (NaNs must match); otherwise an
// error naming the first mismatch: "at [3, 1]: got 1.5, want 1.25 (atol 1e-5, rtol 1e-5)".
absl::Status AllClose(const Tensor& got, const Tensor& want, double atol = 1e-5, double rtol = 1e-5);
// max |got - want| / max |want| ("within tol of the output's scale"; max |got - want| when want
// is all zeros), infinity when got holds a NaN or an infinity; InvalidArgument naming both shapes
// when they differ.
absl::StatusOr<double> MaxRelativeDiff(const Tensor& got, const Tensor& want);

template <typename T>
absl::StatusOr<Tensor> Tensor::FromVector(IntSpan shape, const std::vector<T>& values) {
  if (Numel(shape) != static_cast<int64_t>(values.size())) {
    return absl::InvalidArgumentError(absl::StrCat("FromVector: shape ", ShapeToString(shape),
                                                   " has ", Numel(shape), " elements, got ",
                                                   values.size(), " values"));
  }
  DT_ASSIGN_OR_RETURN(Tensor t, Empty(shape, DTypeOf<T>::value));
  T* p = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  std::vector<double> d = ToDoubles();
  std::vector<T> out;
  out.reserve(d.size());
  for (double v : d) {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>) {
      out.push_back(T(static_cast<float>(v)));
    } else {
      out.push_back(static_cast<T>(v));
    }
  }
  return out;
}

}  // namespace dt
