#pragma once
// Copies of the tiny fixtures with one thing changed, written at test time in a scratch directory
// (issue 45's hostile cases without committing files): one f32 weight element set to NaN or Inf,
// a config field changed.
#include <cstring>
#include <filesystem>
#include <string>

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

}  // namespace dt::nn::testing
