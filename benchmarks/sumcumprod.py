"""Native sumcumprod on CPU, default environment (no variables set, nothing re-executed).

(4096, 4096) float32 and float64: forward first vs XLA's own elementwise op of the same
shape (`jax.jit(jnp.negative)`: one read and one write, the same allocator for its output),
then vs a numpy copy (`x.copy()`, the bandwidth reference), vs `jax.lax.associative_scan`
and `lax.scan`; `grad` of `sum(sumcumprod(x))`, `value_and_grad`, the backward alone, and
for scale XLA's own `grad` of `sum(x * x)`. Small and batched sizes: a (4096,) vector and
`vmap` over (64, 4096), against `jnp.negative`.

Each ratio is the median over rounds that time the reference and the op back to back (the
machine's drift cancels). "all rounds" is what a caller sees, page faults of freshly
allocated outputs included; "warm" leaves out the rounds in which the op page-faulted.

A separate, named TUNED line runs the float32 forward in a process started with glibc's
allocator variables of docs/performance.md (freed large buffers kept for reuse).

Last line: RESULT sumcumprod <native forward / jnp.negative, float32, all rounds>.
"""

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import median_time, paired_ratios

from eqgp.ops import sumcumprod, sumcumprod_reference

jax.config.update("jax_enable_x64", True)

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
    """Prints one dtype's lines; returns (forward/copy, forward/negative, associative scan/forward)."""
    name = np.dtype(dtype).name
    xn = np.random.default_rng(0).uniform(0.2, 1.0, (R, C)).astype(dtype)
    x = jnp.asarray(xn)
    ct = jnp.asarray(np.random.default_rng(1).normal(size=(R, C)).astype(dtype))
    fwd = jax.jit(sumcumprod)
    assoc = jax.jit(sumcumprod_reference)
    scan = jax.jit(lax_scan_sumcumprod)
    total = lambda v: jnp.sum(sumcumprod(v))  # noqa: E731
    # grad: the forward's output z is the fused backward's operand.
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
    negative = jax.jit(jnp.negative)
    # XLA's own: grad of sum(x * x) is one fused elementwise pass (2 x) into a fresh buffer.
    xla_grad = jax.jit(jax.grad(lambda v: jnp.sum(v * v)))
    t_copy, ratio = paired_ratios(
        lambda: xn.copy(),
        {
            "forward": lambda: jax.block_until_ready(fwd(x)),
            "negative": lambda: jax.block_until_ready(negative(x)),
            "grad": lambda: jax.block_until_ready(grad(x)),
            "value_and_grad": lambda: jax.block_until_ready(value_and_grad(x)),
            "vjp": lambda: jax.block_until_ready(vjp(x, ct)),
            "xla_grad": lambda: jax.block_until_ready(xla_grad(x)),
        },
        rounds=ROUNDS,
    )
    _, vs_neg = paired_ratios(
        lambda: jax.block_until_ready(negative(x)), {"forward": lambda: jax.block_until_ready(fwd(x))}, rounds=ROUNDS
    )
    t_fwd = median_time(fwd, x)
    # Not paired: run right after a reference that churns through hundreds of MB, the
    # forward's fresh output costs it 2-3x more (measured), so each is timed on its own.
    t_assoc = median_time(assoc, x, repeats=5)
    t_scan = median_time(scan, x, repeats=5)
    assoc_speedup, scan_speedup = t_assoc / t_fwd, t_scan / t_fwd

    def show(r):
        warm, every, faulted = r
        warm = "  n/a" if warm is None else f"{warm:5.2f}"
        return f"{every:5.2f} all rounds, {warm} warm ({faulted}/{ROUNDS} rounds page-faulted)"

    print(f"[{name}] numpy copy {t_copy * 1e3:7.2f} ms (x.copy(), allocating); ratios: medians of paired rounds")
    print(f"[{name}] native forward {t_fwd * 1e3:7.2f} ms, {t_cold * 1e3:7.2f} ms cold first call")
    print(f"[{name}] forward/copy {show(ratio['forward'])}")
    print(f"[{name}] forward/jnp.negative {show(vs_neg['forward'])} (jnp.negative/copy {ratio['negative'][1]:.2f})")
    print(
        f"[{name}] associative_scan {t_assoc * 1e3:8.1f} ms ({assoc_speedup:5.1f}x native)"
        f" | lax.scan {t_scan * 1e3:8.1f} ms ({scan_speedup:5.1f}x native)"
    )
    print(f"[{name}] grad of sum/copy {show(ratio['grad'])} (forward, the broadcast cotangent, the fused backward)")
    print(f"[{name}] value_and_grad of sum (fwd+bwd)/copy {show(ratio['value_and_grad'])}")
    print(f"[{name}] vjp with a given cotangent (bwd only)/copy {show(ratio['vjp'])}")
    print(f"[{name}] XLA's own grad of sum(x * x), one fused pass into a fresh buffer, /copy {show(ratio['xla_grad'])}")
    for shape, label in (((64, 4096), "vmap over (64, 4096)"), ((4096,), "(4096,) vector")):
        xs = x.reshape(-1)[: int(np.prod(shape))].reshape(shape)
        op = jax.jit(jax.vmap(sumcumprod)) if len(shape) == 2 else fwd
        t_op, t_neg = median_time(op, xs, repeats=51), median_time(negative, xs, repeats=51)
        print(f"[{name}] {label}: {t_op * 1e6:8.1f} us, jnp.negative {t_neg * 1e6:8.1f} us, ratio {t_op / t_neg:.2f}")
    return ratio["forward"][1], vs_neg["forward"][1], assoc_speedup


#: glibc's allocator settings of docs/performance.md: one arena, large buffers from the heap,
#: freed memory kept (a process-wide choice of the user's, never eqgp's).
TUNED_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "2147483647", "MALLOC_TRIM_THRESHOLD_": "2147483647"}


def tuned():
    """The float32 forward/copy ratio in a process started with `TUNED_ENV`: a separate,
    named figure."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys; sys.path.insert(0, {here!r})\n"
        "import eqgp.ops\n"
        "import numpy as np, jax, jax.numpy as jnp; from _timing import paired_ratios\n"
        "xn = np.random.default_rng(0).uniform(0.2, 1.0, (4096, 4096)).astype(np.float32); x = jnp.asarray(xn)\n"
        "f = jax.jit(eqgp.ops.sumcumprod)\n"
        "_, r = paired_ratios(lambda: xn.copy(), {'f': lambda: f(x).block_until_ready()}, rounds=15)\n"
        "print(r['f'][1])\n"
    )
    env = {**os.environ, **TUNED_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    t = tuned()
    print(f"[float32] TUNED (glibc variables {TUNED_ENV}) forward/copy {t:.2f} all rounds")
    f32 = bench(np.float32)
    f64 = bench(np.float64)
    print(f"RESULT sumcumprod_tuned_glibc_reuse {t:.3f}")
    print(f"RESULT sumcumprod_vs_copy {f32[0]:.3f}")
    print(f"RESULT sumcumprod_float64_vs_negative {f64[1]:.3f}")
    print(f"RESULT sumcumprod_assoc_scan_speedup {f32[2]:.1f}")
    print(f"RESULT sumcumprod {f32[1]:.3f}")


if __name__ == "__main__":
    main()
