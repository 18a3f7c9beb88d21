#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention against ours (bench_attention's prefill and decode rows),
same shapes, dtypes and threads, in one run.

    tools/reference/.venv/bin/python tools/reference/sdpa_bench.py [--bench build/bin/bench_attention]
        [--threads T] [--reps N]

Runs `bench_attention --quick --threads T`, prints its output, reads its rows ("prefill bf16 32/8/128
2048x2048 <ms> ...": dtype, query heads / KV heads / head dim, Sq x Skv, our median ms) and times
torch.nn.functional.scaled_dot_product_attention on the same shapes and dtype with
torch.set_num_threads(T), T = the threads bench_attention reports: q [1, Hq, Sq, D], k and v
[1, Hkv, Skv, D], contiguous, standard normal, enable_gqa=True; prefill rows is_causal=True (PyTorch's
CPU flash attention kernel), decode rows (one query against Skv cached keys, which it all sees)
is_causal=False, as our bottom-right-aligned causal mask means for one query. The two sides take
turns, twice (ours, PyTorch, ours, PyTorch; PyTorch's figure per row the median of --reps calls,
10x as many for decode rows, after a warm-up), and each side's better pass is compared: a machine whose speed drifts (a shared
VM) favours neither. Ends with RESULT lines, ratio = our throughput / PyTorch's (its time / ours),
the worst of the shapes per dtype and length: attention_<dtype>_<tokens>_vs_sdpa for prefill and
attention_decode_<dtype>_<tokens>_vs_sdpa for decode, target 1.0.
"""
import re

import torch
import torch.nn.functional as F

from bench_util import bench_parser, median_seconds, run_ours

ROW = re.compile(r"^(prefill|decode)\s+(f32|bf16)\s+(\d+)/(\d+)/(\d+)\s+(\d+)x(\d+)\s+([\d.]+)")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def torch_ms(kind, dtype, hq, hkv, d, sq, skv, reps):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, hq, sq, d, generator=g).to(DTYPES[dtype])
    k = torch.randn(1, hkv, skv, d, generator=g).to(DTYPES[dtype])
    v = torch.randn(1, hkv, skv, d, generator=g).to(DTYPES[dtype])
    causal = kind == "prefill"
    with torch.no_grad():
        seconds = median_seconds(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True), reps)
    return seconds * 1e3


def main():
    args = bench_parser(__doc__, "bench_attention", 5,
                        threads_help="default: bench_attention's T (all cores)").parse_args()
    threads = args.threads
    cmd = [args.bench, "--quick"] + ([f"--threads={threads}"] if threads else [])
    passes = []  # (our rows, PyTorch's ms per row) per pass
    for _ in range(2):
        matches, threads = run_ours(cmd, ROW, threads)
        torch.set_num_threads(threads)
        rows = [(m.group(1), m.group(2), *(int(m.group(i)) for i in range(3, 8)), float(m.group(8)))
                for m in matches]
        # A decode call takes tens of microseconds: more of them, so that the median is one the
        # OpenMP threads were awake for.
        passes.append((rows, [torch_ms(*r[:7], args.reps if r[0] == "prefill" else 10 * args.reps)
                              for r in rows]))
    print(f"\nPyTorch {torch.__version__} scaled_dot_product_attention vs ours, {threads} threads each "
          f"(ms per call, the better of two passes)")
    print(f"{'rows':8} {'dtype':5} {'heads':9} {'SqxSkv':10} {'ours':>9} {'torch':>9} {'torch/ours':>11}")
    worst = {}
    (rows1, torch1), (rows2, torch2) = passes
    for r1, r2, t1, t2 in zip(rows1, rows2, torch1, torch2):
        kind, dtype, hq, hkv, d, sq, skv, _ = r1
        ours, theirs = min(r1[7], r2[7]), min(t1, t2)
        ratio = theirs / ours
        print(f"{kind:8} {dtype:5} {f'{hq}/{hkv}/{d}':9} {f'{sq}x{skv}':10} {ours:9.3f} {theirs:9.3f} "
              f"{ratio:11.2f}   (passes: ours {r1[7]:.3f}, {r2[7]:.3f}; torch {t1:.3f}, {t2:.3f})")
        prefix = "attention" if kind == "prefill" else "attention_decode"
        metric = f"{prefix}_{dtype}_{skv}_vs_sdpa"
        worst[metric] = min(worst.get(metric, ratio), ratio)
    for metric, value in worst.items():
        print(f"RESULT {metric} {value:.2f} 1.0 {'PASS' if value >= 1.0 else 'FAIL'}")


if __name__ == "__main__":
    main()
