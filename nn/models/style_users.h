#pragma once
// Which registered styles (nn/style_registry.h) the built-in models' plans use: every decoder
// family's tensor-parallel, MLP, MoE and expert-parallel plans (nn/models/decoder_family.h) and
// Flux2's. `dtensor styles` prints it under the registry's table, so that a style transformers
// registers is seen next to a model that runs it.

#include <map>
#include <string>
#include <vector>

namespace dt::nn {

// style name -> the models whose plans name it ("llama", "mixtral (ep)", "flux2"), in the order of
// the family table.
std::map<std::string, std::vector<std::string>> BuiltInStyleUsers();

// One line per registered style: its name and the models, "-" for none (with the example that
// runs it where one does):
//   moe_tp_experts        mixtral qwen3_moe deepseek_v2
std::string FormatStyleUsers();

}  // namespace dt::nn
