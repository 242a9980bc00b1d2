import abc

import equinox as eqx
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array, Float

from ._linalg import cholesky_inverse

_NOT_PD = (
    "eqgp: the Cholesky factorisation of the observation covariance failed (the matrix is "
    "not numerically positive definite, or holds NaN/inf). Raise the jitter "
    "(`eqgp.Cholesky(jitter=1e-6)`), raise the noise, check for duplicate points observed "
    "with (near) zero noise, and check the data and hyper-parameters for NaN/inf."
)


class AbstractSolver(eqx.Module):
    """Linear algebra for a symmetric positive-definite matrix: pure configuration.

    `init(A)` factorises once; `solve(state, B)` and `logdet(state)` use the factor.
    """

    @abc.abstractmethod
    def init(self, A: Float[Array, "n n"]):
        """Factorise `A`; returns the state used by `solve`, `solve_lower` and `logdet`."""

    @abc.abstractmethod
    def solve(self, state, B: Float[Array, "n ..."]) -> Float[Array, "n ..."]:
        """`A^{-1} B`."""

    @abc.abstractmethod
    def solve_lower(self, state, B: Float[Array, "n ..."]) -> Float[Array, "n ..."]:
        """`L^{-1} B` for a square root `A = L L^T`, so `(L^{-1} B)^T (L^{-1} B) = B^T A^{-1} B`."""

    @abc.abstractmethod
    def logdet(self, state) -> Float[Array, ""]:
        """`log det A`."""

    def inverse(self, state) -> Float[Array, "n n"]:
        """`A^{-1}` (the likelihood's backward pass needs it); by default `solve(state, I)`."""
        n = state.shape[0]
        return self.solve(state, jnp.eye(n, dtype=state.dtype))


class Cholesky(AbstractSolver):
    """Dense Cholesky with `jitter` (times the mean of the diagonal) added to the diagonal.

    A failed factorisation raises an `eqx.error_if` error, also under `jit`, that says what
    to do; it never turns into a silent NaN loss.
    """

    jitter: float = eqx.field(static=True, default=0.0)

    def init(self, A: Float[Array, "n n"]) -> Float[Array, "n n"]:
        n = A.shape[0]
        if n == 0:
            return A
        if self.jitter:
            scale = jnp.mean(jnp.diagonal(A))
            A = A + (self.jitter * scale) * jnp.eye(n, dtype=A.dtype)
        L = jnp.linalg.cholesky(A)
        return eqx.error_if(L, ~jnp.all(jnp.isfinite(L)), _NOT_PD)

    def solve(self, state, B):
        return jsl.cho_solve((state, True), B)

    def solve_lower(self, state, B):
        return jsl.solve_triangular(state, B, lower=True)

    def logdet(self, state):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(state)))

    def inverse(self, state):
        # LAPACK ?potri on CPU: a third of the flops of solve(state, I).
        return cholesky_inverse(state)
