#!/usr/bin/env python3
"""Golden fixtures for the Llama tests: tiny random transformers.LlamaForCausalLM checkpoints and
what transformers computes with them.

    python3 -m venv tools/reference/.venv
    tools/reference/.venv/bin/pip install -r tools/reference/requirements.txt
    tools/reference/.venv/bin/python tools/reference/make_llama_fixtures.py [--out tests/fixtures]

For each variant it writes tests/fixtures/<name>/ with
  config.json, model.safetensors (or model-*.safetensors + model.safetensors.index.json)
                       save_pretrained's own output
  golden.json          prompt ids; logits of every prompt position (transformers, eager attention);
                       the greedy continuation (KV cache) and the logits of its last step; for a
                       bf16 checkpoint the same in f32 (loaded with dtype=float32) and in bf16
Variants:
  llama-tiny           f32, untied, 4 layers, hidden 64, 8 heads / 4 KV heads (GQA), head_dim 8,
                       intermediate 172, vocab 384, llama3 rope scaling (all three frequency bands)
  llama-tiny-tied-bf16 bf16, tied embeddings, q/k/v/o and MLP biases, 2 layers, hidden 64, 8 heads
                       / 4 KV heads, explicit head_dim 16 (!= hidden/heads), intermediate 200,
                       vocab 320, default rope (theta 500000), split over several files
The weights are random (seeded); norms are randomized too so that a missing norm weight shows.
"""
import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = [1, 15, 27, 100, 200, 5, 7, 300, 42, 11]
NEW_TOKENS = 32

VARIANTS = {
    "llama-tiny": dict(
        config=dict(vocab_size=384, hidden_size=64, intermediate_size=172, num_hidden_layers=4,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=8,
                    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=64),
                    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                    bos_token_id=1, eos_token_id=2),
        dtype=torch.float32, seed=1234, max_shard_size=None),
    "llama-tiny-tied-bf16": dict(
        config=dict(vocab_size=320, hidden_size=64, intermediate_size=200, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                    max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=500000.0,
                    tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                    bos_token_id=1, eos_token_id=2),
        dtype=torch.bfloat16, seed=99, max_shard_size="120KB"),
}


def randomize(model, seed, scale=1.0):
    """Seeded weights far from transformers' init: matrices N(0, scale² / fan_in), norms in
    [0.5, 1.5), biases N(0, 0.01)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
        tokens = []
        for _ in range(n):
            t = int(torch.argmax(logits.float()))
            tokens.append(t)
            if len(tokens) == n:
                break
            out = model(torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
    return tokens, logits.float()


def record(model, prompt):
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    tokens, last = greedy(model, prompt, NEW_TOKENS)
    return {
        "prompt_logits_shape": list(logits.shape),
        "prompt_logits": [round(float(v), 7) for v in logits.flatten()],
        "greedy_tokens": tokens,
        "last_step_logits": [round(float(v), 7) for v in last],
    }


def fixture_args(ap=None):
    """The fixture scripts' arguments: --out (default: this checkout's tests/fixtures) and those
    `ap` adds; torch then runs on one thread, so that every run computes the same goldens."""
    ap = ap or argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                  "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    return args


def main():
    args = fixture_args()
    for name, v in VARIANTS.items():
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            if f.endswith(".safetensors") or f.endswith(".json"):
                os.remove(os.path.join(out, f))
        config = LlamaConfig(**v["config"])
        torch.manual_seed(v["seed"])
        model = LlamaForCausalLM(config).to(torch.float32).eval()
        randomize(model, v["seed"])
        model = model.to(v["dtype"])
        kw = {"max_shard_size": v["max_shard_size"]} if v["max_shard_size"] else {}
        model.save_pretrained(out, safe_serialization=True, **kw)

        golden = {"prompt": PROMPT, "new_tokens": NEW_TOKENS,
                  "transformers": __import__("transformers").__version__,
                  "torch": torch.__version__}
        f32 = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32,
                                               attn_implementation="eager").eval()
        golden["f32"] = record(f32, PROMPT)
        if v["dtype"] == torch.bfloat16:
            bf16 = LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16,
                                                    attn_implementation="eager").eval()
            golden["bf16"] = record(bf16, PROMPT)
        with open(os.path.join(out, "golden.json"), "w") as fp:
            json.dump(golden, fp)
            fp.write("\n")
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f"{name}: {size / 1e6:.2f} MB, greedy {golden['f32']['greedy_tokens'][:12]} ...")


if __name__ == "__main__":
    main()
