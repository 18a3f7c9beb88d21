// No silent loads (Note [Every tensor is used] in nn/load.h, issue 47): a checkpoint tensor the
// model does not read refuses the load on every rank before any weight is read, naming it, through
// nn::LoadPretrained / nn::CheckCheckpoint (a custom model that forgot a norm), CausalLM from
// safetensors and from GGUF (a tensor appended to the file); kWarn and kIgnore load.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/load.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/models/patched_fixtures.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;

const std::string& Scratch() {
  static dt::testing::ScratchDir dir("strict_load");
  return dir.path;
}

// A custom model that forgot its post_feedforward_layernorm: the checkpoint holds it, the module
// has only the projection.
TEST(StrictLoad, CustomModelThatForgotANormIsRefused) {
  const std::string path = Scratch() + "/custom.safetensors";
  const Tensor w = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6}).value();
  const Tensor norm = Tensor::FromVector<float>({2}, {1, 1}).value();
  ASSERT_TRUE(loaders::WriteSafetensors(
                  path, {{"weight", w}, {"post_feedforward_layernorm.weight", norm}})
                  .ok());
  auto load = [&](PlanCheck unused) {
    return World::RunThreads(1, [&](World& world) -> absl::Status {
      DT_ASSIGN_OR_RETURN(DeviceMesh mesh,
                          InitDeviceMesh(world.shared_from_this(), {1}, {"tp"}));
      DT_ASSIGN_OR_RETURN(loaders::Checkpoint ckpt, loaders::Checkpoint::Open(path));
      Linear model(3, 2);
      PretrainedLoad how;
      how.model = "Custom";
      how.unused_tensors = unused;
      return LoadPretrained(model, mesh, ckpt, how);
    });
  };
  const absl::Status refused = load(PlanCheck::kError);
  EXPECT_TRUE(
      Contains(refused, "1 tensor is not used by Custom: post_feedforward_layernorm.weight"))
      << refused;
  EXPECT_TRUE(Contains(refused, "--allow-unused-weights")) << refused;
  EXPECT_TRUE(PretrainedLoad().unused_tensors == PlanCheck::kError);  // the library's default
  EXPECT_TRUE(load(PlanCheck::kWarn).ok());
  EXPECT_TRUE(load(PlanCheck::kIgnore).ok());
  // CheckCheckpoint alone, placed by hand.
  absl::Status direct = World::RunThreads(1, [&](World& world) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(world.shared_from_this(), {1}, {"tp"}));
    DT_ASSIGN_OR_RETURN(loaders::Checkpoint ckpt, loaders::Checkpoint::Open(path));
    Linear model(3, 2);
    DT_RETURN_IF_ERROR(ReplicateModule(model, mesh));
    const std::vector<std::string> want = {"post_feedforward_layernorm.weight"};
    if (UnusedTensors(model, ckpt) != want) {
      return absl::InternalError("UnusedTensors");
    }
    return CheckCheckpoint(model, ckpt, "Custom");
  });
  EXPECT_TRUE(Contains(direct, "not used by Custom")) << direct;
}

std::string WithExtraTensor(const std::string& family) {
  return FixtureWithExtraTensor(Scratch(), "zoo/" + family + "-tiny", family + "-extra",
                                "model.layers.0.post_feedforward_layernorm.weight");
}

absl::Status LoadOnRanks(int tp, const std::string& path, PlanCheck unused) {
  return World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    CausalLMLoadOptions o;
    o.unused_tensors = unused;
    return CausalLM::FromPretrained(path, mesh, o).status();
  });
}

TEST(StrictLoad, CausalLMRefusesAnUnusedSafetensorsTensorOnEveryRank) {
  const std::string dir = WithExtraTensor("qwen3");
  for (int tp : {1, 2}) {
    const absl::Status s = LoadOnRanks(tp, dir, PlanCheck::kError);
    EXPECT_TRUE(Contains(s, "1 tensor is not used by Qwen3ForCausalLM: "
                            "model.layers.0.post_feedforward_layernorm.weight"))
        << "tp " << tp << ": " << s;
  }
  EXPECT_TRUE(CausalLMLoadOptions().unused_tensors == PlanCheck::kError);
  EXPECT_TRUE(LoadOnRanks(2, dir, PlanCheck::kWarn).ok());
  EXPECT_TRUE(LoadOnRanks(1, FixtureDir("zoo/qwen3-tiny"), PlanCheck::kError).ok());
}

// The GGUF file `src` with one more F32 tensor of 4 elements named `name` (its info appended after
// the last one, the data after the last tensor's, the alignment kept).
void AppendGgufTensor(const std::string& src, const std::string& dst, const std::string& name) {
  auto g = loaders::GgufFile::Open(src);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string bytes = dt::testing::ReadFileBytes(src);
  const int64_t data = (*g)->data_offset(), align = (*g)->alignment();
  // The infos end after the last info: its name (u64 length + bytes), u32 dims, u64 sizes, u32
  // type, u64 offset.
  const loaders::GgufTensorInfo& last = (*g)->tensors().back();
  std::string key(8, '\0');
  const uint64_t len = last.name.size();
  std::memcpy(key.data(), &len, 8);
  key += last.name;
  const size_t at = bytes.rfind(key, data);
  ASSERT_NE(at, std::string::npos);
  uint32_t dims = 0;
  std::memcpy(&dims, bytes.data() + at + key.size(), 4);
  const size_t infos_end = at + key.size() + 4 + 8 * dims + 4 + 8;
  int64_t data_end = 0;  // the data section's used bytes
  for (const auto& t : (*g)->tensors()) {
    data_end = std::max<int64_t>(data_end, t.offset + t.nbytes);
  }
  const int64_t offset = (data_end + align - 1) / align * align;
  std::string info(8, '\0');
  const uint64_t name_len = name.size();
  std::memcpy(info.data(), &name_len, 8);
  info += name;
  auto put = [&](auto v) { info.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{1});
  put(uint64_t{4});
  put(uint32_t{0});  // F32
  put(static_cast<uint64_t>(offset));
  std::string out = bytes.substr(0, infos_end) + info;
  uint64_t count = 0;
  std::memcpy(&count, out.data() + 8, 8);
  ++count;
  std::memcpy(out.data() + 8, &count, 8);
  out.resize((out.size() + align - 1) / align * align, '\0');
  std::string section = bytes.substr(data, data_end);
  section.resize(offset, '\0');
  const float ones[4] = {1, 1, 1, 1};
  section.append(reinterpret_cast<const char*>(ones), sizeof(ones));
  dt::testing::WriteFileBytes(dst, out + section);
}

TEST(StrictLoad, CausalLMRefusesAnUnusedGgufTensor) {
  const std::string path = Scratch() + "/qwen3-extra.gguf";
  AppendGgufTensor(FixtureDir("zoo/qwen3-tiny") + ".gguf", path, "blk.0.post_ffw_norm.weight");
  // The file still reads: the appended tensor is there and the model's load well.
  EXPECT_TRUE(LoadOnRanks(2, path, PlanCheck::kIgnore).ok());
  const absl::Status s = LoadOnRanks(2, path, PlanCheck::kError);
  EXPECT_TRUE(Contains(s, "1 tensor is not used by Qwen3ForCausalLM: blk.0.post_ffw_norm.weight "
                          "(model.layers.0.post_feedforward_layernorm.weight)"))
      << s;
  EXPECT_TRUE(LoadOnRanks(1, FixtureDir("zoo/qwen3-tiny") + ".gguf", PlanCheck::kError).ok());
}

}  // namespace
}  // namespace dt::nn::testing
