"""Writes tests/fixtures/attention/attention_goldens.json: the attention options of
ops::ScaledDotProductAttention (scale, softcap, window, sinks, an additive mask; Note [Attention
options] in ops/local/cpu/attention.cc) computed by transformers' own eager attention functions,
Gemma 2's (scaling, softcap, mask) and gpt-oss's (sinks), with the masks made by transformers'
masking_utils (causal_mask_function, sliding_window_causal_mask_function), and one gpt-oss
attention layer (GptOssAttention, sinks and a sliding window) for nn::Attention at tp 2.

Inputs are bf16-representable, so the same golden (f32 math on them) checks the f32 and the bf16
kernels. Prefill: every query row; decode: the last query row against every key.

    tools/reference/.venv/bin/python tools/reference/make_attention_fixtures.py
"""
import json
import os

import torch
import transformers
from transformers import GptOssConfig
from transformers.masking_utils import (causal_mask_function,
                                        sliding_window_causal_mask_function)
from transformers.models.gemma2.modeling_gemma2 import \
    eager_attention_forward as gemma2_attention
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention
from transformers.models.gpt_oss.modeling_gpt_oss import \
    eager_attention_forward as gpt_oss_attention

B, HQ, HKV, S, D = 2, 4, 2, 20, 8


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def additive(mask_fn, q_positions, keys):
    """The boolean mask of transformers' mask function as 0 / -inf, [1, 1, len(q), keys]."""
    q_idx = torch.tensor(q_positions)[:, None]
    kv_idx = torch.arange(keys)[None, :]
    ok = mask_fn(0, 0, q_idx, kv_idx)
    return torch.where(ok, 0.0, float("-inf"))[None, None]


class Module(torch.nn.Module):
    """What the eager functions read off their attention module."""

    def __init__(self, sinks=None):
        super().__init__()
        self.num_key_value_groups = HQ // HKV
        self.head_dim = D
        self.training = False
        if sinks is not None:
            self.sinks = sinks


def flat(t):
    return [float("%.9g" % x) if x != float("-inf") else "-inf" for x in t.reshape(-1).tolist()]


def main():
    torch.manual_seed(0)
    q = bf16(torch.randn(B, HQ, S, D))
    k = bf16(torch.randn(B, HKV, S, D))
    v = bf16(torch.randn(B, HKV, S, D))
    sinks = bf16(torch.tensor([0.5, -1.0, 2.5, 0.0]))
    mask = bf16(torch.randn(B, 1, S, S) * 2)
    mask[0, 0, 3, :3] = float("-inf")  # a custom mask may hide keys too (JSON: "-inf")
    cases = {
        "scale": dict(scale=0.6),
        "softcap": dict(softcap=1.5),
        "window": dict(window=6),
        "sinks": dict(sinks=True),
        "mask": dict(mask=True),
        "softcap_window_scale": dict(scale=0.6, softcap=1.5, window=6),
        "sinks_window": dict(sinks=True, window=6),
    }
    out = {"generator": f"transformers {transformers.__version__}, torch {torch.__version__}",
           "shape": {"B": B, "Hq": HQ, "Hkv": HKV, "S": S, "D": D},
           "q": flat(q), "k": flat(k), "v": flat(v), "sinks": flat(sinks), "mask": flat(mask),
           "cases": []}
    for name, c in cases.items():
        scale = c.get("scale", D ** -0.5)
        fn = (sliding_window_causal_mask_function(c["window"]) if "window" in c
              else causal_mask_function)
        results = {}
        for mode, rows in (("prefill", list(range(S))), ("decode", [S - 1])):
            # The causal (and window) mask of these query positions, plus the custom one.
            m = additive(fn, rows, S).expand(B, 1, len(rows), S)
            if c.get("mask"):
                m = m + mask[:, :, rows]
            qq = q[:, :, rows]
            if c.get("sinks"):
                o, _ = gpt_oss_attention(Module(sinks), qq, k, v, m, scaling=scale)
            else:
                o, _ = gemma2_attention(Module(), qq, k, v, m, scaling=scale,
                                        softcap=c.get("softcap"))
            results[mode] = flat(o.transpose(1, 2))  # back to [B, Hq, rows, D]
        out["cases"].append({"name": name, "scale": scale, "softcap": c.get("softcap", 0),
                             "window": c.get("window", 0), "sinks": bool(c.get("sinks")),
                             "mask": bool(c.get("mask")), **results})

    # One gpt-oss attention layer: sinks and a sliding window, no rotary (cos 1, sin 0).
    config = GptOssConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          sliding_window=5, layer_types=["sliding_attention"],
                          num_hidden_layers=1, attention_bias=True)
    config._attn_implementation = "eager"
    layer = GptOssAttention(config, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(bf16(torch.randn_like(p) * 0.3))
        x = bf16(torch.randn(1, 11, 32))
        m = additive(sliding_window_causal_mask_function(5), list(range(11)), 11)
        cos = torch.ones(1, 11, 4)
        sin = torch.zeros(1, 11, 4)
        y, _ = layer(x, (cos, sin), m)
    out["gpt_oss_layer"] = {
        "hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "window": 5, "tokens": 11,
        "x": flat(x), "y": flat(y),
        "params": {n: flat(p) for n, p in layer.named_parameters()},
    }
    path = os.path.join(os.path.dirname(__file__),
                        "../../tests/fixtures/attention/attention_goldens.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
