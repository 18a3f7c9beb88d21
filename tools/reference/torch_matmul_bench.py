#!/usr/bin/env python3
"""PyTorch's matmul against ours (bench_gemm's GEMM rows, the path the dispatcher picked), same
shapes, same threads, in one run.

    tools/reference/.venv/bin/python tools/reference/torch_matmul_bench.py [--bench build/bin/bench_gemm]
        [--threads T] [--reps N]

Runs `bench_gemm --quick --gemm-only`, prints its output, reads the GEMM rows ("f32 1024x1024x1024
...", "bf16 512x1536x512 x.wT ...": dtype, M x N x K, Linear's layout when marked x.wT; the path
the dispatcher picked and its GFLOP/s) and times torch.matmul (or torch.nn.functional.linear for
x.wT rows) on the same shapes, dtypes and layouts with torch.set_num_threads(T), T = the threads
bench_gemm reports (its oneTBB arena: all cores). PyTorch's CPU matmul runs on MKL (f32) and
oneDNN (bf16, f32 accumulation; AMX where granted). The two sides take turns, twice (ours,
PyTorch, ours, PyTorch; PyTorch's figure per row the median of --reps calls after a warm-up), and
each side's better pass is compared: a machine whose speed drifts (a shared VM) favours neither.
Ends with RESULT lines: f32 >= 1.0x and bf16 >= 0.9x PyTorch's GFLOP/s on every row (issue 44).
"""
import re

import torch
import torch.nn.functional as F

from bench_util import bench_parser, median_seconds, run_ours

ROW = re.compile(r"^(f32|bf16) (\d+)x(\d+)x(\d+)( x\.wT)?\s+(.*)$")
TARGET = {"f32": 1.0, "bf16": 0.9}


def torch_gflops(dtype, m, n, k, linear, reps):
    dt = torch.float32 if dtype == "f32" else torch.bfloat16
    g = torch.Generator().manual_seed(1)
    a = torch.randn(m, k, generator=g).to(dt)
    b = torch.randn(n, k, generator=g).to(dt) if linear else torch.randn(k, n, generator=g).to(dt)
    run = (lambda: F.linear(a, b)) if linear else (lambda: torch.matmul(a, b))
    with torch.no_grad():
        seconds = median_seconds(run, reps)
    return 2.0 * m * n * k / seconds / 1e9


def main():
    args = bench_parser(__doc__, "bench_gemm", 7, threads_help="default: bench_gemm's T").parse_args()
    passes = []  # (our rows, PyTorch's GFLOP/s per row) per pass
    threads = args.threads
    for _ in range(2):
        matches, threads = run_ours([args.bench, "--quick", "--gemm-only"], ROW, threads)
        torch.set_num_threads(threads)
        rows = []
        for m in matches:
            fields = m.group(6).split()
            # own dnnl openblas picked-name picked-gflops ...: the picked GFLOP/s is the 5th field.
            rows.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), bool(m.group(5)),
                         fields[3], float(fields[4])))
        passes.append((rows, [torch_gflops(d, m, n, k, lin, args.reps) for d, m, n, k, lin, _, _ in rows]))
    print(f"\nPyTorch {torch.__version__} (MKL {torch.backends.mkl.is_available()}, oneDNN "
          f"{torch.backends.mkldnn.is_available()}) vs ours, {threads} threads each (GFLOP/s)")
    print(f"{'dtype MxNxK':28} {'ours':>9} {'picked':>8} {'torch':>9} {'ours/torch':>11}")
    results = []
    (rows1, torch1), (rows2, torch2) = passes
    for r1, r2, t1, t2 in zip(rows1, rows2, torch1, torch2):
        d, m, n, k, lin, picked, _ = r1
        ours, theirs = max(r1[6], r2[6]), max(t1, t2)
        name = f"{d} {m}x{n}x{k}{' x.wT' if lin else ''}"
        print(f"{name:28} {ours:9.1f} {picked:>8} {theirs:9.1f} {ours / theirs:11.2f}"
              f"   (passes: ours {r1[6]:.1f}, {r2[6]:.1f}; torch {t1:.1f}, {t2:.1f})")
        metric = f"gemm_{d}_{m}x{n}x{k}{'_linear' if lin else ''}_vs_torch"
        results.append((metric, ours / theirs, TARGET[d]))
    for metric, value, target in results:
        print(f"RESULT {metric} {value:.2f} {target} {'PASS' if value >= target else 'FAIL'}")


if __name__ == "__main__":
    main()
