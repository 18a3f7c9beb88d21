"""Shared by the peer benchmarks (tools/reference/*_bench.py): how a peer's call is timed, and how
our own bench's rows are read."""
import argparse
import re
import statistics
import subprocess
import sys
import time


def bench_parser(doc, bench, reps, threads=0, threads_help=None):
    """The command line every peer bench shares, to add its own flags to: --bench (our bench's
    binary, build/bin/<bench>), --threads (default `threads`) and --reps (default `reps`)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--bench", default=f"build/bin/{bench}")
    ap.add_argument("--threads", type=int, default=threads, help=threads_help)
    ap.add_argument("--reps", type=int, default=reps)
    return ap


def median_seconds(fn, reps, warmup=1):
    """fn's median wall time in seconds over `reps` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_ours(cmd, row, threads):
    """Runs our bench (`cmd`) and echoes its output. Returns the matches of `row` (a compiled regex)
    on its lines, in order (SystemExit when none matches), and the thread count to give the peer:
    `threads`, or when that is 0 the bench's own (its `T = N threads` line)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    sys.stdout.write(out)
    matches = [m for m in map(row.match, out.splitlines()) if m]
    if not matches:
        raise SystemExit(f"no rows in the output of {' '.join(cmd)}")
    if not threads:
        threads = int(re.search(r"T = (\d+) threads", out).group(1))
    return matches, threads
