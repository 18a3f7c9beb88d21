#!/usr/bin/env python3
"""Golden fixtures for the mixture-of-experts families (nn/moe.h, Note [MoE blocks] in
nn/models/decoder_family.h): tiny random checkpoints and what transformers computes with them.

    tools/reference/.venv/bin/python tools/reference/make_moe_fixtures.py [--out tests/fixtures]

For each model it writes tests/fixtures/moe/<name>/ with
  config.json, model.safetensors   save_pretrained's own output: the Hub layout, one tensor per
                                   expert and projection (transformers 5 fuses them on load, as
                                   dtensor does)
  golden.json                      prompt ids; the logits of every prompt position (eager
                                   attention, f32); the greedy continuation (KV cache) and the
                                   logits of its last step (make_llama_fixtures.py's format); the
                                   smallest gap between the k-th and the (k+1)-th router
                                   probability over every routed token ("router_margin")

  name             what it exercises
  mixtral-tiny     4 experts, top-2 renormalised (block_sparse_moe.experts.{e}.w1/w3/w2 in the
                   file), 8 / 4 heads, every layer sparse
  qwen3_moe-tiny   8 experts, top-2 with norm_topk_prob, q/k norms, head_dim 16, 2 layers, every
                   one sparse (llama.cpp's qwen3moe has no dense layer, so the GGUF can hold it;
                   the dense layers of a MoE model are DeepSeek's)
and, for Mixtral and Qwen3-MoE, tests/fixtures/moe/<name>.gguf: the same f32 weights as
convert_hf_to_gguf lays them out (make_zoo_fixtures.write_gguf: Mixtral as architecture llama with
permuted Q/K rows, Qwen3-MoE as qwen3moe; experts stacked as ffn_{gate,up,down}_exps, the router
as ffn_gate_inp), loaded back by transformers' GGUF reader when it can.

  mixtral_kv2-tiny, qwen3_moe_kv2-tiny  the same shapes with 2 KV heads (and their own seeds), as
                   Mixtral- and Qwen3-MoE-shaped models people run at tp or ep 4: the KV heads held
                   whole on the ranks that use them (Note [KV heads past tp] in
                   nn/models/causal_lm.cc); safetensors only
  deepseek_v2-tiny DeepSeek-V2's latent attention with q_lora_rank (q_a_proj, q_a_layernorm,
                   q_b_proj), kv_lora_rank 32, RoPE on 8 of 24 query/key dims (interleaved pairs),
                   v_head_dim 16; 8 routed experts top-2 with routed_scaling_factor 1.5 and one
                   shared expert; layer 0 dense (first_k_dense_replace 1), 3 layers
  deepseek_v2_lite-tiny  the same without q_lora_rank (a plain q_proj, as DeepSeek-V2-Lite), 4
                   experts, 2 layers
  minicpm5_moe-tiny MiniCPM5-MoE: gated attention (q_gate_proj, stored as q_proj), 8 query / 2 KV
                   heads (its plan's unit_colwise k/v), DeepSeek-V3's sigmoid router with a random
                   e_score_correction_bias, 8 experts in 2 groups (topk_group 1), top-2
                   renormalised x 2.5, one shared expert, mlp_layer_types dense, sparse, sparse
  gpt_oss-tiny     gpt-oss: 4 query / 2 KV heads with learned sinks and q/k/v/o biases, layers
                   sliding (window 4) and full in turn, YaRN RoPE (x4 over 64 positions); 4 experts
                   top-2 (a router with a bias, softmax over the chosen logits), experts stored
                   [E, H, 2I] with interleaved gate/up columns and biases, the clamped SwiGLU
                   (swiglu_limit 1, so the clamps bite); f32, not MXFP4
and tests/fixtures/moe/gpt_oss_glu.json (--only gpt_oss_glu): GptOssExperts' clamped SwiGLU on
interleaved gate/up rows in bf16, f16 and f32 (limit 1, alpha 1.702), each dtype's input and
output, so that its rounding after every step is checked value by value.

Weights are random (seeded), scaled so that the greedy continuation is not one repeated token,
and a seed is kept only when every routing decision has a margin of at least 3e-4 between the k-th
and the (k+1)-th probability (for the sigmoid router: choice score, and the kept group against the
next), so that the tests' tp and ep layouts (other summation orders,
differences around 1e-6) pick the experts transformers picked.
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, GptOssConfig,
                          GptOssForCausalLM, MiniCPM5MoeConfig, MiniCPM5MoeForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

from make_llama_fixtures import NEW_TOKENS, fixture_args, greedy, randomize, record
from make_zoo_fixtures import PROMPT, TINY, compare_gguf, write_gguf

MIN_MARGIN = 3e-4

# What the two DeepSeek models share: four heads, one dense layer first, greedy routing to
# unnormalized top-k weights.
DEEPSEEK_TINY = dict(TINY, num_attention_heads=4, num_key_value_heads=4, first_k_dense_replace=1,
                     topk_method="greedy", norm_topk_prob=False, rms_norm_eps=1e-6,
                     tie_word_embeddings=False)

# Mixtral's and Qwen3-MoE's tiny configs but for the KV heads, which the models vary.
MIXTRAL_TINY = dict(
    TINY, vocab_size=320, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=8, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
    tie_word_embeddings=False)
QWEN3_MOE_TINY = dict(
    TINY, vocab_size=384, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=8, head_dim=16, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
    rope_theta=1000000.0, tie_word_embeddings=False)

MODELS = {
    "mixtral-tiny": dict(cls=MixtralForCausalLM, gguf="llama", seed=41,
                         config=MixtralConfig(**MIXTRAL_TINY, num_key_value_heads=4)),
    "qwen3_moe-tiny": dict(cls=Qwen3MoeForCausalLM, gguf="qwen3moe", seed=42,
                           config=Qwen3MoeConfig(**QWEN3_MOE_TINY, num_key_value_heads=4)),
    # 2 KV heads (Note [KV heads past tp] at 4 ranks): the same models otherwise.
    "mixtral_kv2-tiny": dict(cls=MixtralForCausalLM, seed=46,
                             config=MixtralConfig(**MIXTRAL_TINY, num_key_value_heads=2)),
    "qwen3_moe_kv2-tiny": dict(cls=Qwen3MoeForCausalLM, seed=47,
                               config=Qwen3MoeConfig(**QWEN3_MOE_TINY, num_key_value_heads=2)),
    "deepseek_v2-tiny": dict(
        cls=DeepseekV2ForCausalLM, seed=43,
        config=DeepseekV2Config(**DEEPSEEK_TINY, vocab_size=320, hidden_size=64,
                                intermediate_size=128, moe_intermediate_size=32,
                                num_hidden_layers=3, q_lora_rank=48, kv_lora_rank=32,
                                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                routed_scaling_factor=1.5)),
    "deepseek_v2_lite-tiny": dict(
        cls=DeepseekV2ForCausalLM, seed=44,
        config=DeepseekV2Config(**DEEPSEEK_TINY, vocab_size=256, hidden_size=48,
                                intermediate_size=96, moe_intermediate_size=24,
                                num_hidden_layers=2, q_lora_rank=None, kv_lora_rank=16,
                                qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
                                n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
                                routed_scaling_factor=1.0)),
    "minicpm5_moe-tiny": dict(
        cls=MiniCPM5MoeForCausalLM, seed=45, score_bias=True,
        config=MiniCPM5MoeConfig(**TINY, vocab_size=320, hidden_size=64, intermediate_size=128,
                                 moe_intermediate_size=32, num_hidden_layers=3,
                                 num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                 n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                 n_group=2, topk_group=1, norm_topk_prob=True,
                                 routed_scaling_factor=2.5,
                                 mlp_layer_types=["dense", "sparse", "sparse"], rms_norm_eps=1e-6,
                                 rope_parameters={"rope_type": "default", "rope_theta": 5e6},
                                 tie_word_embeddings=False)),
    "gpt_oss-tiny": dict(
        cls=GptOssForCausalLM, seed=48,
        config=GptOssConfig(**TINY, vocab_size=320, hidden_size=64, intermediate_size=32,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                            sliding_window=4, swiglu_limit=1.0, rms_norm_eps=1e-5,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                             "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "truncate": False,
                                             "original_max_position_embeddings": 64},
                            tie_word_embeddings=False)),
}


def grouped_margin(gate, x):
    """router_margin's gap for DeepSeek-V3's router `gate` (sigmoid scores plus
    e_score_correction_bias, limited to topk_group of n_group groups) on its input `x`: the k-th
    against the (k+1)-th score of the groups kept, and the topk_group-th group against the next."""
    k, groups, keep = gate.top_k, gate.num_group, gate.topk_group
    scores = torch.sigmoid(x.reshape(-1, gate.hidden_dim).float() @ gate.weight.float().T)
    choice = scores + gate.e_score_correction_bias
    per_group = choice.view(choice.shape[0], groups, -1)
    group_scores = per_group.topk(2, dim=-1).values.sum(-1)
    margins = []
    if keep < groups:
        g = torch.topk(group_scores, keep + 1, dim=-1).values
        margins.append(float((g[:, keep - 1] - g[:, keep]).min()))
    idx = torch.topk(group_scores, keep, dim=-1).indices
    mask = torch.zeros_like(group_scores).scatter_(1, idx, 1).bool()
    masked = per_group.masked_fill(~mask.unsqueeze(-1), float("-inf")).reshape(choice.shape)
    top = torch.topk(masked, k + 1, dim=-1).values
    margins.append(float((top[:, k - 1] - top[:, k]).min()))
    return min(margins)


def write_glu_golden(path):
    """GptOssExperts._apply_gate on 16 rows of 32 interleaved (gate, up) pairs, in each dtype."""
    experts = GptOssExperts(GptOssConfig(hidden_size=64, intermediate_size=32, swiglu_limit=1.0))
    g = torch.Generator().manual_seed(49)
    x = 1.5 * torch.randn(16, 64, generator=g)
    out = {"limit": 1.0, "alpha": experts.alpha, "rows": 16, "intermediate": 32,
           "transformers": transformers.__version__, "torch": torch.__version__}
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
        xd = x.to(dtype)
        with torch.no_grad():
            y = experts._apply_gate(xd)
        out[name] = {"x": xd.float().flatten().tolist(), "y": y.float().flatten().tolist()}
    with open(path, "w") as fp:
        json.dump(out, fp)
        fp.write("\n")
    print(f"{os.path.basename(path)}: {os.path.getsize(path) / 1e3:.1f} kB")


def router_margin(model, prompt, tokens):
    """The smallest gap between the k-th and (k+1)-th router probability over the prompt and the
    continuation (the inputs of the greedy run), over every sparse layer."""
    margins = []
    k = model.config.num_experts_per_tok

    def hook(module, args, output):
        if hasattr(module, "e_score_correction_bias"):
            margins.append(grouped_margin(module, args[0]))
            return
        logits = output[0] if isinstance(output, tuple) else output
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        margins.append(float((top[:, k - 1] - top[:, k]).min()))

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if n.endswith("mlp.gate") or n.endswith("mlp.router")]
    with torch.no_grad():
        model(torch.tensor([prompt + tokens]))
    for h in handles:
        h.remove()
    return min(margins)


def check_gguf(path, model):
    """transformers' GGUF reader, given the config (its mapping reads no expert size), where it
    reads the architecture at all."""
    try:
        return compare_gguf(path, model, model.config)
    except AssertionError:
        raise
    except Exception as e:  # an architecture transformers does not read from GGUF
        return f"not checked (transformers: {str(e).splitlines()[0][:100]})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    args = fixture_args(ap)
    root = os.path.join(args.out, "moe")
    os.makedirs(root, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    if only is None or "gpt_oss_glu" in only:
        write_glu_golden(os.path.join(root, "gpt_oss_glu.json"))
    for name, v in MODELS.items():
        if only is not None and name not in only:
            continue
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        config = v["config"]
        found = None
        for attempt in range(40):
            seed = v["seed"] + 1000 * attempt
            for scale in (1.0, 1.5, 2.0, 3.0):
                torch.manual_seed(seed)
                model = v["cls"](config).to(torch.float32).eval()
                randomize(model, seed, scale)
                if v.get("score_bias"):  # a buffer: randomize() sets parameters only
                    g = torch.Generator().manual_seed(seed + 7)
                    with torch.no_grad():
                        for n, b in model.named_buffers():
                            if n.endswith("e_score_correction_bias"):
                                b.copy_(0.05 * torch.randn(b.shape, generator=g))
                tokens, _ = greedy(model, PROMPT, NEW_TOKENS)
                if len(set(tokens)) >= NEW_TOKENS // 2:
                    break
            else:
                continue
            margin = router_margin(model, PROMPT, tokens)
            if margin >= MIN_MARGIN:
                found = (seed, scale, margin)
                break
        if found is None:
            raise SystemExit(f"{name}: no seed gave a diverse continuation with router margins")
        seed, scale, margin = found
        model.save_pretrained(out, safe_serialization=True)
        golden = {"prompt": PROMPT, "new_tokens": NEW_TOKENS,
                  "transformers": transformers.__version__, "torch": torch.__version__,
                  "seed": seed, "weight_scale": scale, "router_margin": margin}
        f32 = v["cls"].from_pretrained(out, dtype=torch.float32,
                                       attn_implementation="eager").eval()
        golden["f32"] = record(f32, PROMPT)
        assert golden["f32"]["greedy_tokens"] == tokens
        with open(os.path.join(out, "golden.json"), "w") as fp:
            json.dump(golden, fp)
            fp.write("\n")
        note = ""
        if v.get("gguf"):
            path = os.path.join(root, f"{name}.gguf")
            write_gguf(path, name, f32, f32.config, arch=v["gguf"])
            note = f" (+ {os.path.getsize(path) / 1e6:.2f} MB gguf: {check_gguf(path, f32)})"
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f"{name}: {size / 1e6:.2f} MB{note}, seed {seed}, weight scale {scale}, router "
              f"margin {margin:.2e}, greedy {tokens[:12]} ...")


if __name__ == "__main__":
    main()
