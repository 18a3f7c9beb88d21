#pragma once
// The DT_* environment variables the library reads: one table (name, kind, accepted values,
// default, meaning) and one policy. Unset or empty means "not given" (nullopt); a value that the
// table does not accept is an InvalidArgument naming the variable, the value and what is accepted:
//
//   DT_TIMEOUT_MS='abc': expected an integer in [1, 86400000]
//   DT_BACKEND='tcp': expected one of threads, gloo, shm, mpi, nccl
//
// Every reader goes through Int/Flag/Choice/Text with a name from the table (reading an
// undeclared name is an internal error). CheckAll validates every variable that is set; the
// World calls it first, so that code which cannot return a status (a buffer pool's constructor, a
// backend's tuning knob) reads values already known to be good. docs/env.md lists the table
// (Env.DocsListEveryVariable keeps the two equal).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dt::env {

// kId: 1-64 letters, digits, '-' or '_' (safe in a file name).
enum class Kind { kInt, kFlag, kChoice, kText, kId };

struct Var {
  const char* name;
  Kind kind;
  int64_t min = 0, max = 0;  // kInt: the accepted range
  const char* choices = "";  // kChoice: the accepted values, comma separated
  const char* fallback = "";  // what applies when unset, in words
  const char* meaning = "";
};

// Every DT_* variable, in the order docs/env.md lists them.
const std::vector<Var>& Vars();

absl::StatusOr<std::optional<int64_t>> Int(absl::string_view name);
// kFlag: "0" or "1".
absl::StatusOr<std::optional<bool>> Flag(absl::string_view name);
// kChoice: one of the declared choices; kText and kId: the text.
absl::StatusOr<std::optional<std::string>> Choice(absl::string_view name);
absl::StatusOr<std::optional<std::string>> Text(absl::string_view name);

// The first variable that is set to a value the table does not accept, else OK.
absl::Status CheckAll();

// What is accepted, in words: "an integer in [1, 86400000]", "0 or 1", "one of a, b".
std::string Accepted(const Var& var);

}  // namespace dt::env
