"""eqgp's jit (`eqx.filter_jit` at full float32 precision) and the opt-in XLA options."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

# XLA:CPU (jaxlib 0.10) hands elementwise ops and reductions to YNNPACK "ynn fusions"; an
# experimental option turns them off (docs/performance.md has the measurements).
_CANDIDATE = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def _probe() -> tuple[tuple[str, str], ...]:
    try:  # an XLA without the option rejects it: then there is nothing to offer
        jax.jit(lambda x: x + 1, compiler_options=dict(_CANDIDATE)).lower(jnp.zeros(())).compile()
    except Exception:  # noqa: BLE001
        return ()
    return tuple(_CANDIDATE.items())


def compiler_options() -> dict[str, str]:
    """Optional XLA compiler options for a top-level jit of your own (opt-in).

    eqgp never sets compiler options itself. To try them, pass them to your own top-level
    jit, e.g. `eqx.filter_jit(step, compiler_options=eqgp.compiler_options())` (options of
    an outer `jit` apply to everything inlined into it), or to `eqgp.fit(...,
    compiler_options=...)`. Currently this turns off XLA:CPU's experimental YNNPACK
    fusions, which are slower for some float64 likelihood gradients at small input
    dimension (see docs/performance.md); it is empty where the installed XLA does not know
    the option. Needs a backend (the first call probes it).
    """
    return dict(_probe())


def full_precision(fn):
    """`fn` traced with its matrix products at full float32 precision.

    On GPUs JAX's default lets XLA run float32 products as TF32 (a 10-bit mantissa, ~1e-3
    relative error), enough to make the Cholesky factorisation of a gram matrix fail.
    GPyTorch (PyTorch) does not use TF32 by default either. The precision is bound into
    each product when it is traced, so this wraps eqgp's entry points and its hand-written
    backward passes; on CPU and in float64 it changes nothing."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapped


def jit(fn):
    """An eqgp entry point: `eqx.filter_jit` of `fn` at full float32 precision."""
    return eqx.filter_jit(full_precision(fn))
