"""Large arrays on CPU and their page faults (glibc, Linux).

By default glibc serves every allocation of 32 MiB or more with a fresh `mmap` and returns it
to the kernel on `free`, and XLA's worker threads allocate from their own arenas; so each
large output of a jitted function is new memory whose first touch page-faults (~60 ms per
64 MiB on the machines we measured, more than `sumcumprod` itself). Two remedies:

- by default, eqgp asks for huge pages (one fault per 2 MiB) on the outputs its native
  handlers write, and computes its large grams into such a buffer (`in_huge_pages`);
- opt-in, `reuse_large_buffers()` keeps freed memory for reuse, which removes the faults of
  every large buffer. That is a process-wide change, so eqgp never makes it silently: call it
  once, at the start of the program, before JAX runs anything.
"""

import ctypes
import ctypes.util
import functools

import jax
from jaxtyping import Array

from . import _native

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


@functools.cache
def reuse_large_buffers(keep_bytes: int = 2**31 - 1) -> bool:
    """Make glibc keep freed large buffers for reuse instead of unmapping them (opt-in).

    Sets, in this process only: one malloc arena for all threads (`M_ARENA_MAX = 1`),
    large allocations from the heap instead of fresh `mmap`s (`M_MMAP_THRESHOLD`), and up
    to `keep_bytes` of freed memory kept rather than returned to the kernel
    (`M_TRIM_THRESHOLD`). The same as starting Python with `MALLOC_ARENA_MAX=1
    MALLOC_MMAP_THRESHOLD_=2147483648 MALLOC_TRIM_THRESHOLD_=<keep_bytes>`. Call it before
    JAX's first computation (threads that already made their own arenas keep them).
    Costs: memory freed by the program stays in the process (up to `keep_bytes`), and all
    threads share one arena's lock.

    **Returns:** True if glibc accepted the settings; False elsewhere (not glibc), where
    nothing changes.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_ARENA_MAX, 1) == 1
    ok &= mallopt(_M_MMAP_THRESHOLD, 2**31 - 1) == 1  # an int: 2 GiB is the largest
    ok &= mallopt(_M_TRIM_THRESHOLD, min(int(keep_bytes), 2**31 - 1)) == 1
    return bool(ok)


#: Outputs from this size up go into eqgp's huge-page buffer on CPU: glibc serves every
#: allocation of 32 MiB or more (its largest dynamic mmap threshold) with a fresh `mmap`.
LARGE_OUTPUT_BYTES = 32 << 20


def in_huge_pages(x: Array) -> Array:
    """`x` itself, computed into a buffer in huge pages where that saves page faults.

    On CPU, for arrays of `LARGE_OUTPUT_BYTES` and more, this is `zeros + x` with `zeros`
    from eqgp's native `eqgp_zeros` (a zero-filled buffer whose pages it asked to be
    2 MiB ones): XLA computes the sum in place into that buffer, so the result costs one
    page fault per 2 MiB instead of one per 4 KiB (a (3 300, 3 300) float64 gram went from
    21 000 faults and 68 ms to 320 faults and 40 ms). Elsewhere (other platforms, small
    arrays, no native extension) it returns `x`. Exact: adding zeros changes no value (a
    `-0.0` becomes `0.0`)."""
    if x.size * x.dtype.itemsize < LARGE_OUTPUT_BYTES or "cpu" not in _native.BUILT_PLATFORMS:
        return x

    def cpu(x):
        zeros = jax.ffi.ffi_call("eqgp_zeros", jax.ShapeDtypeStruct(x.shape, x.dtype))()
        return zeros + x

    return jax.lax.platform_dependent(x, cpu=cpu, default=lambda x: x)
