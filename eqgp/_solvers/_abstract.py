import abc
import math
from typing import ClassVar, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._covariance import Covariance
from .._jit import full_precision
from .._linalg import cholesky


class AbstractSolverState(eqx.Module):
    """What a solver prepared for one covariance (a factor, a preconditioner, ...): built by
    `AbstractSolver.init`, read only by that solver's methods."""


_State = TypeVar("_State", bound=AbstractSolverState)


class AbstractSolver(eqx.Module, Generic[_State]):
    """Linear algebra for the observation covariance: pure configuration.

    `init(cov, key)` prepares a typed state once (a factorisation, or a preconditioner and
    probe vectors); every other method takes that state. The solver owns all the algebra the
    likelihood and the posterior need: solves, the log-determinant, the likelihood and its
    derivative, the posterior's caches and conditioning on more observations. So a dense and
    a matrix-free solver are interchangeable in `GaussianProcess(..., solver=...)`, and the
    model never asks which solver it holds.
    """

    @abc.abstractmethod
    def init(self, cov: Covariance, key: PRNGKeyArray | None = None) -> _State:
        """Prepare the state for `cov` (`eqgp.Covariance`, `R x R`); `key` seeds any probe vectors."""

    @abc.abstractmethod
    def solve(self, state: _State, B: Float[Array, "R ..."]) -> Float[Array, "R ..."]:
        """`K^{-1} B`."""

    @abc.abstractmethod
    def logdet(self, state: _State) -> Float[Array, ""]:
        """`log det K` (exact, or a stochastic estimate)."""

    @abc.abstractmethod
    def log_marginal_likelihood(
        self, cov: Covariance, residual: Float[Array, " R"], key: PRNGKeyArray | None = None, profile: bool = False
    ) -> Float[Array, ""]:
        """`log N(residual | 0, K)`, differentiable with respect to everything in `cov` and
        `residual`; with `profile=True`, `max_s log N(residual | 0, s K)` (the scale of the
        whole covariance profiled out: `s = r^T K^{-1} r / R`)."""

    @abc.abstractmethod
    def for_prediction(self, state: _State) -> _State:
        """The state a `Posterior` keeps: `state`, or one extended with caches that make
        predictions cheaper (e.g. a Lanczos cache for variances). Called once per `condition`."""

    def for_training(self) -> "AbstractSolver":
        """The solver `eqgp.fit_hyperparameters` trains (and returns its model) with: this one,
        or one that survives the line search's trial points (`Cholesky`: jitter retries)."""
        return self

    # Whether `init`'s state holds the dense factor `dense_factor_t` would compute (read by
    # `held_factor_t`): the closed-form leave-one-out then reuses `condition`'s work.
    holds_dense_factor: ClassVar[bool] = False

    def held_factor_t(self, state: _State) -> tuple[Float[Array, "R R"], Float[Array, ""]]:
        """`(L^T, check)` as `dense_factor_t` returns them, read from `state` (only where
        `holds_dense_factor`)."""
        raise NotImplementedError(f"{type(self).__name__} holds no dense factor.")

    def dense_factor_t(self, cov: Covariance, message: str) -> tuple[Float[Array, "R R"], Float[Array, ""]]:
        """`(L^T, check)`: the Cholesky factor of `cov.as_matrix()` transposed (LAPACK's
        column-major `L`, no layout copy on CPU), regularised as this solver regularises its
        own work (by default not at all; `message` on failure), and a scalar 0 (NaN after a
        failure) that results computed from it must add. For the closed-form leave-one-out,
        which needs `K^{-1}` densely whatever the solver."""
        return cholesky(cov.as_matrix, 0.0, message=message, transposed=True, deferred=True)

    @abc.abstractmethod
    def inv_quad(self, state: _State, B: Float[Array, "R k"], diagonal: bool) -> Array:
        """`B^T K^{-1} B` `(k, k)`, or only its diagonal `(k,)` with `diagonal=True`."""

    @abc.abstractmethod
    def extend(
        self,
        state: _State,
        alpha: Float[Array, " R1"],
        cov: Covariance,
        residual: Float[Array, " R"],
        key: PRNGKeyArray | None = None,
    ) -> tuple[_State, Float[Array, " R"]]:
        """Condition on more observations: `state` and `alpha = K1^{-1} r1` are this solver's
        work for the first `R1` rows of `cov` (whose groups start with the old ones); returns
        the state for all of `cov` and `K^{-1} residual`, reusing the old work where the
        solver can."""


def inv_quad_by_solves(solver: AbstractSolver, state, B: Array, diagonal: bool) -> Array:
    """`B^T K^{-1} B` (or its diagonal) from one solve per column of `B`."""
    S = solver.solve(state, B)
    if diagonal:
        return jnp.sum(B * S, axis=0)
    Q = B.T @ S
    return 0.5 * (Q + Q.T)


def _value(solver: AbstractSolver, cov: Covariance, r: Array, key, profile: bool = False) -> tuple[Array, tuple]:
    state = solver.init(cov, key)
    alpha = solver.solve(state, r)
    R = r.shape[0]
    quad = r @ alpha
    if profile and R:
        # max over s of log N(r | 0, s K): s = quad / R.
        value = -0.5 * (R * jnp.log(quad / R) + solver.logdet(state) + R * (1 + math.log(2 * math.pi)))
    else:
        value = -0.5 * (quad + solver.logdet(state) + R * math.log(2 * math.pi))
    return value, (state, alpha)


def log_marginal_likelihood_by_autodiff(
    solver: AbstractSolver, cov: Covariance, r: Array, key, profile: bool = False
) -> Array:
    """The log marginal likelihood, differentiated straight through the solver's algebra (for
    a solver whose `init`, `solve` and `logdet` are plain differentiable JAX code)."""
    return _value(solver, cov, r, key, profile)[0]


class AbstractPullbackSolver(AbstractSolver[_State]):
    """A solver whose likelihood derivative never goes through its own algebra: it hands the
    derivative with respect to `K`, `(alpha alpha^T - K^{-1}) / 2`, to the covariance's
    pullback (`likelihood_cotangent`), and one custom VJP, written once here, does the rest
    (the derivative with respect to the residual is `-alpha`)."""

    @abc.abstractmethod
    def likelihood_cotangent(self, state: _State, alpha: Float[Array, " R"], cov: Covariance) -> Covariance:
        """The gradient of the log marginal likelihood with respect to every inexact array of
        `cov`: `cov.pullback` of `(alpha alpha^T - K^{-1}) / 2` (exact, or an unbiased
        estimate), where `alpha = K^{-1} r`."""

    def log_marginal_likelihood(self, cov, residual, key=None, profile=False):
        return _loglik((cov, residual), self, key, bool(profile))


@eqx.filter_custom_vjp
def _loglik(diff, solver, key, profile):
    return _value(solver, *diff, key, profile)[0]


@_loglik.def_fwd
@full_precision
def _loglik_fwd(perturbed, diff, solver, key, profile):
    return _value(solver, *diff, key, profile)


@_loglik.def_bwd
@full_precision
def _loglik_bwd(residuals, g, perturbed, diff, solver, key, profile):
    state, alpha = residuals
    R = alpha.shape[0]
    dr = alpha
    if profile and R:
        # The profile's derivative is the likelihood's at the optimal scale s = r^T alpha / R
        # (envelope theorem): d/dK = (alpha alpha^T / s - K^{-1}) / 2, d/dr = -alpha / s.
        s = jnp.dot(diff[1], alpha) / R
        alpha, dr = alpha * jax.lax.rsqrt(s), alpha / s
    cov_ct = solver.likelihood_cotangent(state, alpha, diff[0])
    # g is in the data's dtype; a hyper-parameter may be stored in another (float64).
    return jax.tree.map(lambda x: g.astype(x.dtype) * x, cov_ct), -g * dr
