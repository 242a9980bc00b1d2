"""Timing helpers shared by the benchmarks: medians of repeated runs, ratios printed."""

import resource
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


def torch_device(torch) -> str:
    """Where the GPyTorch columns run: "cuda" when JAX runs on a GPU and torch sees one (both
    libraries on the same device), else "cpu"."""
    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # every thread of the process


def paired_ratios(reference, fns: dict, rounds: int = 15, warmup: int = 2) -> tuple[float, dict]:
    """Time `reference()` and each named `fns[k]()` back to back in each of `rounds`
    rounds, so that the machine's drift (other jobs, clock changes) cancels in the ratio.

    Returns the median reference time and, per name, `(warm, all_rounds, faulted)`:
    the median ratio time(fn) / time(reference) over the rounds in which `fn` caused no
    page fault (None if it faulted every time), the median over all rounds, and in how
    many rounds it faulted. Here first-touching a fresh 64 MiB buffer costs tens of ms,
    and whether XLA's buffers come back from the allocator already touched varies from
    call to call, so the two medians say different things: the op's speed, and what a
    caller sees with this allocator. Every callable blocks until its result is ready.
    """
    for _ in range(warmup):
        reference()
        for fn in fns.values():
            fn()
    ref_times, samples = [], {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            reference()
            t1 = time.perf_counter()
            f0 = _minor_faults()
            fn()
            f1 = _minor_faults()
            t2 = time.perf_counter()
            ref_times.append(t1 - t0)
            samples[k].append(((t2 - t1) / (t1 - t0), f1 - f0 > 256))
    out = {}
    for k, v in samples.items():
        warm = [r for r, faulted in v if not faulted]
        out[k] = (statistics.median(warm) if warm else None, statistics.median(r for r, _ in v), len(v) - len(warm))
    return statistics.median(ref_times), out
