#pragma once
// The typed attributes of every DTensor op: one struct per kind of op, declared with
// DT_OP_ATTRS(Type, fields...), which makes it comparable (doubles bitwise, so a NaN scalar still
// hits the strategy cache), hashable and printable ("trans_a=0 trans_b=1"). Everything that can
// change an op's result is an attribute, scalars included (PyTorch #147180), because the strategy
// cache keys on them. Attrs holds any of them; ops/op_decl.h says which one each op takes.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/ops/local/ops.h"

namespace dt::ops::internal {

// Doubles compare and hash by their bits; everything else as itself.
inline uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}
template <typename T>
auto Key(const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    return Bits(v);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return v ? std::optional<uint64_t>(Bits(*v)) : std::nullopt;
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int64_t>(v);
  } else if constexpr (std::is_same_v<T, Shape>) {
    return absl::MakeConstSpan(v);
  } else {
    return v;
  }
}
template <typename T>
std::string Print(const T& v) {
  if constexpr (std::is_same_v<T, Shape>) {
    return ShapeToString(v);
  } else if constexpr (std::is_same_v<T, DType>) {
    return std::string(DTypeName(v));
  } else if constexpr (std::is_enum_v<T>) {
    return absl::StrCat(static_cast<int64_t>(v));
  } else if constexpr (std::is_same_v<T, std::optional<double>> ||
                       std::is_same_v<T, std::optional<int64_t>>) {
    return v ? absl::StrCat(*v) : "none";
  } else {
    return absl::StrCat(v);
  }
}
template <typename... T>
bool FieldsEqual(const std::tuple<const T&...>& a, const std::tuple<const T&...>& b) {
  return std::apply(
      [&](const auto&... x) {
        return std::apply([&](const auto&... y) { return ((Key(x) == Key(y)) && ...); }, b);
      },
      a);
}
template <typename H, typename... T>
H HashFields(H h, const std::tuple<const T&...>& f) {
  return std::apply([&](const auto&... x) { return H::combine(std::move(h), Key(x)...); }, f);
}
template <typename... T>
std::string FieldsToString(const char* names, const std::tuple<const T&...>& f) {
  const std::vector<std::string> n = absl::StrSplit(names, ", ");
  std::string out;
  size_t i = 0;
  std::apply([&](const auto&... x) {
    ((absl::StrAppend(&out, out.empty() ? "" : " ", n[i++], "=", Print(x))), ...);
  }, f);
  return out;
}

#define DT_OP_ATTRS(Type, ...)                                                                  \
  auto Fields() const { return std::tie(__VA_ARGS__); }                                        \
  friend bool operator==(const Type& a, const Type& b) {                                       \
    return ::dt::ops::internal::FieldsEqual(a.Fields(), b.Fields());                           \
  }                                                                                             \
  template <typename H>                                                                         \
  friend H AbslHashValue(H h, const Type& a) {                                                  \
    return ::dt::ops::internal::HashFields(std::move(h), a.Fields());                          \
  }                                                                                             \
  std::string ToString() const {                                                                \
    return ::dt::ops::internal::FieldsToString(#__VA_ARGS__, Fields());                        \
  }

struct NoAttrs {
  friend bool operator==(const NoAttrs&, const NoAttrs&) { return true; }
  template <typename H>
  friend H AbslHashValue(H h, const NoAttrs&) {
    return h;
  }
  std::string ToString() const { return ""; }
};

struct MatmulAttrs {
  bool trans_a = false;
  bool trans_b = false;
  DT_OP_ATTRS(MatmulAttrs, trans_a, trans_b)
};
struct BinaryAttrs {
  ops::BinaryOp op = ops::BinaryOp::kAdd;
  DT_OP_ATTRS(BinaryAttrs, op)
};
struct BinaryScalarAttrs {
  ops::BinaryOp op = ops::BinaryOp::kAdd;
  double scalar = 0;
  DT_OP_ATTRS(BinaryScalarAttrs, op, scalar)
};
struct UnaryAttrs {
  ops::UnaryOp op = ops::UnaryOp::kNeg;
  DT_OP_ATTRS(UnaryAttrs, op)
};
struct CastAttrs {
  DType dtype = DType::kF32;
  DT_OP_ATTRS(CastAttrs, dtype)
};
struct ReduceAttrs {
  ops::Reduction op = ops::Reduction::kSum;
  int dim = 0;  // normalized (0 <= dim < rank)
  bool keepdim = false;
  DT_OP_ATTRS(ReduceAttrs, op, dim, keepdim)
};
struct SoftmaxAttrs {
  int dim = 0;
  bool log = false;
  DT_OP_ATTRS(SoftmaxAttrs, dim, log)
};
struct NormAttrs {
  double eps = 1e-6;
  DT_OP_ATTRS(NormAttrs, eps)
};
struct RotaryAttrs {
  ops::RotaryStyle style = ops::RotaryStyle::kHalf;
  DT_OP_ATTRS(RotaryAttrs, style)
};
struct AttentionAttrs {
  bool causal = false;
  std::optional<double> scale;
  std::optional<int64_t> kv_length;
  std::optional<int64_t> q_offset;
  DT_OP_ATTRS(AttentionAttrs, causal, scale, kv_length, q_offset)
};
struct ViewAttrs {
  Shape shape;  // no -1 left
  DT_OP_ATTRS(ViewAttrs, shape)
};
struct PermuteAttrs {
  Shape perm;  // a permutation of [0, rank)
  DT_OP_ATTRS(PermuteAttrs, perm)
};
struct DimAttrs {
  int dim = 0;  // normalized
  DT_OP_ATTRS(DimAttrs, dim)
};
struct SplitAttrs {
  int dim = 0;
  Shape sizes;
  DT_OP_ATTRS(SplitAttrs, dim, sizes)
};
struct TopKAttrs {
  int64_t k = 1;
  int dim = 0;
  bool largest = true;
  DT_OP_ATTRS(TopKAttrs, k, dim, largest)
};

// The attributes of each row of DT_DECLARED_OPS (ops/local/ops.h): <Name>Attrs, a field per
// DT_ATTR of the row, of its type without const and &.
#define DT_ATTRS_FIELD_In(n)
#define DT_ATTRS_FIELD_Opt(n)
#define DT_ATTRS_FIELD_Attr(type, n, ...) std::remove_cvref_t<type> n{};
#define DT_ATTRS_NAME_In(n)
#define DT_ATTRS_NAME_Opt(n)
#define DT_ATTRS_NAME_Attr(type, n, ...) , n
#define DT_ATTRS_OP_ATTRS_(...) DT_OP_ATTRS(__VA_ARGS__)
#define DT_ATTRS_STRUCT_(name, params)                                                         \
  struct name##Attrs {                                                                         \
    DT_ROW_EACH(DT_ATTRS_FIELD_, params)                                                       \
    DT_ATTRS_OP_ATTRS_(name##Attrs DT_ROW_EACH(DT_ATTRS_NAME_, params))                         \
  };
DT_DECLARED_OPS(DT_ATTRS_STRUCT_)
#undef DT_ATTRS_STRUCT_
#undef DT_ATTRS_OP_ATTRS_
#undef DT_ATTRS_FIELD_In
#undef DT_ATTRS_FIELD_Opt
#undef DT_ATTRS_FIELD_Attr
#undef DT_ATTRS_NAME_In
#undef DT_ATTRS_NAME_Opt
#undef DT_ATTRS_NAME_Attr
#define DT_ATTRS_ALTERNATIVE_(name, params) , name##Attrs

using Attrs = std::variant<NoAttrs, MatmulAttrs, BinaryAttrs, BinaryScalarAttrs, UnaryAttrs,
                           CastAttrs, ReduceAttrs, SoftmaxAttrs, NormAttrs, RotaryAttrs,
                           AttentionAttrs, ViewAttrs, PermuteAttrs, DimAttrs, SplitAttrs,
                           TopKAttrs DT_DECLARED_OPS(DT_ATTRS_ALTERNATIVE_)>;
#undef DT_ATTRS_ALTERNATIVE_

// The index of alternative A in Attrs.
template <typename A, typename V = Attrs>
struct AttrsIndex;
template <typename A, typename... Ts>
struct AttrsIndex<A, std::variant<Ts...>> {
  static constexpr size_t value = [] {
    size_t i = 0;
    bool found = false;
    ((found = found || std::is_same_v<A, Ts>, i += found ? 0 : 1), ...);
    return i;
  }();
};
template <typename A>
inline constexpr size_t kAttrsIndex = AttrsIndex<A>::value;

// A hash of the alternative and its fields (part of the strategy cache key).
inline size_t AttrsHash(const Attrs& a) {
  return std::visit([&](const auto& x) { return absl::HashOf(a.index(), x); }, a);
}

// "trans_a=0 trans_b=1" ("" for NoAttrs).
inline std::string AttrsToString(const Attrs& a) {
  return std::visit([](const auto& x) { return x.ToString(); }, a);
}

}  // namespace dt::ops::internal
