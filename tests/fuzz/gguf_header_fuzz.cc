// A fuzz target for the GGUF reader (loaders/gguf.h): any bytes must give a GgufFile or a clean
// error, and an accepted file must read every tensor it lists without faulting.
//
// With Clang (-DCMAKE_CXX_COMPILER=clang++) this builds as a libFuzzer binary,
// `gguf_header_fuzz`, run by `ctest -L fuzz` for 60 s from tests/fixtures/gguf (not in CI).
// With any compiler `gguf_fuzz_replay` runs the same entry point over the files given on its
// command line (the fixtures, and crashes a fuzzing run found, kept in tests/fuzz/gguf_crashes/):
// that is the regression test CI runs.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "dtensor/core/shape.h"
#include "dtensor/loaders/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dt_gguf_fuzz_" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto f = dt::loaders::GgufFile::Open(path);
  if (f.ok()) {
    for (const dt::loaders::GgufTensorInfo& t : (*f)->tensors()) {
      if (t.type->dequantizable() && dt::Numel(t.shape) <= (1 << 20)) {
        (void)(*f)->ReadRanges(t.name, dt::FullRanges(t.shape));
      }
    }
  }
  return 0;
}

#ifdef DT_FUZZ_REPLAY
// Each file, and every prefix of its first 4 KiB (the header), through the entry point.
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    for (size_t n = 0; n <= bytes.size() && n <= 4096; ++n) {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), n);
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::printf("replayed %s\n", argv[i]);
  }
  return 0;
}
#endif
