import abc
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._covariance import Covariance


class AbstractSolver(eqx.Module):
    """Linear algebra for the observation covariance: pure configuration.

    `init(cov, key)` prepares a state once (a factorisation, or a preconditioner and probe
    vectors); the other methods use it. Everything the likelihood and the posterior need
    goes through these methods, so a dense and a matrix-free solver are interchangeable in
    `GaussianProcess(..., solver=...)`.

    A solver whose `init`, `solve` and `logdet` are plain differentiable JAX code (a
    structured closed form) sets `differentiable = True`: the likelihood is then
    differentiated straight through it instead of by the shared backward rule.
    """

    differentiable: ClassVar[bool] = False

    @abc.abstractmethod
    def init(self, cov: Covariance, key: PRNGKeyArray | None = None):
        """Prepare the state for `cov` (`eqgp.Covariance`, `R x R`); `key` seeds any probe vectors."""

    def for_prediction(self, state):
        """The state a `Posterior` keeps: `state`, or one extended with caches that make
        predictions cheaper (e.g. a Lanczos cache for variances). Called once per `condition`."""
        return state

    @abc.abstractmethod
    def solve(self, state, B: Float[Array, "R ..."]) -> Float[Array, "R ..."]:
        """`K^{-1} B`."""

    @abc.abstractmethod
    def logdet(self, state) -> Float[Array, ""]:
        """`log det K` (exact, or a stochastic estimate)."""

    @abc.abstractmethod
    def likelihood_pieces(self, state, alpha: Float[Array, " R"]) -> tuple[Array, Array | None, Array | None]:
        """`(U, V, d)` with `U V^T + diag(d)` equal to (or an unbiased estimate of) the log
        marginal likelihood's derivative with respect to `K`, `(alpha alpha^T - K^{-1}) / 2`,
        where `alpha = K^{-1} r`. `V=None` means the identity (`U` is the dense cotangent);
        `d=None` means no diagonal term."""

    def inv_quad(self, state, B: Float[Array, "R k"], diagonal: bool) -> Array:
        """`B^T K^{-1} B` `(k, k)`, or only its diagonal `(k,)` with `diagonal=True`; by
        default from `solve` (a solver with a cheaper form overrides it)."""
        S = self.solve(state, B)
        if diagonal:
            return jnp.sum(B * S, axis=0)
        Q = B.T @ S
        return 0.5 * (Q + Q.T)
