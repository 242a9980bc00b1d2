"""eqgp's jit: `eqx.filter_jit` with the XLA options of `compiler_options()`."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

# XLA:CPU (jaxlib 0.10) hands elementwise ops and reductions to YNNPACK "ynn fusions";
# for the float64 gram/likelihood graphs eqgp builds they were 2-3x slower than XLA's
# own loops; since the kernels' squared distances are dots, 1.0-1.3x
# (benchmarks/gp_likelihood.py prints both).
_CANDIDATE = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def _probe() -> tuple[tuple[str, str], ...]:
    try:  # an XLA without the option rejects it: then compile with the defaults
        jax.jit(lambda x: x + 1, compiler_options=dict(_CANDIDATE)).lower(jnp.zeros(())).compile()
    except Exception:  # noqa: BLE001
        return ()
    return tuple(_CANDIDATE.items())


def compiler_options() -> dict[str, str]:
    """The XLA compiler options eqgp compiles its own entry points and `eqgp.fit` with.

    Pass them to your own training step too, e.g.
    `eqx.filter_jit(step, compiler_options=eqgp.compiler_options())`: options of an
    outer `jit` apply to everything inlined into it. Currently this turns off XLA:CPU's
    YNNPACK fusions, which make the float64 likelihood gradient 1.0-1.3x slower here
    (it was 2-3x before eqgp's kernels wrote their squared distances as dots); it is
    empty where the installed XLA does not know the option.
    """
    return dict(_probe())


def full_precision(fn):
    """`fn` traced with its matrix products at full float32 precision.

    On GPUs JAX's default lets XLA run float32 products as TF32 (a 10-bit mantissa, ~1e-3
    relative error), which loses a Cholesky of a gram matrix (seen on an H200: float32
    training failed its Cholesky, products off by 1e-4). GPyTorch (PyTorch) does not use
    TF32 by default either. The precision is bound into each product when it is traced, so
    this wraps eqgp's entry points and its hand-written backward passes; on CPU and in
    float64 it changes nothing."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapped


def _tracing() -> bool:
    """Whether we are inside a trace (jit, grad, vmap, ...): then options are not allowed."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)  # under a jit trace every op is staged


class _LazyJit:
    """`eqx.filter_jit(fn)`, with `compiler_options()` when called at the top level.

    Options are only allowed on a top-level jit, and probing them needs a backend, which
    importing eqgp must not start: so the optioned version is made at the first top-level
    call; a call from inside a trace (a traced argument, or an enclosing jit) uses the
    plain one, whose code then compiles with the enclosing jit's options."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self._fn = fn = full_precision(fn)
        self._plain = eqx.filter_jit(fn)
        self._top = None

    def __call__(self, *args, **kwargs):
        if _tracing() or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            return self._plain(*args, **kwargs)
        if self._top is None:
            self._top = eqx.filter_jit(self._fn, compiler_options=compiler_options())
        return self._top(*args, **kwargs)

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return functools.partial(self, instance)


def jit(fn):
    return _LazyJit(fn)
