#pragma once
// Reading a whole small file (config.json, a checkpoint index) with errors that name it.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dt::loaders {

// The bytes of `path`. OpenError's code (loaders/read_util.h) when it cannot be opened,
// InvalidArgument when it is larger than `limit` bytes, Internal when reading fails; every
// message names the file.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t limit);

}  // namespace dt::loaders
