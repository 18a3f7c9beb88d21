#pragma once
// What the fuzz targets (tests/fuzz/*_fuzz.cc) share: the loaders open files by path, so each input
// is written to a file of this process's own first (on tmpfs when the machine has /dev/shm).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <system_error>
#include <filesystem>

namespace dt::fuzz {

// Writes `size` bytes to `<dir>/dt_fuzz_<pid>.<ext>` and returns the path; the file is reused by
// every input of the process and removed at exit.
inline const std::string& WriteInput(const uint8_t* data, size_t size, const char* ext) {
  struct File {
    std::string path;
    explicit File(const char* ext) {
      std::error_code ec;
      const std::filesystem::path dir =
          std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
      path = (dir / ("dt_fuzz_" + std::to_string(::getpid()) + "." + ext)).string();
    }
    ~File() { ::unlink(path.c_str()); }
  };
  static const File file(ext);
  std::ofstream out(file.path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return file.path;
}

}  // namespace dt::fuzz
