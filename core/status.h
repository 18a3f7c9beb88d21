#pragma once
// Status helpers. Fallible library code returns absl::Status / absl::StatusOr<T>; these macros keep
// call sites short.
//
// Note [absl::string_view]
// Debian's abseil is built with ABSL_OPTION_USE_STD_STRING_VIEW=0, so absl::string_view is its own
// type and std::string_view does not convert to it (nor into absl::StrCat). dtensor's interfaces
// therefore take and return absl::string_view; std::string and string literals convert implicitly. DT_CHECK is for internal invariants only (never for user input): it prints the
// failed condition with its location and aborts.

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#define DT_CONCAT_INNER_(a, b) a##b
#define DT_CONCAT_(a, b) DT_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define DT_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status dt_status_ = (expr);           \
    if (!dt_status_.ok()) return dt_status_;      \
  } while (0)

// DT_ASSIGN_OR_RETURN(auto x, Foo()); assigns the value of a StatusOr or returns its error.
#define DT_ASSIGN_OR_RETURN(lhs, expr) \
  DT_ASSIGN_OR_RETURN_IMPL_(DT_CONCAT_(dt_statusor_, __LINE__), lhs, expr)
#define DT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace dt::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace dt::internal

// DT_CHECK(cond) or DT_CHECK(cond, "context ", value, ...): internal invariant.
#define DT_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::dt::internal::CheckFailed(__FILE__, __LINE__, #cond, ::absl::StrCat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// DT_CHECK_OK(status_or_statusor): internal invariant that an operation cannot fail here.
#define DT_CHECK_OK(expr)                                                                     \
  do {                                                                                        \
    const auto& dt_s_ = (expr);                                                               \
    if (!::dt::internal::StatusOf(dt_s_).ok()) [[unlikely]]                                   \
      ::dt::internal::CheckFailed(__FILE__, __LINE__, #expr,                                  \
                                  ::dt::internal::StatusOf(dt_s_).ToString());                \
  } while (0)

namespace dt::internal {
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) { return s.status(); }
}  // namespace dt::internal
