"""Dense linear algebra shared by the solvers and the posterior: a Cholesky factorisation
with retries and its one failure message, and `cholesky_inverse(L) = (L L^T)^{-1}` (LAPACK
?potri through the native extension on CPU, a third of the flops of two triangular solves
with the identity; two triangular solves elsewhere; differentiable to any order)."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array

from ._native import HAVE_NATIVE_INVERSE


def not_pd(what: str, fix: str) -> str:
    """The one message of a failed Cholesky factorisation, for `what` matrix."""
    return (
        f"eqgp: the Cholesky factorisation of {what} failed (the matrix is not numerically "
        f"positive definite, or holds NaN/inf). {fix} Check for duplicate points observed with "
        "(near) zero noise, and check the data and hyper-parameters for NaN/inf."
    )


NOT_PD = not_pd(
    "the observation covariance",
    "Raise the jitter (`eqgp.Cholesky(jitter=1e-6)`), let it retry with growing jitter "
    "(`eqgp.Cholesky(max_tries=3)`) or raise the noise (`noise_floor`).",
)

INDEFINITE = (
    "eqgp: the Cholesky factorisation of the observation covariance failed because the matrix is "
    "indefinite (an eigenvalue below -100 sqrt(eps) times its mean diagonal): no jitter can fix that. "
    "The kernel is not positive semi-definite: a user-written kernel, or a combination that is not a "
    "covariance (a difference of kernels, a negative scale). Check `eqgp.gram(kernel, X, X)` on a few points: "
    "its eigenvalues must be >= 0."
)

# First jitter of the retries when none is given (times the scale: the mean of the diagonal).
_FIRST_JITTER = {jnp.dtype(jnp.float32): 1e-6, jnp.dtype(jnp.float64): 1e-8}


def _report(jitter, needed, ok):
    if needed and ok:
        warnings.warn(
            f"eqgp.Cholesky: the covariance needed jitter {float(jitter):.1e} (times the mean of the "
            "kernel's diagonal) to factorise.",
            RuntimeWarning,
            stacklevel=2,
        )


def cholesky(
    A: Array, jitter: float, max_tries: int = 0, message: str = NOT_PD, scale=None, indefinite: str | None = None
) -> Array:
    """The lower Cholesky factor of `A + j * scale * I` with `j = jitter` and `scale` by default
    `mean(diag A)`; or, with
    `max_tries > 0` and where that fails, with `j` growing tenfold per try (from `jitter`, or
    1e-6 / 1e-8 for float32 / float64), as GPyTorch's `psd_safe_cholesky`. The jitter a retry
    needed is reported by a warning (also under `jit`). Failure: an `eqx.error_if` error, with
    the `indefinite` message (if given) where `A` has an eigenvalue below `-100 sqrt(eps)
    scale` (computed only after a failure), else `message`."""
    n = A.shape[0]
    if n == 0:
        return A
    scale = jnp.mean(jnp.diagonal(A)) if scale is None else jnp.asarray(scale, A.dtype)
    eye = jnp.eye(n, dtype=A.dtype)

    def factor(j):
        return jnp.linalg.cholesky(A + (j * scale) * eye) if jitter or max_tries else jnp.linalg.cholesky(A)

    def failed(L):
        return ~jnp.all(jnp.isfinite(L))

    L = factor(jnp.asarray(jitter, A.dtype))
    if max_tries:
        first = jitter if jitter else _FIRST_JITTER.get(jnp.dtype(A.dtype), 1e-6)
        A0 = jax.lax.stop_gradient(A)

        def cond(c):
            return failed(c[0]) & (c[2] < max_tries)

        def body(c):
            _, j, t = c
            j = jnp.where(t == 0, jnp.asarray(first, A.dtype), 10 * j) if jitter == 0 else 10 * j
            return jnp.linalg.cholesky(A0 + (j * jax.lax.stop_gradient(scale)) * eye), j, t + 1

        # The search runs without derivatives (a while loop has no reverse mode); the factor
        # it found is then recomputed differentiably with the jitter it needed.
        _, used, tries = jax.lax.while_loop(cond, body, (jax.lax.stop_gradient(L), jnp.asarray(jitter, A.dtype), 0))
        L = jax.lax.cond(tries == 0, lambda: L, lambda: factor(used))
        jax.debug.callback(_report, used, tries > 0, ~failed(L))
    bad = failed(L)
    if indefinite is not None:
        # Why it failed: indefinite beyond jitter's reach, or merely ill-conditioned. The
        # eigenvalues are computed on the failure branch only (both run under a batching vmap).
        tol = -100 * jnp.sqrt(jnp.finfo(A.dtype).eps) * jax.lax.stop_gradient(scale)
        lowest = jax.lax.cond(
            bad,
            lambda: jnp.linalg.eigvalsh(jax.lax.stop_gradient(A))[0],
            lambda: jnp.zeros((), A.dtype),
        )
        L = eqx.error_if(L, bad & (lowest < tol), indefinite)
    return eqx.error_if(L, bad, message)


def _generic(L):
    eye = jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape)
    A = jsl.cho_solve((L, True), eye)
    # Exactly symmetric, as potri's result is (the solves' rounding is not, e.g. on GPU).
    return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def _native(L):
    call = jax.ffi.ffi_call(
        "eqgp_cholesky_inverse", jax.ShapeDtypeStruct(L.shape, L.dtype), vmap_method="broadcast_all"
    )
    return call(L)


@jax.custom_jvp
def cholesky_inverse(L):
    """`(L L^T)^{-1}` for a lower-triangular `L` `(..., n, n)` (the upper triangle is ignored)."""
    if L.shape[-1] == 0 or not HAVE_NATIVE_INVERSE:
        return _generic(L)
    return jax.lax.platform_dependent(L, cpu=_native, default=_generic)


@cholesky_inverse.defjvp
def _cholesky_inverse_jvp(primals, tangents):
    (L,), (dL,) = primals, tangents
    L = jnp.tril(L)
    dL = jnp.tril(dL)
    Kinv = cholesky_inverse(L)
    dK = dL @ jnp.swapaxes(L, -1, -2)
    dK = dK + jnp.swapaxes(dK, -1, -2)
    return Kinv, -(Kinv @ dK @ Kinv)
