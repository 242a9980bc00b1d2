"""The Gaussian log marginal likelihood, with one backward rule for every solver."""

import math

import equinox as eqx
from jaxtyping import Array, Float, PRNGKeyArray

from ._covariance import Covariance
from ._jit import full_precision
from ._solvers import AbstractSolver


def log_marginal_likelihood(
    cov: Covariance, residual: Float[Array, " R"], solver: AbstractSolver, key: PRNGKeyArray | None = None
) -> Float[Array, ""]:
    """`log N(residual | 0, K)` for the covariance operator `cov`, by `solver`.

    Its gradient never differentiates through the solver: the derivative with respect to
    `K` is `(alpha alpha^T - K^{-1}) / 2`, which the solver hands over as rank-1 pieces
    (exact for `Cholesky`, a stochastic trace estimate for `ConjugateGradient`) and
    `Covariance.pullback` takes to the kernel, points and noise; the derivative with respect
    to the residual is `-alpha`.

    **Arguments:**

    - `cov`: the `eqgp.Covariance` of the observations (noise included), size `R`.
    - `residual`: targets minus the prior mean, shape `(R,)`, in `cov`'s order.
    - `solver`: an `eqgp.AbstractSolver` (`eqgp.Cholesky()`, `eqgp.ConjugateGradient()`).
    - `key`: probes of a stochastic solver (`None`: a fixed key).

    **Returns:** a scalar. `GaussianProcess.log_marginal_likelihood(obs)` builds the arguments.
    """
    if solver.differentiable:  # a structured closed form: autodiff through it
        return _forward((cov, residual), solver, key)[0]
    return _loglik((cov, residual), solver, key)


@eqx.filter_custom_vjp
def _loglik(diff, solver, key):
    return _forward(diff, solver, key)[0]


def _forward(diff, solver, key):
    cov, r = diff
    state = solver.init(cov, key)
    alpha = solver.solve(state, r)
    value = -0.5 * (r @ alpha + solver.logdet(state) + r.shape[0] * math.log(2 * math.pi))
    return value, (state, alpha)


@_loglik.def_fwd
@full_precision
def _loglik_fwd(perturbed, diff, solver, key):
    return _forward(diff, solver, key)


@_loglik.def_bwd
@full_precision
def _loglik_bwd(residuals, g, perturbed, diff, solver, key):
    state, alpha = residuals
    cov, _ = diff
    U, V, d = solver.likelihood_pieces(state, alpha)
    cov_ct = cov.pullback(g * U, V, None if d is None else g * d)
    return cov_ct, -g * alpha
