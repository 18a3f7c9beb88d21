#pragma once
// Llama is one family of the causal LM (nn/models/causal_lm.h); these are its names from before
// the other families (issue 31), kept for existing callers.

#include "dtensor/nn/models/causal_lm.h"

namespace dt::nn {

using LlamaForCausalLM = CausalLM;
using LlamaLoadOptions = CausalLMLoadOptions;
using LlamaLoadReport = LoadReport;

}  // namespace dt::nn
