import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

from .._covariance import Covariance
from .._linalg import cholesky_inverse
from ._abstract import AbstractSolver


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


# Above this condition number a float32 factorisation keeps fewer than ~2 correct digits.
_FLOAT32_COND = 1e5


def _warn_float32(cond):
    if float(cond) > _FLOAT32_COND:
        warnings.warn(
            f"eqgp: the observation covariance has condition number >= {float(cond):.1e}, more than "
            "float32 can factorise accurately (gradient observations make covariances ill-conditioned). "
            "Enable float64 (`jax.config.update('jax_enable_x64', True)` and float64 data), or raise the "
            "noise (`noise_floor`).",
            RuntimeWarning,
            stacklevel=2,
        )


def cholesky(A: Array, jitter: float, max_tries: int = 0, message: str = NOT_PD, scale=None) -> Array:
    """The lower Cholesky factor of `A + j * scale * I` with `j = jitter` and `scale` by default
    `mean(diag A)`; or, with
    `max_tries > 0` and where that fails, with `j` growing tenfold per try (from `jitter`, or
    1e-6 / 1e-8 for float32 / float64), as GPyTorch's `psd_safe_cholesky`. The jitter a retry
    needed is reported by a warning (also under `jit`). Failure: an `eqx.error_if` error."""
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
    return eqx.error_if(L, failed(L), message)


class Cholesky(AbstractSolver):
    """Dense Cholesky of `cov.as_matrix()`, with `jitter` (times the mean of the kernel's
    diagonal, the noise excluded, so that huge known noise on padding rows does not inflate
    it) added to the diagonal: exact, memory `R^2`, time `R^3 / 3`.

    `max_tries > 0` makes it robust (opt-in, as GPyTorch's `psd_safe_cholesky`): where the
    factorisation fails it retries with tenfold jitter up to `max_tries` times and warns
    with the jitter it needed; this works under `jit`, `grad` and `vmap`.

    A failed factorisation raises an `eqx.error_if` error, also under `jit`, that says what
    to do; it never turns into a silent NaN loss.
    """

    jitter: float = eqx.field(static=True, default=0.0)
    max_tries: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if not (isinstance(self.jitter, (int, float)) and 0 <= self.jitter < np.inf):
            raise ValueError(f"`jitter` must be a finite number >= 0; got {self.jitter!r}.")
        if not isinstance(self.max_tries, int) or isinstance(self.max_tries, bool) or self.max_tries < 0:
            raise ValueError(f"`max_tries` must be an int >= 0; got {self.max_tries!r}.")

    def init(self, cov: Covariance, key=None) -> Float[Array, "R R"]:
        A = cov.as_matrix()
        scale = None  # an empty matrix needs none
        if A.shape[0]:
            diag = jnp.diagonal(A)
            kernel = jnp.mean(diag - cov.noise)
            scale = jnp.where(kernel > 0, kernel, jnp.mean(diag))
        L = cholesky(A, self.jitter, self.max_tries, scale=scale)
        if L.dtype == jnp.float32 and L.shape[0]:
            # (max L_ii / min L_ii)^2 is a lower bound of the condition number, free here.
            d = jnp.diagonal(L)
            jax.debug.callback(_warn_float32, (jnp.max(d) / jnp.min(d)) ** 2)
        return L

    def solve(self, state, B):
        return jsl.cho_solve((state, True), B)

    def logdet(self, state):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(state)))

    def likelihood_pieces(self, state, alpha):
        # K^{-1} by LAPACK ?potri on CPU: a third of the flops of solve(state, I).
        return 0.5 * (jnp.outer(alpha, alpha) - cholesky_inverse(state)), None, None

    def inv_quad(self, state, B, diagonal):
        W = jsl.solve_triangular(state, B, lower=True)
        return jnp.sum(W * W, axis=0) if diagonal else W.T @ W
