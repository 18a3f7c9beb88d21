#pragma once
// The stacked expert tensors of a mixture-of-experts model (Note [MoE blocks] in
// nn/models/decoder_family.h) from the layouts checkpoints store them in, as transformers 5's
// weight converters fuse them on load (MergeModulelist + Concatenate):
//
//   stored as (per sparse layer model.layers.{i}.)                  read as
//   mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj      themselves (transformers 5's
//                                                                   own names)
//   mlp.experts.gate_proj, up_proj [E, I, H], down_proj [E, H, I]   gate_up_proj = [gate | up]
//   (GGUF's ffn_{gate,up,down}_exps, loaders/gguf_llama.h)          along dim 1
//   {block}.experts.{e}.{gate,up,down}.weight, e < E (Hub layout:   gate_up_proj[e] = [gate_e |
//   Mixtral's block_sparse_moe.experts.{e}.w1 / w3 / w2, the         up_e], down_proj[e] = down_e
//   others' mlp.experts.{e}.gate_proj / up_proj / down_proj)
//   {block}.gate.weight (Mixtral: block_sparse_moe.gate)            mlp.gate.weight
//   mlp.experts.gate_up_proj_blocks / _scales (gpt-oss's MXFP4)     refused (Unimplemented)
//
// The stacked tensors are composites (Note [Composite tensors] in checkpoint.h): nothing is read
// here, and a rank later reads only its ranges of each expert tensor.

#include "absl/status/status.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/hf_config.h"

namespace dt::loaders {

// Adds the composites and renames for every sparse layer of `config`; a layer whose experts are in
// none of the layouts is NotFound naming the names looked for. Nothing for dense families.
absl::Status AddMoeComposites(Checkpoint& checkpoint, const DecoderConfig& config);

}  // namespace dt::loaders
