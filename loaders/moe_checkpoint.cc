#include "dtensor/loaders/moe_checkpoint.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::loaders {
namespace {

bool Has(const Checkpoint& c, const std::string& name) { return c.Info(name).ok(); }

absl::Status AddLayer(Checkpoint& c, const DecoderConfig& config, int64_t layer) {
  const DecoderConfigClass& f = config.config_class();
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const std::string block = p + f.moe_checkpoint_block + ".";
  const std::string router = p + "mlp.gate.weight";
  if (!Has(c, router) && Has(c, block + "gate.weight")) {
    DT_RETURN_IF_ERROR(c.Rename(block + "gate.weight", router));
  }
  const std::string gate_up = p + "mlp.experts.gate_up_proj", down = p + "mlp.experts.down_proj";
  if (Has(c, gate_up)) return absl::OkStatus();  // transformers 5's own layout (gpt-oss's too)
  if (Has(c, gate_up + "_blocks")) {  // gpt-oss as OpenAI ships it
    return absl::UnimplementedError(absl::StrCat(
        "checkpoint '", c.path(), "' stores layer ", layer, "'s experts in MXFP4 (", gate_up,
        "_blocks and _scales: quant_method \"mxfp4\"), which dtensor does not read; use a "
        "checkpoint with the experts in bf16 or f32"));
  }
  const int64_t e_count = config.num_experts, i = config.moe_intermediate_size;
  const Shape gate_up_shape = {e_count, 2 * i, config.hidden_size};
  const Shape down_shape = {e_count, config.hidden_size, i};
  using Part = Checkpoint::Part;
  // Gate and up stacked per projection (GGUF; down_proj is stored stacked already).
  const std::string gate_stack = p + "mlp.experts.gate_proj", up_stack = p + "mlp.experts.up_proj";
  if (Has(c, gate_stack) && Has(c, up_stack)) {
    return c.AddComposite(gate_up, gate_up_shape,
                          {Part{gate_stack, {0, 0, 0}}, Part{up_stack, {0, i, 0}}});
  }
  // One tensor per expert and projection (the Hub layout).
  const auto& [g, u, d] = f.expert_checkpoint_names;
  auto expert = [&](int64_t e, const std::string& proj) {
    return absl::StrCat(block, "experts.", e, ".", proj, ".weight");
  };
  if (!Has(c, expert(0, g))) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint '", c.path(), "' holds layer ", layer, "'s experts in none of the layouts ",
        "read (", gate_up, " and ", down, "; ", gate_stack, " and ", up_stack, "; ", expert(0, g),
        ", ", expert(0, u), ", ", expert(0, d), ", ... for ", e_count, " experts)"));
  }
  std::vector<Part> gate_up_parts, down_parts;
  for (int64_t e = 0; e < e_count; ++e) {
    gate_up_parts.push_back(Part{expert(e, g), {e, 0, 0}, /*stacked=*/true});
    gate_up_parts.push_back(Part{expert(e, u), {e, i, 0}, /*stacked=*/true});
    down_parts.push_back(Part{expert(e, d), {e, 0, 0}, /*stacked=*/true});
  }
  DT_RETURN_IF_ERROR(c.AddComposite(gate_up, gate_up_shape, std::move(gate_up_parts)));
  return c.AddComposite(down, down_shape, std::move(down_parts));
}

}  // namespace

absl::Status AddMoeComposites(Checkpoint& checkpoint, const DecoderConfig& config) {
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (config.IsMoeLayer(layer)) DT_RETURN_IF_ERROR(AddLayer(checkpoint, config, layer));
  }
  return absl::OkStatus();
}

}  // namespace dt::loaders
