#pragma once
// SaveGathered: a tensor-parallel model written as an ordinary Hugging Face checkpoint.
//
//   dir/config.json                      (SaveOptions::files: any small text files)
//   dir/model.safetensors                or model-0000i-of-0000N.safetensors + the index, split
//                                        at SaveOptions::max_file_bytes as save_pretrained does
//
// Every rank of the model's mesh calls it (it is collective). Parameters are gathered one at a
// time (DTensor::FullTensor) and handed to a streaming writer (loaders/safetensors_writer.h) on the
// mesh's first rank, then dropped: no rank holds more than one full tensor beyond its own pieces,
// where transformers gathers the whole state dict first and diffusers refuses to save a parallel
// model. The result loads at any tp (or with transformers) like the checkpoint it came from. A
// quantized weight (Note [Quantized dtypes]) is dequantized piece by piece on its own rank and
// written in f32 (or SaveOptions::dtype).
//
// Note [Saving atomically]
// The checkpoint is written into a fresh sibling directory (`dir.saving-<pid>`), fsynced, and only
// then put in place: renamed to `dir` when there was none, else exchanged with the old `dir` in
// one renameat2(RENAME_EXCHANGE) and the old tree removed. Files of the old directory that the save
// does not write (tokenizer.json, a README) are copied into the new one first. A crash, an error
// or a dead rank at any point before the exchange leaves `dir` exactly as it was; the leftover
// `dir.saving-*` directory is the only trace and is removed by the next save. Every rank returns
// the writer's status (it is broadcast), so all agree on whether the save happened.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "dtensor/core/dtype.h"
#include "dtensor/nn/module.h"

namespace dt::nn {

struct SaveOptions {
  // The checkpoint name of a parameter (its dotted path from the root); "" leaves it out (a tied
  // lm_head). Default: the path itself.
  std::function<std::string(const std::string& param)> checkpoint_name;
  // Written beside the weights by the writing rank: file name -> contents ("config.json").
  std::map<std::string, std::string> files;
  // The weight files' stem: transformers' "model" (model.safetensors[.index.json]), diffusers'
  // "diffusion_pytorch_model".
  std::string file_stem = "model";
  // save_pretrained's max_shard_size (0: one file).
  int64_t max_file_bytes = 5'000'000'000;
  // Convert every tensor to this dtype; nullopt keeps each parameter's dtype.
  std::optional<DType> dtype;
  // safetensors metadata of every file.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Called on every rank after each tensor is gathered (and written, on the writing rank):
  // tensors done, tensors in all, bytes gathered so far.
  std::function<void(int64_t done, int64_t total, int64_t bytes)> on_progress;
};

// Collective over the mesh of the model's parameters (all placed on one mesh, every one
// materialized). InvalidArgument for a model with no parameters, parameters on different meshes
// or two parameters mapped to one checkpoint name; Internal for an I/O error (the old `dir` is
// left intact, Note [Saving atomically]).
absl::Status SaveGathered(const Module& model, const std::string& dir,
                          const SaveOptions& options = {});

}  // namespace dt::nn
