#include "dtensor/loaders/small_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dtensor/loaders/read_util.h"

namespace dt::loaders {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t limit) {
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (fp == nullptr) return OpenError(errno, absl::StrCat("'", path, "'"));
  const size_t max = limit > 0 ? static_cast<size_t>(limit) : 0;
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), fp)) > 0) {
    text.append(buf, got);
    if (text.size() > max) break;
  }
  const int error = std::ferror(fp) != 0 ? errno : 0;
  std::fclose(fp);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("cannot read '", path, "': ", std::strerror(error)));
  }
  if (text.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is larger than ", limit, " bytes"));
  }
  return text;
}

}  // namespace dt::loaders
