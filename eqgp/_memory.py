"""An explicit, opt-in allocator setting for large arrays on CPU (glibc only).

By default glibc serves every allocation of 32 MiB or more with a fresh `mmap` and returns it
to the kernel on `free`, and XLA's worker threads allocate from their own arenas; so each
large output of a jitted function is new memory whose first touch page-faults (~60 ms per
64 MiB on the machines we measured, more than `sumcumprod` itself). eqgp asks for huge pages
on the outputs it writes, which cuts that cost, but only keeping freed memory for reuse
removes it. That is a process-wide change, so eqgp never makes it silently: call
`reuse_large_buffers()` once, at the start of the program, before JAX runs anything.
"""

import ctypes
import ctypes.util
import functools

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
