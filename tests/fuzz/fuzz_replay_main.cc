// The regression side of the fuzz targets (tests/fuzz/CMakeLists.txt): any compiler builds each
// target's LLVMFuzzerTestOneInput into a `<target>_replay` program that runs it over the files and
// directories on its command line — the committed corpus, the crashes a fuzzing run kept and the
// fixtures. Files in a directory run whole (a corpus is already the inputs that matter); a file
// named on the command line (a fixture) also runs every prefix of its first 4 KiB, where the
// headers are. CI runs these under the cpu label, and under the sanitizers.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Replay(const std::filesystem::path& file, bool prefixes) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t n = 0; prefixes && n < bytes.size() && n <= 4096; ++n) LLVMFuzzerTestOneInput(p, n);
  LLVMFuzzerTestOneInput(p, bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::vector<std::filesystem::path> files;
    const bool directory = std::filesystem::is_directory(arg);
    if (directory) {
      for (const auto& e : std::filesystem::directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(arg);
    }
    for (const auto& f : files) Replay(f, !directory);
    std::printf("replayed %s (%zu files)\n", argv[i], files.size());
  }
  return 0;
}
