// make_tiny_llama: writes a random Llama checkpoint (config.json + safetensors, Hugging Face
// layout and names) that llama_generate, transformers' LlamaForCausalLM.from_pretrained and
// safetensors' safe_open all read — so the demo runs without the committed fixtures.
//
//   make_tiny_llama --out build/llama-tiny [--hidden 64 --layers 4 --heads 8 --kv-heads 4
//       --head-dim 8 --intermediate 172 --vocab 384 --dtype f32|bf16 --tie --seed 0
//       --max-file-mb 0 (0: one file; else model-0000i-of-0000N.safetensors + index)]
//
// Tensors: LlamaForCausalLM's parameters, in its order. Weights: linear and embedding rows (and
// biases) ~ N(0, 1/last dim) (counter-based, reproducible), norm weights uniform in [0.5, 1.5).
// Rope: llama3 scaling (factor 8, original context 64) unless --no-rope-scaling.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/ops/local/ops.h"

using namespace dt;  // NOLINT: tool brevity

namespace {

absl::StatusOr<Tensor> Random(IntSpan shape, uint64_t seed, bool norm, DType dtype) {
  if (norm) {
    DT_ASSIGN_OR_RETURN(Tensor u, Tensor::Rand(shape, seed));
    DT_ASSIGN_OR_RETURN(u, ops::Add(u, 0.5));
    return ops::Cast(u, dtype);
  }
  DT_ASSIGN_OR_RETURN(Tensor n, Tensor::Randn(shape, seed));
  DT_ASSIGN_OR_RETURN(n, ops::Mul(n, 1.0 / std::sqrt(static_cast<double>(shape.back()))));
  return ops::Cast(n, dtype);
}

absl::Status Run(int argc, char** argv) {
  std::string out;
  loaders::LlamaConfig c;
  c.vocab_size = 384;
  c.hidden_size = 64;
  c.intermediate_size = 172;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  uint64_t seed = 0;
  double max_file_mb = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(f + " needs a value");
      return std::string(argv[++i]);
    };
    auto integer = [&](int64_t* dst) -> absl::Status {
      DT_ASSIGN_OR_RETURN(std::string v, next());
      if (!absl::SimpleAtoi(v, dst) || *dst <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(f, ": not a positive integer: ", v));
      }
      return absl::OkStatus();
    };
    if (f == "--out") {
      DT_ASSIGN_OR_RETURN(out, next());
    } else if (f == "--hidden") {
      DT_RETURN_IF_ERROR(integer(&c.hidden_size));
    } else if (f == "--layers") {
      DT_RETURN_IF_ERROR(integer(&c.num_hidden_layers));
    } else if (f == "--heads") {
      DT_RETURN_IF_ERROR(integer(&c.num_attention_heads));
    } else if (f == "--kv-heads") {
      DT_RETURN_IF_ERROR(integer(&c.num_key_value_heads));
    } else if (f == "--head-dim") {
      DT_RETURN_IF_ERROR(integer(&c.head_dim));
    } else if (f == "--intermediate") {
      DT_RETURN_IF_ERROR(integer(&c.intermediate_size));
    } else if (f == "--vocab") {
      DT_RETURN_IF_ERROR(integer(&c.vocab_size));
    } else if (f == "--seed") {
      int64_t s;
      DT_RETURN_IF_ERROR(integer(&s));
      seed = static_cast<uint64_t>(s);
    } else if (f == "--dtype") {
      DT_ASSIGN_OR_RETURN(std::string v, next());
      DT_ASSIGN_OR_RETURN(c.dtype, ParseDType(v));
    } else if (f == "--tie") {
      c.tie_word_embeddings = true;
    } else if (f == "--no-rope-scaling") {
      c.rope_scaling = loaders::RopeScaling();
    } else if (f == "--max-file-mb") {
      DT_ASSIGN_OR_RETURN(std::string v, next());
      if (!absl::SimpleAtod(v, &max_file_mb)) return absl::InvalidArgumentError("--max-file-mb");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", f, "'"));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--out DIR is required");
  // Validate through the parser the loader uses.
  DT_ASSIGN_OR_RETURN(c, loaders::ParseLlamaConfig(loaders::LlamaConfigToJson(c), "generated"));

  // The model's own parameter list (placeholders: nothing is allocated), in registration order,
  // so the tensors, their names and shapes (biases included) are the ones the loader expects. A
  // tied lm_head reads the embedding: it has no tensor of its own.
  nn::LlamaForCausalLM model(c, c.dtype);
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t s = seed * 1000003;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (model.CheckpointName(name) != name) continue;
    DT_ASSIGN_OR_RETURN(const nn::Module* owner,
                        model.GetSubmodule(name.substr(0, name.rfind('.'))));
    const bool norm = owner->type_name() == "RMSNorm";
    DT_ASSIGN_OR_RETURN(Tensor t, Random(p->shape(), ++s, norm, c.dtype));
    tensors.emplace_back(name, std::move(t));
  }
  std::filesystem::create_directories(out);
  DT_RETURN_IF_ERROR(loaders::WriteCheckpoint(out, tensors,
                                              static_cast<int64_t>(max_file_mb * 1e6)));
  const std::string config_path = out + "/config.json";
  FILE* fp = std::fopen(config_path.c_str(), "wb");
  if (fp == nullptr) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  const std::string json = loaders::LlamaConfigToJson(c);
  const bool ok = std::fwrite(json.data(), 1, json.size(), fp) == json.size();
  if (std::fclose(fp) != 0 || !ok) return absl::InternalError("cannot write " + config_path);
  std::printf("make_tiny_llama: wrote %s (%s, %.2fM parameters)\n", out.c_str(),
              c.Summary().c_str(), c.NumParameters() / 1e6);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const absl::Status s = Run(argc, argv);
  if (!s.ok()) std::fprintf(stderr, "make_tiny_llama: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
