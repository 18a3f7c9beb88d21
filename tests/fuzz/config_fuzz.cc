// A fuzz target for the config.json readers (loaders/hf_config.h, loaders/diffusers_config.h): any
// bytes, as a transformers config (every decoder family) or a diffusers transformer/scheduler
// config, give a config or a clean error; an accepted decoder config also survives its own round
// trip through JSON. Built as `config_fuzz` (libFuzzer, the fuzz preset) and `config_fuzz_replay`
// (any compiler): see tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "dtensor/loaders/diffusers_config.h"
#include "dtensor/loaders/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  auto decoder = dt::loaders::ParseDecoderConfig(json, "fuzz");
  if (decoder.ok()) {
    // What was accepted must read back as the same config.
    auto back =
        dt::loaders::ParseDecoderConfig(dt::loaders::DecoderConfigToJson(*decoder), "fuzz (written)");
    if (!back.ok() || !(*back == *decoder)) std::abort();
  }
  (void)dt::loaders::ParseFlux2Config(json, "fuzz");
  (void)dt::loaders::ParseFlowMatchSchedulerConfig(json, "fuzz");
  return 0;
}
