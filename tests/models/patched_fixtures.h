#pragma once
// Copies of the tiny fixtures with one thing changed, written at test time in a scratch directory
// (issue 45's hostile cases without committing files): one f32 weight element set to NaN or Inf
// (which the loaders refuse: Note [Non-finite scales] in core/quant.h), a config field changed;
// and PokeLoaded, which sets a weight element of a loaded model, for what goes non-finite after
// loading (an overflow) and the checks that must catch it.
#include <cstring>
#include <filesystem>
#include <string>

#include "dtensor/core/status.h"
#include "dtensor/dtensor/dtensor.h"
#include "dtensor/nn/module.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dt::nn::testing {

// A copy of the files of tests/fixtures/<fixture> at <scratch>/<name>.
inline std::string CopyFixture(const std::string& scratch, const std::string& fixture,
                               const std::string& name) {
  namespace fs = std::filesystem;
  const std::string dst = scratch + "/" + name;
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(FixtureDir(fixture))) {
    fs::copy_file(e.path(), dst + "/" + e.path().filename().string());
  }
  return dst;
}

// Sets element `index` of the f32 tensor `name` in the safetensors file at `path`.
inline void PokeF32(const std::string& path, const std::string& name, int64_t index, float value) {
  std::string bytes = dt::testing::ReadFileBytes(path);
  ASSERT_GE(bytes.size(), 8u) << path;
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  ASSERT_TRUE(header.contains(name)) << name;
  ASSERT_EQ(header[name]["dtype"], "F32") << name;
  const int64_t begin = header[name]["data_offsets"][0].get<int64_t>();
  const int64_t end = header[name]["data_offsets"][1].get<int64_t>();
  ASSERT_LE(begin + 4 * (index + 1), end) << name << " has no element " << index;
  std::memcpy(bytes.data() + 8 + header_len + begin + 4 * index, &value, 4);
  dt::testing::WriteFileBytes(path, bytes);
}

// A copy of `fixture` (config.json + model.safetensors) with element `index` of `tensor` set to
// `value`.
inline std::string FixtureWith(const std::string& scratch, const std::string& fixture,
                               const std::string& name, const std::string& tensor, int64_t index,
                               float value) {
  const std::string dir = CopyFixture(scratch, fixture, name);
  PokeF32(dir + "/model.safetensors", tensor, index, value);
  return dir;
}

// Sets element `index` (row-major over the global shape) of f32 parameter `name` of a loaded model
// to `value` on the rank whose piece holds it (every rank when replicated); the others unchanged.
// The piece is copied first: loaded weights may be read-only views of the checkpoint file.
inline absl::Status PokeLoaded(const Module& m, const std::string& name, int64_t index, float value) {
  DT_ASSIGN_OR_RETURN(Parameter * p, m.GetParameter(name));
  if (p->dtype() != DType::kF32) return absl::InvalidArgumentError(name + " is not f32");
  const Shape& global = p->shape();
  const Shape offset = p->spec().Offset();
  DT_ASSIGN_OR_RETURN(const Tensor local, p->value().ToLocal().Clone());
  DT_RETURN_IF_ERROR(p->Set(DTensor(p->spec(), local)));
  int64_t element = 0;
  for (int d = static_cast<int>(global.size()) - 1; d >= 0; --d) {
    const int64_t at = index % global[d] - offset[d];
    index /= global[d];
    if (at < 0 || at >= local.size(d)) return absl::OkStatus();  // another rank's
    element += at * local.stride(d);
  }
  local.data<float>()[element] = value;
  return absl::OkStatus();
}

// A copy of `fixture` whose config.json has max_position_embeddings `context`.
inline std::string FixtureWithContext(const std::string& scratch, const std::string& fixture,
                                      const std::string& name, int64_t context) {
  const std::string dir = CopyFixture(scratch, fixture, name);
  nlohmann::json config =
      nlohmann::json::parse(dt::testing::ReadFileBytes(dir + "/config.json"));
  config["max_position_embeddings"] = context;
  dt::testing::WriteFileBytes(dir + "/config.json", config.dump(2));
  return dir;
}

// A copy of `fixture` whose checkpoint holds one more f32 tensor `tensor` of 4 ones beside the
// model's (model.safetensors kept; extra.safetensors and an index naming both files), the way a
// checkpoint holds a tensor the model forgot (Note [Every tensor is used] in nn/load.h).
inline std::string FixtureWithExtraTensor(const std::string& scratch, const std::string& fixture,
                                          const std::string& name, const std::string& tensor) {
  const std::string dir = CopyFixture(scratch, fixture, name);
  const std::string bytes = dt::testing::ReadFileBytes(dir + "/model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  nlohmann::json index;
  index["metadata"] = nlohmann::json::object();
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") index["weight_map"][key] = "model.safetensors";
  }
  index["weight_map"][tensor] = "extra.safetensors";
  nlohmann::json extra;
  extra[tensor] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  std::string text = extra.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string file(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(file.data(), &len, 8);
  const float ones[4] = {1, 1, 1, 1};
  file += text + std::string(reinterpret_cast<const char*>(ones), sizeof(ones));
  dt::testing::WriteFileBytes(dir + "/extra.safetensors", file);
  dt::testing::WriteFileBytes(dir + "/model.safetensors.index.json", index.dump());
  return dir;
}

}  // namespace dt::nn::testing
