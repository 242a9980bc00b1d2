"""Timing helpers shared by the benchmarks: medians of repeated runs, ratios printed."""

import statistics
import time

import jax


def median_time(fn, *args, repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of `fn(*args)` in seconds, outputs blocked on."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_median_time(fn, repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
