"""Native sumcumprod on (4096, 4096) float32 and float64, CPU: forward vs a numpy copy of
the same array (the bandwidth reference), vs jax.lax.associative_scan, vs lax.scan;
gradient (`grad` of a sum, where XLA drops the unused forward; `value_and_grad`, forward
and backward; the backward alone); vmap-of-op vs the unbatched op on the same data vs a
Python loop over rows.

Memory: the first touch of a freshly allocated 64 MiB buffer costs tens of ms of page
faults here; the script re-executes itself with glibc's mmap/trim thresholds raised so
freed buffers are reused (as numpy's copy target is), and the medians are warm; the
first (cold) call is printed too. Each ratio to the copy is the median over rounds that
time the copy and the op back to back, so the machine's drift cancels.

Last line: RESULT sumcumprod <native forward / numpy copy, float32, warm rounds>.
"""

import os
import sys
import time

# Keep glibc from returning large freed buffers to the OS (else every 64 MiB output is
# page-faulted afresh, ~60 ms here): re-run this script once with the retention settings.
# MALLOC_ARENA_MAX=1: XLA's pool threads otherwise allocate from per-thread arenas, whose
# heaps are at most 64 MiB, so a 64 MiB buffer there is always a fresh mmap.
_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736", "MALLOC_ARENA_MAX": "1"}
if __name__ == "__main__" and any(os.environ.get(k) != v for k, v in _MALLOC.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC})

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import median_time, paired_ratios  # noqa: E402

from eqgp.ops import sumcumprod, sumcumprod_reference  # noqa: E402

R = C = 4096
ROUNDS = 15


def lax_scan_sumcumprod(x):
    def step(acc, xi):
        acc = xi * (1 + acc)
        return acc, acc

    _, ys = jax.lax.scan(step, jnp.zeros(x.shape[:-1], x.dtype), jnp.moveaxis(x, -1, 0), reverse=True)
    return jnp.moveaxis(ys, 0, -1)


def cold_time(fn, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def bench(dtype):
    """Prints one dtype's lines; returns the float32 forward/copy ratio (None for float64)."""
    result = None
    name = np.dtype(dtype).name
    xn = np.random.default_rng(0).uniform(0.2, 1.0, (R, C)).astype(dtype)
    x = jnp.asarray(xn)
    ct = jnp.asarray(np.random.default_rng(1).normal(size=(R, C)).astype(dtype))
    fwd = jax.jit(sumcumprod)
    assoc = jax.jit(sumcumprod_reference)
    scan = jax.jit(lax_scan_sumcumprod)
    total = lambda v: jnp.sum(sumcumprod(v))  # noqa: E731
    # grad: XLA drops the forward (its output is unused; the backward recomputes z in cache).
    grad = jax.jit(jax.grad(total))
    # value_and_grad: forward + backward, the forward's output returned.
    value_and_grad = jax.jit(jax.value_and_grad(total))
    vjp = jax.jit(lambda v, c: jax.vjp(sumcumprod, v)[1](c)[0])  # the backward alone
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(fwd(x)[:64], assoc(x)[:64], rtol=rtol)
    np.testing.assert_allclose(fwd(x)[:64], scan(x)[:64], rtol=rtol)
    g_ref = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod_reference(v))))(x[:64])
    np.testing.assert_allclose(grad(x)[:64], g_ref, rtol=10 * rtol)
    np.testing.assert_allclose(value_and_grad(x)[1][:64], g_ref, rtol=10 * rtol)
    t_cold = cold_time(jax.jit(lambda v: sumcumprod(v) * 1), x)

    copy_out = np.empty_like(xn)
    np.copyto(copy_out, xn)  # the copy's output pages are touched once, like jax's reused buffers
    t_copy, ratio = paired_ratios(
        lambda: np.copyto(copy_out, xn),
        {
            "forward": lambda: jax.block_until_ready(fwd(x)),
            "grad": lambda: jax.block_until_ready(grad(x)),
            "value_and_grad": lambda: jax.block_until_ready(value_and_grad(x)),
            "vjp": lambda: jax.block_until_ready(vjp(x, ct)),
        },
        rounds=ROUNDS,
    )
    t_fwd = median_time(fwd, x)
    t_assoc = median_time(assoc, x, repeats=3)
    t_scan = median_time(scan, x, repeats=3)

    def show(key):
        warm, every, faulted = ratio[key]
        warm = "  n/a" if warm is None else f"{warm:5.2f}"
        return f"{warm} warm, {every:5.2f} all rounds ({faulted}/{ROUNDS} page-faulted)"

    print(f"[{name}] numpy copy {t_copy * 1e3:7.2f} ms (warm, single thread); x/copy: medians of paired rounds")
    print(
        f"[{name}] native forward {t_fwd * 1e3:7.2f} ms warm, {t_cold * 1e3:7.2f} ms cold first call"
        f" | forward/copy {show('forward')}"
    )
    print(
        f"[{name}] associative_scan {t_assoc * 1e3:8.1f} ms ({t_assoc / t_fwd:5.1f}x native)"
        f" | lax.scan {t_scan * 1e3:8.1f} ms ({t_scan / t_fwd:5.1f}x native)"
    )
    print(f"[{name}] grad of sum/copy {show('grad')} (XLA drops the unused forward)")
    print(f"[{name}] value_and_grad of sum (fwd+bwd)/copy {show('value_and_grad')}")
    print(f"[{name}] vjp with a given cotangent (bwd only)/copy {show('vjp')}")
    if dtype == np.float32:
        result = ratio["forward"][0] if ratio["forward"][0] is not None else ratio["forward"][1]
        xb = x[:512]
        vm = jax.jit(jax.vmap(sumcumprod))
        loop = jax.jit(lambda v: jnp.stack([sumcumprod(v[i]) for i in range(v.shape[0])]))
        t_vm, t_un, t_loop = median_time(vm, xb), median_time(fwd, xb), median_time(loop, xb)
        print(
            f"[{name}] (512, 4096): vmap(op) {t_vm * 1e3:.2f} ms | op on the batch {t_un * 1e3:.2f} ms"
            f" | python loop over rows {t_loop * 1e3:.2f} ms ({t_loop / t_vm:.1f}x vmap)"
        )
    return result


def main():
    result = bench(np.float32)
    bench(np.float64)
    print(f"RESULT sumcumprod {result:.3f}")


if __name__ == "__main__":
    main()
