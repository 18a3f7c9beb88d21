// `dtensor inspect PATH [--tp N] [--plan auto] [--dtype f32|bf16]`: what a checkpoint holds and,
// with --tp, what each rank of a tensor-parallel load will read.
//
// PATH is a .safetensors file, a model.safetensors.index.json, a model directory (transformers'
// causal LMs: Llama, Mistral, Qwen2, Qwen3, Phi-3; or diffusers' Flux2: a transformer directory or
// a pipeline directory with transformer/), or a GGUF file (which carries its own config).
// Without --tp it lists every tensor (dtype, shape, bytes). With --tp N it places the model the
// directory's config.json (or the GGUF's metadata) describes (--plan auto: the model's own tensor-parallel plan, as FromPretrained
// applies it) on an abstract mesh of N ranks — nothing is launched and no weight is read — and
// prints each tensor's placement and the bytes each rank's sharded read takes from the file, then
// the totals per rank. Exit status: 0; 1 when the loader refuses the checkpoint or the plan (its
// message on stderr); 2 for a bad command line.

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/diffusers_config.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/models/flux2.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/tools/dtensor_cli.h"

ABSL_FLAG(std::string, tp, "", "show each of N ranks' sharded reads under the model's plan");
ABSL_FLAG(std::string, plan, "auto", "the plan: auto (the model's own)");

namespace dt::cli {
namespace {

namespace fs = std::filesystem;

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / double(1 << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

// One tensor's placement and per-rank reads under the plan.
struct Placed {
  const loaders::TensorInfo* info = nullptr;  // the checkpoint tensor it is read from
  std::string placement = "R";
  std::vector<int64_t> rank_bytes;  // per rank
};

// Where the model's config is: the GGUF file itself (it carries its config), else the model
// directory's config.json (the checkpoint's own directory for a file path).
std::string ConfigSource(const std::string& path, const loaders::Checkpoint& ckpt) {
  const fs::path p(path);
  if (ckpt.gguf() != nullptr) return path;
  return fs::is_directory(p) ? p.string() : p.parent_path().string();
}

// Each parameter of a placed `model` with the tensor it reads (`source`) and each rank's bytes.
absl::StatusOr<std::map<std::string, Placed>> Place(const nn::Module& model, int64_t tp,
                                                    const loaders::Checkpoint& ckpt,
                                                    const nn::SourceNameFn& source) {
  std::map<std::string, Placed> placed;
  for (const auto& [name, p] : model.NamedParameters()) {
    DT_ASSIGN_OR_RETURN(const loaders::TensorInfo* info, ckpt.Info(source ? source(name) : name));
    const int64_t numel = std::max<int64_t>(1, Numel(info->shape));
    Placed& out = placed[name];
    out.info = info;
    out.placement = PlacementsToString(p->spec().placements());
    for (int64_t r = 0; r < tp; ++r) {
      int64_t n = 1;
      for (const RangeList& rl : p->spec().Ranges({r})) n *= RangesSize(rl);
      // The piece's share of the bytes: quant blocks hold a fraction of a byte per element.
      out.rank_bytes.push_back(static_cast<int64_t>(static_cast<__int128>(info->nbytes()) * n / numel));
    }
  }
  return placed;
}

// The model `dir` describes (a directory, or a GGUF file), placed by its own plan on an abstract
// mesh of `tp` ranks.
absl::StatusOr<std::map<std::string, Placed>> PlaceModel(const std::string& dir, int64_t tp,
                                                         const loaders::Checkpoint& ckpt) {
  DT_ASSIGN_OR_RETURN(DeviceMesh mesh, DeviceMesh::Abstract({tp}, {"tp"}));
  DT_ASSIGN_OR_RETURN(const std::string diffusers_class, loaders::DiffusersClassName(dir));
  if (diffusers_class == "Flux2Transformer2DModel") {
    DT_ASSIGN_OR_RETURN(loaders::Flux2Config config, loaders::LoadFlux2Config(dir));
    nn::Flux2Transformer2DModel model(config, DType::kF32);
    DT_RETURN_IF_ERROR(model.Parallelize(mesh, nn::Flux2Transformer2DModel::TPPlan(config)));
    DT_RETURN_IF_ERROR(model.CheckCheckpoint(ckpt, nn::PlanCheck::kIgnore));
    return Place(model, tp, ckpt, {});
  }
  if (!diffusers_class.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "'", dir, "' holds a diffusers ", diffusers_class,
        "; the models with a tensor-parallel plan are the causal LMs (",
        nn::DecoderFamilyNames(), ") and Flux2Transformer2DModel"));
  }
  DT_ASSIGN_OR_RETURN(loaders::DecoderConfig config, loaders::LoadDecoderConfig(dir));
  DT_RETURN_IF_ERROR(nn::CausalLM::ValidateConfig(config));
  nn::CausalLM model(config, config.dtype);
  DT_RETURN_IF_ERROR(model.Parallelize(mesh));
  DT_RETURN_IF_ERROR(model.CheckCheckpoint(ckpt, nn::PlanCheck::kIgnore));
  return Place(model, tp, ckpt,
               [&model](absl::string_view name) { return model.CheckpointName(name); });
}

}  // namespace

int Inspect(const std::string& path, const Flags& flags) {
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "dtensor inspect: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  std::string open_path = path;
  if (absl::EndsWith(fs::path(path).filename().string(), ".safetensors.index.json")) {
    open_path = fs::path(path).parent_path().string();
  } else if (fs::is_directory(path)) {
    // A diffusers pipeline directory: its transformer/.
    absl::StatusOr<std::string> tdir = loaders::Flux2TransformerDir(path);
    absl::StatusOr<std::string> cls = loaders::DiffusersClassName(path);
    if (tdir.ok() && cls.ok() && !cls->empty()) open_path = *tdir;
  }
  absl::StatusOr<loaders::Checkpoint> ckpt = loaders::Checkpoint::Open(open_path);
  if (!ckpt.ok()) return fail(ckpt.status());

  const std::vector<std::string> names = ckpt->names();
  if (!flags.Has("tp")) {
    int64_t total = 0;
    std::printf("%-56s %-6s %-20s %12s\n", "tensor", "dtype", "shape", "bytes");
    for (const std::string& name : names) {
      const loaders::TensorInfo* info = *ckpt->Info(name);
      std::printf("%-56s %-6s %-20s %12s\n", name.c_str(), info->dtype_name.c_str(),
                  ShapeToString(info->shape).c_str(), Bytes(info->nbytes()).c_str());
      total += info->nbytes();
    }
    std::printf("%zu tensors, %s\n", names.size(), Bytes(total).c_str());
    return 0;
  }

  int64_t tp = 0;
  if (!absl::SimpleAtoi(flags.Get("tp"), &tp) || tp < 1 || tp > 4096) {
    std::fprintf(stderr, "dtensor inspect: --tp must be an integer in [1, 4096], got '%s'\n",
                 flags.Get("tp").c_str());
    return 2;
  }
  if (flags.Get("plan", "auto") != "auto") {
    std::fprintf(stderr, "dtensor inspect: --plan: only 'auto' (the model's own plan) is known\n");
    return 2;
  }
  auto placed = PlaceModel(ConfigSource(path, *ckpt), tp, *ckpt);
  if (!placed.ok()) return fail(placed.status());

  // By parameter: a tied lm_head reads the embedding's rows a second time.
  std::vector<int64_t> per_rank(tp, 0);
  int64_t total = 0;
  std::printf("%-56s %-6s %-16s %-10s %12s %14s\n", "tensor", "dtype", "shape", "placement",
              "bytes", "rank 0 reads");
  for (const auto& [param, p] : *placed) {
    const std::string shape = ShapeToString(p.info->shape);
    const int64_t full = p.info->nbytes();
    std::printf("%-56s %-6s %-16s %-10s %12s %14s\n", param.c_str(), p.info->dtype_name.c_str(),
                shape.c_str(), p.placement.c_str(), Bytes(full).c_str(),
                Bytes(p.rank_bytes[0]).c_str());
    total += full;
    for (int64_t r = 0; r < tp; ++r) per_rank[r] += p.rank_bytes[r];
  }
  std::printf("tp=%lld: the model's parameters take %s in the file\n",
              static_cast<long long>(tp), Bytes(total).c_str());
  for (int64_t r = 0; r < tp; ++r) {
    std::printf("rank %lld reads %s (%.1f%%)\n", static_cast<long long>(r),
                Bytes(per_rank[r]).c_str(), total > 0 ? 100.0 * per_rank[r] / total : 0.0);
  }
  return 0;
}

}  // namespace dt::cli
