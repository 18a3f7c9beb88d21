// Flux2 denoising with tensor parallelism, from a diffusers checkpoint sharded at load time: each
// rank reads only its own rows/columns of every weight (several ranges of each packed one).
//
//   dtrun --nproc-per-node 2 build/bin/flux2_generate --model tests/fixtures/flux2-pipe
//       --steps 4 --height 128 --width 128 --seed 1 --out /tmp/flux2
//   build/bin/flux2_generate --model DIR --inputs IN.safetensors --output OUT.safetensors
//
// Generation: flow-matching Euler with the schedule of diffusers' Flux2Pipeline
// (FlowMatchEulerDiscreteScheduler from DIR/scheduler/scheduler_config.json, FLUX.2-dev's settings
// when DIR is a bare transformer; dynamic shifting with mu from the image sequence length).
// Latents [1, (H/16)·(W/16), in_channels] are seeded (--seed; the same on every rank and every tp),
// position ids are made as the pipeline makes them (image (0, row, col, 0), text (0, 0, 0, l)).
// Text embeddings come from --prompt-embeds FILE.safetensors (its tensor "prompt_embeds",
// [1, S, joint_attention_dim] or [S, joint_attention_dim], f32/bf16/f16; encode the prompt with the
// pipeline's text encoder in Python) or are seeded (--text-tokens N, default 32). Per step it prints
// the time, the collectives and the step's sigma; at the end each rank's peak memory. --out DIR
// receives latents.safetensors (tensor "latents", [1, S, C] f32) and preview.png (examples/
// latent_preview.h: the latents' first channels, not a decoded image).
//
// `flux2_generate --help` lists every flag with its default. Verification mode: --inputs
// IN.safetensors --output OUT.safetensors runs one forward on diffusers' inputs (tests/fixtures/flux2-*)
// and writes `sample` (rank 0 writes); with --reference REF.safetensors (diffusers' output, tensor
// `sample`) every rank exits 1 unless its sample is within 1e-4 of REF's scale.
//
// The world comes from the launcher (dtrun/torchrun, mpirun, srun; DT_BACKEND picks the backend);
// without one it runs on a single rank.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "dtensor/core/process_stats.h"
#include "dtensor/core/progress.h"
#include "dtensor/core/status.h"
#include "dtensor/examples/latent_preview.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "dtensor/mesh/comm_counter.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/flow_match.h"
#include "dtensor/nn/models/flux2.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(std::string, model, "", "a diffusers transformer directory, or a pipeline directory with transformer/ (required)");
ABSL_FLAG(int64_t, steps, 4, "denoising steps");
ABSL_FLAG(int64_t, height, 256, "image height in pixels (a multiple of 16)");
ABSL_FLAG(int64_t, width, 256, "image width in pixels (a multiple of 16)");
ABSL_FLAG(uint64_t, seed, 0, "seed of the latents (and of the text embeddings without --prompt-embeds)");
ABSL_FLAG(double, guidance, 4.0, "guidance scale, used when the model embeds guidance");
ABSL_FLAG(std::string, prompt_embeds, "", "text embeddings: a safetensors file with tensor prompt_embeds");
ABSL_FLAG(int64_t, text_tokens, 32, "seeded text tokens when there is no --prompt-embeds");
ABSL_FLAG(std::string, dtype, "f32", "compute dtype: f32, bf16 or f16 (f32 as diffusers' from_pretrained)");
ABSL_FLAG(std::string, out, "", "write the final latents and a preview PNG into this directory");
ABSL_FLAG(std::string, save_to, "", "save the loaded model, gathered, as a diffusers checkpoint here");
ABSL_FLAG(std::string, inputs, "", "verification mode: diffusers' forward inputs (safetensors)");
ABSL_FLAG(std::string, output, "", "verification mode: write `sample` here (rank 0)");
ABSL_FLAG(std::string, reference, "", "verification mode: exit 1 unless `sample` is within 1e-4 of this file's scale");
ABSL_FLAG(bool, check, false, "rank 0 reruns on one rank; every rank exits 1 unless the final latents agree within 1e-4 of their scale");
ABSL_FLAG(bool, quiet, false, "print only the result lines");
ABSL_FLAG(bool, allow_unused_weights, false,
          "load a checkpoint that holds tensors the model does not read, with a warning naming "
          "them (refused by default: Note [Every tensor is used])");

namespace {

using dt::DeviceMesh;
using dt::DType;
using dt::Tensor;
using dt::World;
using dt::nn::Flux2Transformer2DModel;

struct Args {
  std::string model;
  int64_t steps = 4;
  int64_t height = 256, width = 256;
  uint64_t seed = 0;
  double guidance = 4.0;
  std::string prompt_embeds;
  int64_t text_tokens = 32;
  DType dtype = DType::kF32;
  std::string out;
  std::string save_to;
  std::string inputs, output, reference;  // verification mode
  bool check = false;
  bool quiet = false;
  bool allow_unused_weights = false;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  dt::cli::ParseFlags(argc, argv,
                      "usage: flux2_generate --model DIR [flags]\n"
                      "Flux2 tensor-parallel denoising from a diffusers checkpoint (under dtrun: one rank per process)");
  Args a;
  a.model = absl::GetFlag(FLAGS_model);
  a.steps = absl::GetFlag(FLAGS_steps);
  a.height = absl::GetFlag(FLAGS_height);
  a.width = absl::GetFlag(FLAGS_width);
  a.text_tokens = absl::GetFlag(FLAGS_text_tokens);
  a.seed = absl::GetFlag(FLAGS_seed);
  a.guidance = absl::GetFlag(FLAGS_guidance);
  a.prompt_embeds = absl::GetFlag(FLAGS_prompt_embeds);
  DT_ASSIGN_OR_RETURN(a.dtype, dt::ParseDType(absl::GetFlag(FLAGS_dtype)));
  a.out = absl::GetFlag(FLAGS_out);
  a.save_to = absl::GetFlag(FLAGS_save_to);
  a.inputs = absl::GetFlag(FLAGS_inputs);
  a.output = absl::GetFlag(FLAGS_output);
  a.reference = absl::GetFlag(FLAGS_reference);
  a.check = absl::GetFlag(FLAGS_check);
  a.quiet = absl::GetFlag(FLAGS_quiet);
  a.allow_unused_weights = absl::GetFlag(FLAGS_allow_unused_weights);
  for (const auto& [name, v] : {std::pair{"steps", a.steps}, {"height", a.height}, {"width", a.width},
                                {"text-tokens", a.text_tokens}}) {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("--", name, ": want a positive integer, got ", v));
  }
  if (!std::isfinite(a.guidance)) return absl::InvalidArgumentError("--guidance: not a finite number");
  if (a.model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  if (a.inputs.empty() != a.output.empty()) {
    return absl::InvalidArgumentError("verification mode needs both --inputs and --output");
  }
  if (!a.reference.empty() && a.inputs.empty()) {
    return absl::InvalidArgumentError("--reference needs verification mode (--inputs, --output)");
  }
  if (a.height % 16 != 0 || a.width % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--height and --width are pixels and must be multiples of 16 (VAE 8x, then 2x2 patches), "
        "got ", a.height, " x ", a.width));
  }
  return a;
}

std::string MB(int64_t bytes) { return absl::StrFormat("%.1f MB", bytes / 1e6); }

absl::StatusOr<Tensor> Read(const dt::loaders::Checkpoint& c, const std::string& name) {
  DT_ASSIGN_OR_RETURN(Tensor t, c.Read(name));
  return t.To(DType::kF32);
}

// --inputs/--output: one forward on diffusers' tensors.
absl::Status Verify(const Args& a, Flux2Transformer2DModel& model, const DeviceMesh& mesh) {
  DT_ASSIGN_OR_RETURN(dt::loaders::Checkpoint c, dt::loaders::Checkpoint::Open(a.inputs));
  dt::nn::Flux2Inputs in;
  DT_ASSIGN_OR_RETURN(in.hidden_states, Read(c, "hidden_states"));
  DT_ASSIGN_OR_RETURN(in.encoder_hidden_states, Read(c, "encoder_hidden_states"));
  DT_ASSIGN_OR_RETURN(in.timestep, Read(c, "timestep"));
  if (c.Info("guidance").ok()) {
    DT_ASSIGN_OR_RETURN(in.guidance, Read(c, "guidance"));
  }
  DT_ASSIGN_OR_RETURN(in.img_ids, c.Read("img_ids"));
  DT_ASSIGN_OR_RETURN(in.txt_ids, c.Read("txt_ids"));
  DT_ASSIGN_OR_RETURN(Tensor sample, model.Run(in));
  DT_ASSIGN_OR_RETURN(sample, sample.To(DType::kF32));
  if (mesh.my_rank() == mesh.ranks().front()) {
    DT_RETURN_IF_ERROR(dt::loaders::WriteSafetensors(a.output, {{"sample", sample}}));
    std::printf("wrote sample %s to %s\n", sample.Describe().c_str(), a.output.c_str());
  }
  if (a.reference.empty()) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(dt::loaders::Checkpoint ref, dt::loaders::Checkpoint::Open(a.reference));
  DT_ASSIGN_OR_RETURN(Tensor want, Read(ref, "sample"));
  if (want.shape() != sample.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("--reference: sample is ", want.Describe(),
                                                   ", the model gave ", sample.Describe()));
  }
  DT_ASSIGN_OR_RETURN(const double diff, dt::MaxRelativeDiff(sample, want));
  std::printf("rank %d: sample within %.2g of the reference's scale (tolerance 1e-4)\n",
              mesh.my_rank(), diff);
  if (!(diff <= 1e-4)) {
    return absl::InternalError(absl::StrCat("sample differs from ", a.reference, " by ", diff,
                                            " of its scale"));
  }
  return absl::OkStatus();
}

// The text embeddings [1, S, ctx] in f32: from --prompt-embeds or seeded.
absl::StatusOr<Tensor> PromptEmbeds(const Args& a, int64_t ctx) {
  if (a.prompt_embeds.empty()) {
    return Tensor::Randn({1, a.text_tokens, ctx}, a.seed ^ 0x9e3779b97f4a7c15ull);
  }
  DT_ASSIGN_OR_RETURN(dt::loaders::Checkpoint c, dt::loaders::Checkpoint::Open(a.prompt_embeds));
  DT_ASSIGN_OR_RETURN(Tensor t, Read(c, "prompt_embeds"));
  if (t.dim() == 2) {
    DT_ASSIGN_OR_RETURN(t, t.Unsqueeze(0));
  }
  if (t.dim() != 3 || t.size(0) != 1 || t.size(2) != ctx || t.size(1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        a.prompt_embeds, ": prompt_embeds must be [1, S, ", ctx, "] (the model's joint_attention_dim), got ",
        t.Describe()));
  }
  return t;
}

struct Denoised {
  Tensor latents;  // [1, S, C] f32
  double seconds = 0;
};

// The denoising loop; `report` prints per-step lines and shows the bar (the leading rank).
absl::StatusOr<Denoised> Denoise(const Args& a, Flux2Transformer2DModel& model, bool report) {
  const dt::loaders::Flux2Config& c = model.config();
  const int64_t h = a.height / 16, w = a.width / 16, seq = h * w;
  DT_ASSIGN_OR_RETURN(dt::loaders::FlowMatchSchedulerConfig sc,
                      dt::loaders::LoadFlowMatchSchedulerConfig(a.model));
  dt::nn::FlowMatchEulerScheduler scheduler(sc);
  const double mu = dt::nn::Flux2EmpiricalMu(seq, a.steps);
  DT_RETURN_IF_ERROR(scheduler.SetTimesteps(a.steps, mu));

  dt::nn::Flux2Inputs in;
  DT_ASSIGN_OR_RETURN(in.hidden_states, Tensor::Randn({1, seq, c.in_channels}, a.seed));
  DT_ASSIGN_OR_RETURN(in.encoder_hidden_states, PromptEmbeds(a, c.joint_attention_dim));
  DT_ASSIGN_OR_RETURN(in.img_ids, dt::nn::Flux2LatentIds(h, w));
  DT_ASSIGN_OR_RETURN(in.txt_ids, dt::nn::Flux2TextIds(in.encoder_hidden_states.size(1)));
  if (c.guidance_embeds) {
    DT_ASSIGN_OR_RETURN(in.guidance, Tensor::FromVector<float>({1}, {static_cast<float>(a.guidance)}));
  }
  if (report) {
    std::printf("denoising %lld steps: %lld x %lld px = %lld image tokens (%lld x %lld) + %lld text "
                "tokens, mu %.4f, sigmas %.4f .. %.4f%s\n",
                static_cast<long long>(a.steps), static_cast<long long>(a.height),
                static_cast<long long>(a.width), static_cast<long long>(seq),
                static_cast<long long>(h), static_cast<long long>(w),
                static_cast<long long>(in.encoder_hidden_states.size(1)), mu,
                scheduler.sigmas().front(), scheduler.sigmas()[a.steps - 1],
                c.guidance_embeds ? absl::StrFormat(", guidance %.2f", a.guidance).c_str() : "");
    std::fflush(stdout);
  }
  dt::ProgressBar bar("denoising", 0, a.steps, "steps", report);
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < scheduler.num_steps(); ++i) {
    const absl::Time ts = absl::Now();
    dt::CommCounter counter;
    DT_ASSIGN_OR_RETURN(in.timestep,
                        Tensor::FromVector<float>({1}, {scheduler.timesteps()[i] / 1000.0f}));
    DT_ASSIGN_OR_RETURN(Tensor v, model.Run(in));
    DT_ASSIGN_OR_RETURN(in.hidden_states, scheduler.Step(v, i, in.hidden_states));
    if (report) {
      bar.Clear();
      std::printf("step %lld/%lld  sigma %.4f -> %.4f  %.1f ms  collectives: %s\n",
                  static_cast<long long>(i + 1), static_cast<long long>(a.steps),
                  scheduler.sigmas()[i], scheduler.sigmas()[i + 1],
                  absl::ToDoubleMilliseconds(absl::Now() - ts), counter.counts().ToString().c_str());
      std::fflush(stdout);
      bar.Update(0, i + 1);
    }
  }
  bar.Finish();
  return Denoised{in.hidden_states, absl::ToDoubleSeconds(absl::Now() - t0)};
}

// Rank 0 only: the same denoising on one rank (threads backend, in this process).
absl::StatusOr<Tensor> SingleRankLatents(const Args& a) {
  Tensor latents;
  DT_RETURN_IF_ERROR(World::RunThreads(1, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(DeviceMesh mesh, dt::InitDeviceMesh(w.shared_from_this(), {1}, {"tp"}));
    dt::nn::Flux2LoadOptions o;
    o.dtype = a.dtype;
    o.unused_tensors =
        a.allow_unused_weights ? dt::nn::PlanCheck::kIgnore : dt::nn::PlanCheck::kError;
    DT_ASSIGN_OR_RETURN(auto model, Flux2Transformer2DModel::FromPretrained(a.model, mesh, o));
    DT_ASSIGN_OR_RETURN(Denoised d, Denoise(a, *model, /*report=*/false));
    latents = d.latents;
    return absl::OkStatus();
  }));
  return latents;
}

absl::Status Run(const Args& a) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<World> world, World::FromEnv());
  DT_ASSIGN_OR_RETURN(DeviceMesh tp, dt::InitDeviceMesh(world, {world->size()}, {"tp"}));
  const bool lead = world->rank() == 0;
  dt::nn::Flux2LoadOptions o;
  o.dtype = a.dtype;
  o.unused_tensors = a.allow_unused_weights ? dt::nn::PlanCheck::kWarn : dt::nn::PlanCheck::kError;
  dt::nn::LoadReport report;
  DT_ASSIGN_OR_RETURN(auto model, Flux2Transformer2DModel::FromPretrained(a.model, tp, o, &report));
  const dt::loaders::Flux2Config& c = model->config();
  if (lead && !a.quiet) {
    std::printf("model %s: %s, %.2fM parameters\n", a.model.c_str(), c.Summary().c_str(),
                c.NumParameters() / 1e6);
    std::printf("mesh %s, backend %s, compute %s\n", tp.ToString().c_str(),
                std::string(world->backend()).c_str(), dt::DTypeName(model->dtype()).data());
  }
  std::fflush(stdout);
  DT_ASSIGN_OR_RETURN(dt::CommPtr comm, tp.Comm(0));
  DT_RETURN_IF_ERROR(comm->Barrier());
  if (!a.quiet) {
    std::printf("rank %d holds %s of %s (%.0f%%: sharded %s / %d + replicated %s); read %s, "
                "loaded in %.1f ms\n",
                world->rank(), MB(report.local_bytes).c_str(), MB(report.full_bytes).c_str(),
                100.0 * report.local_bytes / std::max<int64_t>(1, report.full_bytes),
                MB(report.sharded_full_bytes).c_str(), world->size(),
                MB(report.replicated_bytes).c_str(), MB(report.stats.bytes_read()).c_str(),
                report.seconds * 1e3);
    std::fflush(stdout);
  }
  DT_RETURN_IF_ERROR(comm->Barrier());

  if (!a.save_to.empty()) {
    const absl::Time t0 = absl::Now();
    DT_RETURN_IF_ERROR(dt::nn::SaveGathered(*model, a.save_to, model->save_options()));
    if (lead) {
      std::printf("saved the model gathered to %s in %.1f ms\n", a.save_to.c_str(),
                  absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
  }
  if (!a.inputs.empty()) return Verify(a, *model, tp);

  DT_ASSIGN_OR_RETURN(Denoised d, Denoise(a, *model, lead && !a.quiet));
  DT_ASSIGN_OR_RETURN(Tensor latents, d.latents.To(DType::kF32));
  if (!a.quiet) {
    std::printf("rank %d: %lld steps in %.2f s, peak memory %s\n", world->rank(),
                static_cast<long long>(a.steps), d.seconds, MB(dt::PeakResidentBytes()).c_str());
    std::fflush(stdout);
  }
  if (lead && !a.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    const std::string file = (std::filesystem::path(a.out) / "latents.safetensors").string();
    const std::string png = (std::filesystem::path(a.out) / "preview.png").string();
    DT_RETURN_IF_ERROR(dt::loaders::WriteSafetensors(file, {{"latents", latents}}));
    DT_RETURN_IF_ERROR(
        dt::examples::WriteLatentPreview(png, latents, a.height / 16, a.width / 16));
    std::printf("wrote %s and %s\n", file.c_str(), png.c_str());
  }
  if (!a.check) return absl::OkStatus();
  DT_ASSIGN_OR_RETURN(Tensor verdict, Tensor::FromVector<int64_t>({1}, {0}));
  if (lead) {
    absl::StatusOr<Tensor> single = SingleRankLatents(a);
    const absl::StatusOr<double> rel =
        single.ok() ? dt::MaxRelativeDiff(latents, *single) : absl::StatusOr<double>(INFINITY);
    const double diff = rel.ok() ? *rel : INFINITY;
    verdict.data<int64_t>()[0] = diff <= 1e-4 ? 1 : 0;
    if (diff <= 1e-4) {
      std::printf("check: the latents are within %.2g of the single-rank run's scale\n", diff);
    } else {
      std::printf("check FAILED: %s\n", single.ok() ? absl::StrCat("relative difference ", diff).c_str()
                                                    : single.status().ToString().c_str());
    }
  }
  DT_RETURN_IF_ERROR(comm->Broadcast(verdict, 0));
  if (verdict.data<int64_t>()[0] != 1) {
    return absl::InternalError("tensor-parallel latents differ from the single-rank run");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Args> args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "flux2_generate: %s\n", args.status().ToString().c_str());
    return 2;
  }
  const absl::Status s = Run(*args);
  if (!s.ok()) std::fprintf(stderr, "flux2_generate: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
