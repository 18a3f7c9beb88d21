#!/usr/bin/env python3
"""transformers' Llama prefill against ours (`bench_llama --prefill-only`), same model, same dtype,
same threads, in one run.

    tools/reference/.venv/bin/python tools/reference/llama_prefill_bench.py [--bench build/bin/bench_llama]
        [--dtype bf16|f32] [--prompt 512] [--threads T] [--reps N]

The model is bench_llama's (bench/llama.cc, BenchConfig): hidden 512, 4 layers, 8 query and 4 KV
heads of 64, intermediate 1376, vocab 4096, RoPE theta 500000 with llama3 scaling (factor 8),
untied; random weights (nothing is downloaded) in --dtype. Prefill is one forward of the prompt
with the KV cache filled, batch 1, under torch.no_grad() (transformers' default SDPA attention),
as generate() runs it; its tokens/s is prompt / median time. Ours: bench_llama --prefill-only on
one rank with oneTBB's threads. T defaults to os.cpu_count(), what bench_llama's arena uses;
torch.set_num_threads(T).

The two sides take turns, twice (transformers, ours, transformers, ours; transformers' figure the
median of --reps forwards after a warm-up, ours bench_llama's median), and each side's better pass
is compared: a machine whose speed drifts (a shared VM) favours neither. Ends with
    RESULT llama_prefill_<dtype>_<prompt>_vs_transformers <ours / theirs in tokens/s> 1.0 PASS|FAIL
"""
import os
import re
import subprocess
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from bench_util import bench_parser, median_seconds

CONFIG = dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
              rms_norm_eps=1e-5, rope_theta=500000.0,
              rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=1024),
              tie_word_embeddings=False)


def transformers_tokens_per_s(dtype, prompt, reps):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(dtype).eval()
    ids = torch.tensor([[(i * 37 + 11) % 4096 for i in range(prompt)]])

    def forward():
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
        assert torch.isfinite(out.logits[0, -1].float()).all()

    return prompt / median_seconds(forward, reps)


def main():
    ap = bench_parser(__doc__, "bench_llama", 5, threads=os.cpu_count())
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--prompt", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"llama_prefill_bench: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.dtype}, prompt {args.prompt}, {args.threads} threads on each side")
    cmd = [args.bench, "--prefill-only", "--dtype", args.dtype, "--prompt", str(args.prompt), "--reps",
           str(args.reps)]

    def ours_tokens_per_s():
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        sys.stdout.write(out)
        return float(re.search(r"^prefill ([\d.]+) tokens/s", out, re.M).group(1))

    t1 = transformers_tokens_per_s(dtype, args.prompt, args.reps)
    o1 = ours_tokens_per_s()
    t2 = transformers_tokens_per_s(dtype, args.prompt, args.reps)
    o2 = ours_tokens_per_s()
    ours, theirs = max(o1, o2), max(t1, t2)
    print(f"\n{'':14} {'prefill tok/s':>14}")
    print(f"{'ours':14} {ours:14.1f}   (passes {o1:.1f}, {o2:.1f})")
    print(f"{'transformers':14} {theirs:14.1f}   (passes {t1:.1f}, {t2:.1f})")
    ratio = ours / theirs
    print(f"RESULT llama_prefill_{args.dtype}_{args.prompt}_vs_transformers {ratio:.2f} 1.0 "
          f"{'PASS' if ratio >= 1.0 else 'FAIL'}")


if __name__ == "__main__":
    main()
