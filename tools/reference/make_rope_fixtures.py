"""Writes tests/fixtures/rope/rope_goldens.json: transformers' LlamaRotaryEmbedding for every rope
type its Llama accepts (default, linear, dynamic, yarn, longrope, llama3), including the
sequence-length-dependent updates of dynamic and longrope, so that loaders/hf_config.cc and
nn::RotaryEmbedding can be checked against the real thing.

Each case: a config.json fragment, then a list of calls (positions 0..S-1 for increasing and
decreasing S, in order, because dynamic keeps state) with the inv_freq and attention scaling used
and cos/sin (f32) at a few positions.

    tools/reference/.venv/bin/python tools/reference/make_rope_fixtures.py
"""
import json
import os

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

HEAD_DIM = 16
BASE = dict(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rope_theta=10000.0)
LONG = [1.0 + 0.37 * i for i in range(HEAD_DIM // 2)]
SHORT = [1.0 + 0.05 * i for i in range(HEAD_DIM // 2)]
CASES = {
    "default": {},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "yarn_mscale": {"max_position_embeddings": 256,
                    "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                     "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 24, "beta_slow": 2,
                                     "truncate": False}},
    "yarn_attention_factor": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                               "original_max_position_embeddings": 32, "attention_factor": 0.9}},
    "longrope": {"max_position_embeddings": 128,
                 "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                  "original_max_position_embeddings": 32}},
    "longrope_top_level_original": {"max_position_embeddings": 128, "original_max_position_embeddings": 16,
                                    "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT,
                                                     "long_factor": LONG}},
    "llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "v5_rope_parameters": {"rope_theta": None,
                           "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                               "original_max_position_embeddings": 16}},
}
LENGTHS = [8, 40, 100, 300, 20, 70]
PROBE = [0, 1, 7]


def main():
    out = {"generator": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}",
           "head_dim": HEAD_DIM, "cases": []}
    for name, extra in CASES.items():
        fields = dict(BASE)
        fields.update(extra)
        fields = {k: v for k, v in fields.items() if v is not None}
        config = LlamaConfig(**fields)
        rope = LlamaRotaryEmbedding(config)
        x = torch.zeros(1, dtype=torch.float32)
        calls = []
        for s in LENGTHS:
            pos = torch.arange(s)[None, :]
            cos, sin = rope(x, pos)
            probe = [p for p in PROBE + [s - 1] if p < s]
            calls.append({"seq_len": s, "inv_freq": rope.inv_freq.tolist(),
                          "attention_scaling": float(rope.attention_scaling),
                          "positions": probe,
                          "cos": [cos[0, p].tolist() for p in probe],
                          "sin": [sin[0, p].tolist() for p in probe]})
        out["cases"].append({"name": name, "config": fields, "calls": calls})
    path = os.path.join(os.path.dirname(__file__), "../../tests/fixtures/rope/rope_goldens.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
