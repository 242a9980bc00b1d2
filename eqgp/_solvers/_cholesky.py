import equinox as eqx
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array, Float

from .._covariance import Covariance
from .._linalg import cholesky_inverse
from ._abstract import AbstractSolver

NOT_PD = (
    "eqgp: the Cholesky factorisation of the observation covariance failed (the matrix is "
    "not numerically positive definite, or holds NaN/inf). Raise the jitter "
    "(`eqgp.Cholesky(jitter=1e-6)`), raise the noise, check for duplicate points observed "
    "with (near) zero noise, and check the data and hyper-parameters for NaN/inf."
)


def cholesky(A: Array, jitter: float) -> Array:
    """The lower Cholesky factor of `A + jitter * mean(diag A) * I`, or an `eqx.error_if` error."""
    n = A.shape[0]
    if n == 0:
        return A
    if jitter:
        A = A + (jitter * jnp.mean(jnp.diagonal(A))) * jnp.eye(n, dtype=A.dtype)
    L = jnp.linalg.cholesky(A)
    return eqx.error_if(L, ~jnp.all(jnp.isfinite(L)), NOT_PD)


class Cholesky(AbstractSolver):
    """Dense Cholesky of `cov.as_matrix()`, with `jitter` (times the mean of the diagonal)
    added to the diagonal: exact, memory `R^2`, time `R^3 / 3`.

    A failed factorisation raises an `eqx.error_if` error, also under `jit`, that says what
    to do; it never turns into a silent NaN loss.
    """

    jitter: float = eqx.field(static=True, default=0.0)

    def init(self, cov: Covariance, key=None) -> Float[Array, "R R"]:
        return cholesky(cov.as_matrix(), self.jitter)

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
