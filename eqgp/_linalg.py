"""Dense linear algebra shared by the solvers and the posterior: a Cholesky factorisation
with retries and its one failure message, and `cholesky_inverse(L) = (L L^T)^{-1}` (LAPACK
?potri through the native extension on CPU, a third of the flops of two triangular solves
with the identity; two triangular solves elsewhere; differentiable to any order)."""

import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
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

# Up to this size (bytes) a matrix `cholesky` is given as a function is built once and kept
# for the jitter retries; above it, built again there (memory over compile time).
_REBUILD_BYTES = 2**25

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


def _factor(A: Array) -> Array:
    # The lower triangle only (LAPACK's convention): `jnp.linalg.cholesky` first forms
    # `(A + A^T) / 2`, a second matrix; eqgp's covariances are symmetric by construction.
    return jax.lax.linalg.cholesky(A, symmetrize_input=False)


# Above this order the native factorisation works in tiles of `_TILE` (?potrf, ?trsm, ?syrk,
# ?gemm on tiles, as LAPACK's blocked algorithm): scipy's OpenBLAS 0.3.30, which jaxlib's and
# scipy's Cholesky call, segfaults in its threaded ?potrf/?syrk from order ~16 384 (2 threads;
# `jax.lax.linalg.cholesky` and `scipy.linalg.cho_factor` crash alike).
_TILED_ABOVE = 8192
_TILE = 1024


def _native_factor_t(A, after, tile=None):
    if tile is None:
        tile = _TILE if A.shape[-1] > _TILED_ABOVE else 0
    call = jax.ffi.ffi_call(
        "eqgp_cholesky_t",
        jax.ShapeDtypeStruct(A.shape, A.dtype),
        vmap_method="broadcast_all",
        input_output_aliases={0: 0},
    )
    return call(A, after, tile=np.int64(tile))


def _generic_factor_t(A, after):
    del after
    return jnp.swapaxes(_factor(A), -1, -2)


@jax.custom_jvp
def factor_t(A, after=None):
    """`L^T` for a symmetric `A = L L^T` (one triangle read; NaN throughout where `A` is not
    numerically positive definite). On CPU, LAPACK ?potrf overwrites `A` in place: `L^T`
    row-major is LAPACK's column-major `L`, so neither the matrix nor the factor is copied
    into another layout (`jax.lax.linalg.cholesky` asks XLA for a column-major operand, a
    second matrix). `after`: values computed from `A` (never read by the factorisation) that
    XLA must compute before `A` is overwritten; without it, a later read of `A` costs a copy."""
    after = jnp.zeros((0,), A.dtype) if after is None else after
    if A.shape[-1] == 0 or not HAVE_NATIVE_INVERSE:
        return _generic_factor_t(A, after)
    return jax.lax.platform_dependent(A, after, cpu=_native_factor_t, default=_generic_factor_t)


@factor_t.defjvp
def _factor_t_jvp(primals, tangents):
    # dL = L Phi(L^{-1} dA L^{-T}), Phi: the lower triangle with half its diagonal.
    (A, after), (dA, _) = primals, tangents
    Lt = factor_t(A, after)
    L = jnp.swapaxes(Lt, -1, -2)
    dA = 0.5 * (dA + jnp.swapaxes(dA, -1, -2))
    Y = jsl.solve_triangular(L, dA, lower=True)
    X = jsl.solve_triangular(L, jnp.swapaxes(Y, -1, -2), lower=True)
    phi = jnp.tril(X) - 0.5 * jnp.eye(X.shape[-1], dtype=X.dtype) * X
    return Lt, jnp.swapaxes(L @ phi, -1, -2)


def cholesky(
    A: Array | Callable[[], Array],
    jitter: float,
    max_tries: int = 0,
    message: str = NOT_PD,
    scale=None,
    indefinite: str | None = None,
    transposed: bool = False,
    principal: np.ndarray | None = None,
    deferred: bool = False,
):
    """The lower Cholesky factor of `A + j * scale * I` with `j = jitter` and `scale` by default
    `mean(diag A)` (or a function of `diag A`); or, with
    `max_tries > 0` and where that fails, with `j` growing tenfold per try (from `jitter`, or
    1e-6 / 1e-8 for float32 / float64), as GPyTorch's `psd_safe_cholesky`. The jitter a retry
    needed is reported by a warning (also under `jit`). Failure: an `eqx.error_if` error, with
    the `indefinite` message (if given) where `A` has an eigenvalue below `-100 sqrt(eps)
    scale` (computed only after a failure), else `message`.

    Only one triangle of `A` is read. `A` may be a function that builds the matrix: above
    32 MiB (`_REBUILD_BYTES`) it is then called again where a retry needs the matrix a second time, so that the
    factorisation can overwrite the only copy of it (one covariance-sized buffer instead of
    two). `transposed=True` returns `L^T`, which is LAPACK's
    column-major `L` read row-major: no copy on CPU. `principal` (row indices; by default all)
    picks the principal submatrix whose eigenvalues tell an indefinite matrix from an
    ill-conditioned one after a failure: its lowest eigenvalue bounds `A`'s from above, so a
    small one is taken before the factorisation overwrites `A`, never calls a positive
    definite matrix indefinite, and costs no second matrix.

    `deferred=True` returns `(L, check)`: `check` is a scalar 0 that carries the failure
    check, and the caller makes its results depend on it (adds it); a select over the whole
    factor instead makes XLA copy the factor once per reader."""
    build = A if callable(A) else (lambda: A)
    A = build()
    n = A.shape[0]
    if max_tries and n * n * A.dtype.itemsize <= _REBUILD_BYTES:
        # Retries need all of A again: up to this size keep it (XLA copies it before the
        # factorisation) rather than compile its construction twice more.
        build = lambda: A  # noqa: E731
    probe = None
    if indefinite is not None:
        if principal is None or len(principal) >= n:
            probe = A
        else:  # read before the factorisation overwrites A (`factor_t`'s `after`)
            probe = A[np.ix_(principal, principal)]
    if n == 0:
        return (A, jnp.zeros((), A.dtype)) if deferred else A
    diagonal = jnp.diagonal(A)  # read before the factorisation (`after`): no copy of A
    if scale is None:
        scale = jnp.mean(diagonal)
    scale = scale(diagonal) if callable(scale) else jnp.asarray(scale, A.dtype)
    after = diagonal if probe is None or probe is A else jnp.concatenate([diagonal, probe.reshape(-1)])
    eye = jnp.eye(n, dtype=A.dtype)

    def chol(A, after=None):
        return factor_t(A, after) if transposed else _factor(A)

    def factor(A, j, after=None):
        return chol(A + (j * scale) * eye, after) if jitter or max_tries else chol(A, after)

    def failed(L):
        # A failed factorisation is NaN throughout; a NaN or inf anywhere in the triangle
        # of A that is read reaches a later pivot, so the diagonal tells.
        return ~jnp.all(jnp.isfinite(jnp.diagonal(L)))

    L = factor(A, jnp.asarray(jitter, A.dtype), after)
    if max_tries:
        first = jitter if jitter else _FIRST_JITTER.get(jnp.dtype(A.dtype), 1e-6)

        def cond(c):
            return ~c[2] & (c[1] < max_tries)

        def body(c):
            j, t, _ = c
            j = jnp.where(t == 0, jnp.asarray(first, A.dtype), 10 * j) if jitter == 0 else 10 * j
            A0 = jax.lax.stop_gradient(build())
            return j, t + 1, ~failed(chol(A0 + (j * jax.lax.stop_gradient(scale)) * eye))

        def retry(L):
            # The search runs without derivatives (a while loop has no reverse mode) and
            # carries only whether a jitter worked; the factor it found is then recomputed
            # differentiably with the jitter it needed.
            used, tries, _ = jax.lax.while_loop(cond, body, (jnp.asarray(jitter, A.dtype), 0, jnp.asarray(False)))
            return factor(build(), used), used, tries

        def first_worked(L):
            return L, jnp.asarray(jitter, A.dtype), 0

        # Only a failed first factorisation enters the retries (and builds the matrix again).
        L, used, tries = jax.lax.cond(failed(L), retry, first_worked, L)
        jax.debug.callback(_report, used, tries > 0, ~failed(L))
    bad = failed(L)
    flag = bad
    if indefinite is not None:
        # Why it failed: indefinite beyond jitter's reach, or merely ill-conditioned. The
        # eigenvalues are computed on the failure branch only (both run under a batching vmap).
        tol = -100 * jnp.sqrt(jnp.finfo(A.dtype).eps) * jax.lax.stop_gradient(scale)
        lowest = jax.lax.cond(
            bad,
            lambda: jnp.linalg.eigvalsh(jax.lax.stop_gradient(probe))[0],
            lambda: jnp.zeros((), A.dtype),
        )
        flag = eqx.error_if(flag, bad & (lowest < tol), indefinite)
    # The check runs on the flag, not on the matrix (an error check passes its operand
    # through a conditional, where XLA copies a matrix, often into another layout). The
    # factor depends on the checked flag through a select (a failed factor is NaN
    # throughout already), so the check is never dropped as dead code.
    flag = eqx.error_if(flag, bad, message)
    if deferred:
        return L, jnp.where(flag, jnp.nan, jnp.zeros((), L.dtype))
    return jnp.where(flag, jnp.nan, L)


def _generic(L):
    eye = jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape)
    A = jsl.cho_solve((L, True), eye)
    # Exactly symmetric, as potri's result is (the solves' rounding is not, e.g. on GPU).
    return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def _native(L, after, transposed=False, factor=False):
    # The inverse overwrites the factor where XLA can alias it (a factor that is dead
    # afterwards, as in the likelihood's backward pass); otherwise XLA copies it first.
    # `after` (never read) orders other readers of the factor before the overwrite.
    call = jax.ffi.ffi_call(
        "eqgp_cholesky_inverse",
        jax.ShapeDtypeStruct(L.shape, L.dtype),
        vmap_method="broadcast_all",
        input_output_aliases={0: 0},
    )
    return call(L, after, transposed=transposed, factor=factor)


def _inverse_jvp(Kinv, L, dL):
    # d(L L^T)^{-1} = -K^{-1} (dL L^T + L dL^T) K^{-1}, with L and dL lower triangular.
    dK = jnp.tril(dL) @ jnp.swapaxes(jnp.tril(L), -1, -2)
    dK = dK + jnp.swapaxes(dK, -1, -2)
    return Kinv, -(Kinv @ dK @ Kinv)


@jax.custom_jvp
def cholesky_inverse(L):
    """`(L L^T)^{-1}` for a lower-triangular `L` `(..., n, n)` (the upper triangle is ignored)."""
    if L.shape[-1] == 0 or not HAVE_NATIVE_INVERSE:
        return _generic(L)
    return jax.lax.platform_dependent(L, cpu=lambda L: _native(L, jnp.zeros((0,), L.dtype)), default=_generic)


@cholesky_inverse.defjvp
def _cholesky_inverse_jvp(primals, tangents):
    (L,), (dL,) = primals, tangents
    return _inverse_jvp(cholesky_inverse(L), L, dL)


@jax.custom_jvp
def cholesky_inverse_t(Lt, after=None):
    """`(L L^T)^{-1}` from `L^T` `(..., n, n)` (upper triangular; the lower triangle is
    ignored): the factor as `Cholesky` holds it, read by LAPACK without a layout copy. On
    CPU the inverse overwrites a factor that is dead afterwards; `after`: values computed
    from `Lt` (never read here, e.g. solves with it) that XLA must compute first, so that
    reading them does not keep the factor alive (a copy of it)."""
    after = jnp.zeros((0,), Lt.dtype) if after is None else after
    if Lt.shape[-1] == 0 or not HAVE_NATIVE_INVERSE:
        return _generic(jnp.swapaxes(Lt, -1, -2))
    return jax.lax.platform_dependent(
        Lt,
        after,
        cpu=lambda Lt, after: _native(Lt, after, transposed=True),
        default=lambda Lt, after: _generic(jnp.swapaxes(Lt, -1, -2)),
    )


@cholesky_inverse_t.defjvp
def _cholesky_inverse_t_jvp(primals, tangents):
    (Lt, after), (dLt, _) = primals, tangents
    Kinv = cholesky_inverse_t(Lt, after)
    return _inverse_jvp(Kinv, jnp.swapaxes(Lt, -1, -2), jnp.swapaxes(dLt, -1, -2))


@jax.custom_jvp
def factor_inverse_t(Lt, after=None):
    """`L^{-T}` (upper triangular; `K^{-1} = M M^T` with `M = L^{-T}`) from `L^T` as
    `Cholesky` holds it: LAPACK's ?trtri on CPU, half of ?potri's flops, overwriting a factor
    that is dead afterwards (`after` as in `cholesky_inverse_t`). The diagonal blocks of
    `K^{-1}` (the closed-form leave-one-out's) are then row blocks of `M` times their
    transposes, without forming `K^{-1}`."""
    after = jnp.zeros((0,), Lt.dtype) if after is None else after

    def generic(Lt, after):
        del after
        eye = jnp.broadcast_to(jnp.eye(Lt.shape[-1], dtype=Lt.dtype), Lt.shape)
        return jsl.solve_triangular(Lt, eye, lower=False)

    if Lt.shape[-1] == 0 or not HAVE_NATIVE_INVERSE:
        return generic(Lt, after)
    return jax.lax.platform_dependent(
        Lt, after, cpu=lambda Lt, after: _native(Lt, after, transposed=True, factor=True), default=generic
    )


@factor_inverse_t.defjvp
def _factor_inverse_t_jvp(primals, tangents):
    # M = (L^T)^{-1}: dM = -M d(L^T) M, with d(L^T) upper triangular.
    (Lt, after), (dLt, _) = primals, tangents
    M = factor_inverse_t(Lt, after)
    return M, -(M @ jnp.triu(dLt) @ M)
