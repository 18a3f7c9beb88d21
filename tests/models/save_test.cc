// nn/save (SaveGathered) on Llama: a model loaded at tp=4 saved as one HF checkpoint gives back
// the original tensors bit for bit and reloads at tp=2 and tp=1 with the outputs of the original;
// a failed or killed save leaves the previous checkpoint untouched (Note [Saving atomically]).
#include "dtensor/nn/save.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/tests/models/llama_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / absl::StrCat("dt_save_", ::getpid(), "_", name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Runs fn on `tp` thread ranks, each with the model at `dir` loaded over tp.
absl::Status OnRanks(int tp, const std::string& dir,
                     const std::function<absl::Status(int rank, LlamaForCausalLM&)>& fn) {
  return World::RunThreads(tp, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {tp}, {"tp"}));
    DT_ASSIGN_OR_RETURN(auto model, LlamaForCausalLM::FromPretrained(dir, mesh));
    return fn(w.rank(), *model);
  });
}

absl::StatusOr<Tensor> Logits(const std::string& dir, int tp, const std::vector<int64_t>& prompt) {
  Tensor out;
  DT_RETURN_IF_ERROR(OnRanks(tp, dir, [&](int rank, LlamaForCausalLM& m) -> absl::Status {
    DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>(
                                        {1, static_cast<int64_t>(prompt.size())}, prompt));
    DT_ASSIGN_OR_RETURN(Tensor l, m.Logits(ids));
    if (rank == 0) out = l;
    return absl::OkStatus();
  }));
  return out;
}

absl::Status Save(const std::string& from, int tp, const std::string& to, int64_t max_file_bytes,
                  const std::function<void(SaveOptions&)>& edit = nullptr) {
  return OnRanks(tp, from, [&](int, LlamaForCausalLM& m) {
    SaveOptions o = m.save_options();
    o.max_file_bytes = max_file_bytes;
    if (edit) edit(o);
    return SaveGathered(m, to, o);
  });
}

// Every file of a directory with its bytes.
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    files[e.path().filename().string()] = ss.str();
  }
  return files;
}

bool NoLeftovers(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir.parent_path())) {
    if (absl::StartsWith(e.path().filename().string(), dir.filename().string() + ".saving-")) {
      return false;
    }
  }
  return true;
}

void ExpectSameTensors(const std::string& a, const std::string& b) {
  auto ca = loaders::Checkpoint::Open(a);
  auto cb = loaders::Checkpoint::Open(b);
  ASSERT_TRUE(ca.ok() && cb.ok()) << ca.status() << cb.status();
  ASSERT_EQ(ca->names(), cb->names());
  for (const std::string& name : ca->names()) {
    auto ta = ca->Read(name);
    auto tb = cb->Read(name);
    ASSERT_TRUE(ta.ok() && tb.ok()) << name;
    ASSERT_EQ(ta->dtype(), tb->dtype()) << name;
    ASSERT_EQ(ta->shape(), tb->shape()) << name;
    EXPECT_EQ(0, std::memcmp(ta->raw_data(), tb->raw_data(), ta->nbytes())) << name;
  }
}

TEST(SaveGathered, Tp4CheckpointIsTheOriginalAndReloadsAtTp2AndTp1) {
  const std::string fixture = FixtureDir("llama-tiny");
  const fs::path out = TempDir("tp4") / "ckpt";
  // 200 KB files: the 0.9 MB model is split over several files with an index.
  ASSERT_TRUE(Save(fixture, 4, out, 200'000).ok());
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out / "config.json"));
  ExpectSameTensors(fixture, out);
  EXPECT_TRUE(NoLeftovers(out));

  const Golden g = LoadGolden("llama-tiny");
  for (int tp : {2, 1}) {
    auto want = Logits(fixture, tp, g.prompt);
    auto got = Logits(out, tp, g.prompt);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    // The same tp on the same tensors: the same arithmetic, so bitwise equal.
    EXPECT_EQ(MaxAbsDiff(*got, want->ToVector<float>()), 0.0) << "tp=" << tp;
    EXPECT_LE(MaxAbsDiff(*got, g.f32.prompt_logits), 1e-4) << "tp=" << tp << " vs transformers";
  }
}

TEST(SaveGathered, TiedBf16ModelLeavesLmHeadOut) {
  const std::string fixture = FixtureDir("llama-tiny-tied-bf16");
  const fs::path out = TempDir("tied") / "ckpt";
  ASSERT_TRUE(Save(fixture, 2, out, 0).ok());
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  ExpectSameTensors(fixture, out);
}

TEST(SaveGathered, FailedSaveLeavesThePreviousCheckpoint) {
  const fs::path out = TempDir("fail") / "ckpt";
  ASSERT_TRUE(Save(FixtureDir("llama-tiny"), 2, out, 0).ok());
  { std::ofstream(out / "tokenizer.json") << "{}"; }
  const auto before = Snapshot(out);
  // Fails after every weight is written: the extra file's name is not a plain name.
  const absl::Status s = Save(FixtureDir("llama-tiny-tied-bf16"), 2, out, 0,
                              [](SaveOptions& o) { o.files["../escape.json"] = "{}"; });
  ASSERT_FALSE(s.ok());
  // The writing rank names the reason; the other rank learns that the save failed.
  EXPECT_TRUE(absl::StrContains(s.message(), "must be a plain name") ||
              absl::StrContains(s.message(), "the writing rank 0 failed to save"))
      << s;
  EXPECT_EQ(Snapshot(out), before);
  EXPECT_TRUE(NoLeftovers(out));
  // A later save replaces the weights and keeps the files it does not write.
  ASSERT_TRUE(Save(FixtureDir("llama-tiny-tied-bf16"), 2, out, 0).ok());
  ExpectSameTensors(FixtureDir("llama-tiny-tied-bf16"), out);
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
}

TEST(SaveGathered, KilledMidSaveLeavesThePreviousCheckpoint) {
  const fs::path out = TempDir("kill") / "ckpt";
  ASSERT_TRUE(Save(FixtureDir("llama-tiny"), 1, out, 0).ok());
  const auto before = Snapshot(out);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Dies after writing 5 tensors of the new checkpoint, as a crash or a killed rank would.
    (void)Save(FixtureDir("llama-tiny"), 1, out, 100'000, [](SaveOptions& o) {
      o.on_progress = [](int64_t done, int64_t, int64_t) {
        if (done == 5) ::raise(SIGKILL);
      };
    });
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(Snapshot(out), before);
  EXPECT_FALSE(NoLeftovers(out));  // the dead save's staging directory
  ASSERT_TRUE(Save(FixtureDir("llama-tiny"), 1, out, 100'000).ok());
  EXPECT_TRUE(NoLeftovers(out));  // removed by the next save
  ExpectSameTensors(FixtureDir("llama-tiny"), out);
}

class Empty : public Module {
 public:
  Empty() : Module("Empty") {}

 protected:
  absl::StatusOr<Values> Forward(Values inputs) override { return inputs; }
};

TEST(SaveGathered, RefusesAModelWithNothingToSave) {
  absl::Status s = World::RunThreads(1, [&](World&) -> absl::Status {
    Empty empty;
    return SaveGathered(empty, (TempDir("empty") / "ckpt").string());
  });
  EXPECT_TRUE(absl::StrContains(s.message(), "no parameters")) << s;
}

}  // namespace
}  // namespace dt::nn::testing
