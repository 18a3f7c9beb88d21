"""Shared by the peer benchmarks (tools/reference/*_bench.py): how a peer's call is timed."""
import statistics
import time


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
