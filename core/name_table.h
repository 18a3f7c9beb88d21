#pragma once
// Tables of an enum's names: {name, value} entries, each value's own name first, then any other
// names a parser takes for it (ReduceOp's, nn::Activation's).
//
//   constexpr std::pair<const char*, ReduceOp> kNames[] = {{"sum", ReduceOp::kSum}, ...};
//   NameIn(kNames, ReduceOp::kSum)  -> "sum"     (the first entry with the value; "?" when none)
//   ValueIn(kNames, "sum")          -> kSum      (std::nullopt for a name not in the table)

#include <cstddef>
#include <optional>
#include <utility>

#include "absl/strings/string_view.h"

namespace dt {

template <typename E, std::size_t N>
const char* NameIn(const std::pair<const char*, E> (&table)[N], E value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> ValueIn(const std::pair<const char*, E> (&table)[N], absl::string_view name) {
  for (const auto& [n, v] : table) {
    if (name == n) return v;
  }
  return std::nullopt;
}

}  // namespace dt
