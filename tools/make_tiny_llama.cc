// make_tiny_llama: writes a random Llama checkpoint (config.json + safetensors, Hugging Face
// layout and names) that llama_generate, transformers' LlamaForCausalLM.from_pretrained and
// safetensors' safe_open all read — so the demo runs without the committed fixtures.
// `make_tiny_llama --help` lists the flags (--out DIR is required).
//
// Tensors: LlamaForCausalLM's parameters, in its order. Weights: linear and embedding rows (and
// biases) ~ N(0, 1/last dim) (counter-based, reproducible), norm weights uniform in [0.5, 1.5).
// Rope: llama3 scaling (factor 8, original context 64) unless --no-rope-scaling.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "dtensor/nn/models/llama.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tools/flags.h"

ABSL_FLAG(std::string, out, "", "the checkpoint directory to write (required)");
ABSL_FLAG(int64_t, hidden, 64, "hidden size");
ABSL_FLAG(int64_t, layers, 4, "decoder layers");
ABSL_FLAG(int64_t, heads, 8, "query heads");
ABSL_FLAG(int64_t, kv_heads, 4, "key/value heads");
ABSL_FLAG(int64_t, head_dim, 8, "size of one head");
ABSL_FLAG(int64_t, intermediate, 172, "MLP intermediate size");
ABSL_FLAG(int64_t, vocab, 384, "vocabulary size");
ABSL_FLAG(std::string, dtype, "f32", "weights' dtype: f32 or bf16");
ABSL_FLAG(bool, tie, false, "tie lm_head to the embedding (no lm_head tensor)");
ABSL_FLAG(bool, rope_scaling, true, "llama3 rope scaling (factor 8, original context 64); --no-rope-scaling for none");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights");
ABSL_FLAG(double, max_file_mb, 0, "0: one file; else model-0000i-of-0000N.safetensors + index of at most this size");

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

absl::Status Run() {
  const std::string out = absl::GetFlag(FLAGS_out);
  loaders::LlamaConfig c;
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.num_hidden_layers = absl::GetFlag(FLAGS_layers);
  c.num_attention_heads = absl::GetFlag(FLAGS_heads);
  c.num_key_value_heads = absl::GetFlag(FLAGS_kv_heads);
  c.head_dim = absl::GetFlag(FLAGS_head_dim);
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  if (absl::GetFlag(FLAGS_rope_scaling)) c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tie);
  DT_ASSIGN_OR_RETURN(c.dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const double max_file_mb = absl::GetFlag(FLAGS_max_file_mb);
  for (const auto& [name, v] : {std::pair{"hidden", c.hidden_size}, {"layers", c.num_hidden_layers},
                                {"heads", c.num_attention_heads}, {"kv-heads", c.num_key_value_heads},
                                {"head-dim", c.head_dim}, {"intermediate", c.intermediate_size},
                                {"vocab", c.vocab_size}}) {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be positive, got ", v));
  }
  if (max_file_mb < 0) return absl::InvalidArgumentError("--max-file-mb must not be negative");
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
              c.Summary().c_str(), nn::NumParameters(c) / 1e6);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  dt::cli::ParseFlags(argc, argv, "usage: make_tiny_llama --out DIR [flags]\na random Llama checkpoint (config.json + safetensors)");
  const absl::Status s = Run();
  if (!s.ok()) std::fprintf(stderr, "make_tiny_llama: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
