// nn/models/flux2: the transformer against diffusers' Flux2Transformer2DModel
// (tools/reference/make_flux2_fixtures.py) at tp = 1, 2, 4 on flux2-tiny and 1, 2, 3 on the
// bf16 pipeline fixture (threads backend); a 3-step denoising trajectory and the scheduler against
// diffusers' Flux2Pipeline; the collectives of a forward; the loader's accounting; every refusal
// (tp against heads and packed blocks, a fused projection of the wrong size, a plan key that
// matches nothing, config fields) with its message, before any weight is read.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/flow_match.h"
#include "dtensor/nn/models/flux2.h"
#include "dtensor/nn/styles.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/models/flux2_util.h"
#include "dtensor/tests/models/golden_checks.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dt::nn::testing {
namespace {

namespace fs = std::filesystem;
using dt::testing::Contains;

// The Flux2 model at `dir` on `tp` thread ranks.
absl::Status OnRanks(int tp, const std::string& dir, const RankFnOf<Flux2Transformer2DModel>& fn,
                     const Flux2LoadOptions& options = {}) {
  return OnThreadRanks<Flux2Transformer2DModel>(tp, dir, options, fn);
}

absl::Status Within(const Tensor& got, const Tensor& want, double tol, absl::string_view what) {
  DT_ASSIGN_OR_RETURN(double e, RelativeError(got, want));
  if (!(e <= tol)) {
    return absl::InternalError(
        absl::StrCat(what, ": ", e, " of the output's scale from diffusers (tolerance ", tol, ")"));
  }
  return absl::OkStatus();
}

// ---- the forward against diffusers ---------------------------------------------------------------

struct ForwardCase {
  const char* fixture;  // flux2-tiny (f32, guidance) or flux2-pipe (bf16 pipeline dir)
  int tp;
};

class Flux2Forward : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(Flux2Forward, MatchesDiffusersAndReadsOnlyItsShards) {
  const ForwardCase c = GetParam();
  auto in = FixtureInputs(c.fixture);
  ASSERT_TRUE(in.ok()) << in.status();
  auto want = FixtureTensor(c.fixture, "outputs.safetensors", "sample");
  ASSERT_TRUE(want.ok()) << want.status();
  absl::Status s = OnRanks(c.tp, Flux2Fixture(c.fixture), [&](int rank, Flux2Transformer2DModel& m,
                                                              const LoadReport& report) {
    CommCounter counter;
    DT_ASSIGN_OR_RETURN(Tensor sample, m.Run(*in));
    DT_RETURN_IF_ERROR(Within(sample, *want, 1e-4, absl::StrCat("rank ", rank, " sample")));
    // diffusers' plan: 4 all_reduces per double block and 1 per single block; Run's gather of
    // the replicated output costs nothing.
    const loaders::Flux2Config& cfg = m.config();
    const int64_t reduces = c.tp == 1 ? 0 : 4 * cfg.num_layers + cfg.num_single_layers;
    if (counter.counts().all_reduce != reduces || counter.counts().total() != reduces) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": collectives ",
                                              counter.counts().ToString(), ", want all_reduce=",
                                              reduces));
    }
    // The loader's accounting: each sharded weight read exactly its piece (several ranges for a
    // packed one), never the whole; the peak stays at full/tp + replicated.
    int sharded = 0;
    for (const LoadReport::Param& p : report.params) {
      if (p.read_bytes > p.full_bytes || (c.tp > 1 && p.sharded && p.read_bytes >= p.full_bytes)) {
        return absl::InternalError(absl::StrCat(p.name, " ", p.spec, ": rank ", rank, " read ",
                                                p.read_bytes, " of ", p.full_bytes, " bytes"));
      }
      sharded += p.sharded;
    }
    // 8 attention projections and 4 feed-forward linears per double block, 2 per single block.
    const int64_t want_sharded = c.tp == 1 ? 0 : 12 * cfg.num_layers + 2 * cfg.num_single_layers;
    if (sharded != want_sharded) {
      return absl::InternalError(absl::StrCat(sharded, " sharded parameters, want ", want_sharded));
    }
    return WithinLoadBound(report, c.tp, rank);
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Cases, Flux2Forward,
                         ::testing::Values(ForwardCase{"flux2-tiny", 1}, ForwardCase{"flux2-tiny", 2},
                                           ForwardCase{"flux2-tiny", 4}, ForwardCase{"flux2-pipe", 1},
                                           ForwardCase{"flux2-pipe", 2},
                                           ForwardCase{"flux2-pipe", 3}),
                         [](const auto& info) {
                           std::string name = info.param.fixture;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return absl::StrCat(name, "_tp", info.param.tp);
                         });

// Load whole, then shard in place (diffusers' enable_parallelism): the same placements and the
// same sample, bit for bit, as load-time sharding; each rank's load read every tensor whole.
TEST(Flux2LoadWhole, ShardsInPlaceToTheSameModel) {
  auto in = FixtureInputs("flux2-tiny");
  ASSERT_TRUE(in.ok()) << in.status();
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    LoadReport sharded_report, whole_report;
    DT_ASSIGN_OR_RETURN(auto sharded, Flux2Transformer2DModel::FromPretrained(
                                          Flux2Fixture("flux2-tiny"), mesh, {}, &sharded_report));
    Flux2LoadOptions o;
    o.load_whole = true;
    DT_ASSIGN_OR_RETURN(auto whole, Flux2Transformer2DModel::FromPretrained(
                                        Flux2Fixture("flux2-tiny"), mesh, o, &whole_report));
    if (whole_report.stats.bytes_read() <= sharded_report.stats.bytes_read()) {
      return absl::InternalError("load_whole did not read the whole tensors");
    }
    auto a = sharded->NamedParameters(), b = whole->NamedParameters();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].second->spec().ToString() != b[i].second->spec().ToString()) {
        return absl::InternalError(absl::StrCat(a[i].first, ": ", a[i].second->spec().ToString(),
                                                " vs ", b[i].second->spec().ToString()));
      }
    }
    DT_ASSIGN_OR_RETURN(Tensor x, sharded->Run(*in));
    DT_ASSIGN_OR_RETURN(Tensor y, whole->Run(*in));
    if (x.ToVector<float>() != y.ToVector<float>()) {
      return absl::InternalError("load_whole's sample differs from load-time sharding's");
    }
    // A plan load_whole could not apply is refused before anything is read.
    o.plan = Flux2Transformer2DModel::TPPlan();
    o.plan->emplace_back("transformer_blocks.*.attn.nope", "colwise");
    LoadReport refused;
    absl::Status bad =
        Flux2Transformer2DModel::FromPretrained(Flux2Fixture("flux2-tiny"), mesh, o, &refused)
            .status();
    if (!Contains(bad, "not applied on any of the layers") || refused.stats.bytes_read() != 0) {
      return absl::InternalError(absl::StrCat("bad plan with load_whole: ", bad.ToString(),
                                              ", read ", refused.stats.bytes_read()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The pieces diffusers exposes on its own: temb and the rotary tables of flux2-tiny's inputs
// (axes [4, 4, 4, 4], so rope_theta reaches them).
TEST(Flux2Pieces, TimestepEmbeddingAndRotaryTablesMatchDiffusers) {
  auto in = FixtureInputs("flux2-tiny");
  ASSERT_TRUE(in.ok()) << in.status();
  auto cfg = loaders::LoadFlux2Config(Flux2Fixture("flux2-tiny"));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto txt = in->txt_ids.Narrow(0, 0, 1)->Squeeze(0);
  auto img = in->img_ids.Narrow(0, 0, 1)->Squeeze(0);
  ASSERT_TRUE(txt.ok() && img.ok());
  auto ids = ops::Cat({*txt, *img}, 0);
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto tables = Flux2RotaryTables(*ids, cfg->axes_dims_rope, cfg->rope_theta);
  ASSERT_TRUE(tables.ok()) << tables.status();
  auto cos = FixtureTensor("flux2-tiny", "outputs.safetensors", "rope_cos");
  auto sin = FixtureTensor("flux2-tiny", "outputs.safetensors", "rope_sin");
  ASSERT_TRUE(cos.ok() && sin.ok());
  EXPECT_TRUE(Within(tables->first, *cos, 1e-6, "cos").ok());
  EXPECT_TRUE(Within(tables->second, *sin, 1e-6, "sin").ok());
  // A different theta gives other tables: the golden can tell.
  auto other = Flux2RotaryTables(*ids, cfg->axes_dims_rope, 10000.0);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(Within(other->first, *cos, 1e-3, "cos").ok());
  // Position ids as the pipeline makes them.
  auto latent_ids = Flux2LatentIds(4, 6);
  auto text_ids = Flux2TextIds(7);
  ASSERT_TRUE(latent_ids.ok() && text_ids.ok());
  EXPECT_EQ(latent_ids->To(DType::kF32)->ToVector<float>(), img->Contiguous()->ToVector<float>());
  EXPECT_EQ(text_ids->To(DType::kF32)->ToVector<float>(), txt->Contiguous()->ToVector<float>());
}

// ---- the pipeline: schedule and denoising trajectory ---------------------------------------------

TEST(Flux2Scheduler, SigmasAndTimestepsEqualDiffusers) {
  std::ifstream f(Flux2Fixture("flux2-scheduler.json"));
  ASSERT_TRUE(f.good());
  const nlohmann::json cases = nlohmann::json::parse(f);
  ASSERT_GE(cases.size(), 8u);
  auto config = loaders::LoadFlowMatchSchedulerConfig(Flux2Fixture("flux2-pipe"));
  ASSERT_TRUE(config.ok()) << config.status();
  for (const nlohmann::json& c : cases) {
    const int64_t len = c["image_seq_len"], steps = c["steps"];
    SCOPED_TRACE(absl::StrCat("image_seq_len ", len, ", ", steps, " steps"));
    const double mu = Flux2EmpiricalMu(len, steps);
    EXPECT_EQ(mu, c["mu"].get<double>());
    FlowMatchEulerScheduler s(*config);
    ASSERT_TRUE(s.SetTimesteps(steps, mu).ok());
    EXPECT_EQ(s.sigmas(), c["sigmas"].get<std::vector<float>>());
    EXPECT_EQ(s.timesteps(), c["timesteps"].get<std::vector<float>>());
  }
  FlowMatchEulerScheduler dynamic(*config);
  EXPECT_FALSE(dynamic.SetTimesteps(4, std::nan("")).ok());
  EXPECT_FALSE(dynamic.SetTimesteps(0, 1.0).ok());
}

class Flux2Trajectory : public ::testing::TestWithParam<int> {};

TEST_P(Flux2Trajectory, ThreeEulerStepsMatchDiffusersPipeline) {
  const int tp = GetParam();
  auto read = [](const std::string& name) {
    return FixtureTensor("flux2-pipe", "trajectory.safetensors", name);
  };
  // (The file's f64 `mu` is not read: the loaders take no f64 tensors. mu for this image length
  // and step count is checked against diffusers in SigmasAndTimestepsEqualDiffusers, and the
  // sigmas below depend on it bit for bit.)
  auto sigmas = read("sigmas"), embeds = read("prompt_embeds");
  auto img_ids = read("img_ids"), txt_ids = read("txt_ids"), x0 = read("latents_0");
  ASSERT_TRUE(sigmas.ok() && embeds.ok() && img_ids.ok() && txt_ids.ok() && x0.ok());
  auto config = loaders::LoadFlowMatchSchedulerConfig(Flux2Fixture("flux2-pipe"));
  ASSERT_TRUE(config.ok()) << config.status();
  FlowMatchEulerScheduler scheduler(*config);
  const int64_t seq = x0->size(1);
  ASSERT_TRUE(scheduler.SetTimesteps(3, Flux2EmpiricalMu(seq, 3)).ok());
  ASSERT_EQ(scheduler.sigmas(), sigmas->ToVector<float>());
  absl::Status s = OnRanks(tp, Flux2Fixture("flux2-pipe"), [&](int rank, Flux2Transformer2DModel& m,
                                                               const LoadReport&) {
    Tensor x = *x0;
    for (int64_t i = 0; i < scheduler.num_steps(); ++i) {
      Flux2Inputs in;
      in.hidden_states = x;
      in.encoder_hidden_states = *embeds;
      DT_ASSIGN_OR_RETURN(in.timestep,
                          Tensor::FromVector<float>({1}, {scheduler.timesteps()[i] / 1000.0f}));
      in.img_ids = *img_ids;
      in.txt_ids = *txt_ids;
      DT_ASSIGN_OR_RETURN(Tensor v, m.Run(in));
      DT_ASSIGN_OR_RETURN(Tensor want_v, read(absl::StrCat("noise_pred_", i)));
      DT_RETURN_IF_ERROR(Within(v, want_v, 1e-3, absl::StrCat("rank ", rank, " noise_pred_", i)));
      DT_ASSIGN_OR_RETURN(x, scheduler.Step(v, i, x));
      DT_ASSIGN_OR_RETURN(Tensor want_x, read(absl::StrCat("latents_", i + 1)));
      DT_RETURN_IF_ERROR(Within(x, want_x, 1e-3, absl::StrCat("rank ", rank, " latents_", i + 1)));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(TP, Flux2Trajectory, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return absl::StrCat("tp", info.param); });

// ---- refusals, before any weight is read ---------------------------------------------------------

absl::Status Load(int tp, const std::string& dir, const Flux2LoadOptions& options = {}) {
  return OnRanks(
      tp, dir, [](int, Flux2Transformer2DModel&, const LoadReport&) { return absl::OkStatus(); },
      options);
}

TEST(Flux2Validation, TPMustDivideTheHeads) {
  absl::Status three = Load(3, Flux2Fixture("flux2-tiny"));
  EXPECT_EQ(three.code(), absl::StatusCode::kInvalidArgument) << three;
  EXPECT_TRUE(Contains(three, "tensor parallel size 3 does not divide num_attention_heads 4"));
  absl::Status four = Load(4, Flux2Fixture("flux2-pipe"));
  EXPECT_TRUE(Contains(four, "tensor parallel size 4 does not divide num_attention_heads 6"));
}

// A config whose heads divide by tp but whose MLP width does not: diffusers' check on every
// packed block on its own. Needs no checkpoint.
TEST(Flux2Validation, TPMustDivideEveryPackedBlock) {
  loaders::Flux2Config c;
  c.num_layers = 1;
  c.num_single_layers = 1;
  c.num_attention_heads = 4;
  c.attention_head_dim = 8;
  c.axes_dims_rope = {2, 2, 2, 2};
  c.in_channels = c.out_channels = 8;
  c.joint_attention_dim = 8;
  c.timestep_guidance_channels = 8;
  c.mlp_ratio = 2.8;  // M = int(32 · 2.8) = 89
  ASSERT_EQ(c.mlp_hidden_dim(), 89);
  absl::Status s = World::RunThreads(2, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, InitDeviceMesh(w.shared_from_this(), {2}, {"tp"}));
    Flux2Transformer2DModel m(c, DType::kF32);
    return m.Parallelize(mesh, Flux2Transformer2DModel::TPPlan(c));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "tensor parallel size 2 does not divide packed block 0 of "
                          "'transformer_blocks.*.ff.linear_in [gate|up]' [89, 89]"));
}

// flux2-tiny with `name` cut to `rows` rows (or dropped when rows < 0), and config.json edited.
std::string EditedTiny(const std::string& tag, const std::string& name, int64_t rows,
                       const std::function<void(nlohmann::json&)>& edit_config = {}) {
  static const dt::testing::ScratchDir scratch("flux2");
  const std::string dir = absl::StrCat(scratch.path, "/", tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(Flux2Fixture("flux2-tiny") + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  if (edit_config) edit_config(config);
  std::ofstream(dir + "/config.json") << config.dump(2);
  auto c = loaders::Checkpoint::Open(Flux2Fixture("flux2-tiny")).value();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : c.names()) {
    Tensor t = c.Read(n).value();
    if (n == name && rows < 0) continue;
    if (n == name) t = t.Narrow(0, 0, rows).value();
    tensors.emplace_back(n, t);
  }
  DT_CHECK_OK(loaders::WriteSafetensors(dir + "/diffusion_pytorch_model.safetensors", tensors));
  return dir;
}

TEST(Flux2Validation, FusedProjectionOfTheWrongSizeIsNamed) {
  // 3·D + 2·M = 3·64 + 2·192 = 576 rows; a checkpoint with 3·D + M (another model's layout).
  const std::string name = "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight";
  absl::Status s = Load(2, EditedTiny("short", name, 384));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, name));
  EXPECT_TRUE(Contains(s, "576"));
  EXPECT_TRUE(Contains(s, "384"));
  absl::Status missing = Load(1, EditedTiny("missing", "proj_out.weight", -1));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_TRUE(Contains(missing, "proj_out.weight"));
}

TEST(Flux2Validation, PlanKeyThatMatchesNothingIsRefused) {
  Flux2LoadOptions o;
  o.plan = Flux2Transformer2DModel::TPPlan();
  o.plan->emplace_back("transformer_blocks.*.attn.to_qkv", "colwise");
  absl::Status s = Load(2, Flux2Fixture("flux2-tiny"), o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "transformer_blocks.*.attn.to_qkv"));
  EXPECT_TRUE(Contains(s, "The following TP rules were not applied on any of the layers"));
}

// A user plan whose block list does not sum to the fused weight's rows (Q|K|V|gate without up).
TEST(Flux2Validation, BlockListThatDoesNotSumToTheWeightIsRefused) {
  Flux2LoadOptions o;
  o.plan = Flux2Transformer2DModel::TPPlan();
  for (auto& [key, entry] : *o.plan) {
    if (key == "single_transformer_blocks.*.attn.to_qkv_mlp_proj") {
      entry = PlanEntry(std::make_shared<PackedColwiseParallel>(std::vector<int64_t>{64, 64, 64, 192}));
    }
  }
  absl::Status s = Load(2, Flux2Fixture("flux2-tiny"), o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "576")) << s;
  EXPECT_TRUE(Contains(s, "[64, 64, 64, 192]")) << s;
}

TEST(Flux2Validation, ConfigFieldsAreCheckedNotIgnored) {
  absl::Status unknown = Load(1, EditedTiny("unknown", "", 0, [](nlohmann::json& j) {
    j["qkv_bias"] = true;
  }));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnimplemented) << unknown;
  EXPECT_TRUE(Contains(unknown, "qkv_bias"));
  absl::Status cls = Load(1, EditedTiny("class", "", 0, [](nlohmann::json& j) {
    j["_class_name"] = "FluxTransformer2DModel";
  }));
  EXPECT_TRUE(Contains(cls, "FluxTransformer2DModel"));
  absl::Status axes = Load(1, EditedTiny("axes", "", 0, [](nlohmann::json& j) {
    j["axes_dims_rope"] = {4, 4, 4, 2};
  }));
  EXPECT_TRUE(Contains(axes, "axes_dims_rope"));
  // One more block in the config than in the file.
  absl::Status blocks = Load(1, EditedTiny("blocks", "", 0, [](nlohmann::json& j) {
    j["num_single_layers"] = 3;
  }));
  EXPECT_TRUE(Contains(blocks, "num_single_layers"));
}

TEST(Flux2Validation, BadInputsAreRefused) {
  absl::Status s = OnRanks(1, Flux2Fixture("flux2-tiny"), [](int, Flux2Transformer2DModel& m,
                                                              const LoadReport&) {
    DT_ASSIGN_OR_RETURN(Flux2Inputs in, FixtureInputs("flux2-tiny"));
    Flux2Inputs wrong = in;
    DT_ASSIGN_OR_RETURN(wrong.hidden_states, Tensor::Zeros({2, 24, 15}, DType::kF32));
    EXPECT_TRUE(Contains(m.Run(wrong).status(), "hidden_states must be [B, S_img > 0, 16]"));
    wrong = in;
    wrong.guidance = Tensor();
    EXPECT_TRUE(Contains(m.Run(wrong).status(), "guidance"));
    wrong = in;
    DT_ASSIGN_OR_RETURN(wrong.img_ids, Tensor::Zeros({2, 23, 4}, DType::kF32));
    EXPECT_TRUE(Contains(m.Run(wrong).status(), "img_ids"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dt::nn::testing
