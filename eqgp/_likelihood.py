"""The Gaussian log marginal likelihood of a covariance and a residual, by a solver."""

from jaxtyping import Array, Float, PRNGKeyArray

from ._covariance import Covariance
from ._solvers import AbstractSolver


def log_marginal_likelihood(
    cov: Covariance, residual: Float[Array, " R"], solver: AbstractSolver, key: PRNGKeyArray | None = None
) -> Float[Array, ""]:
    """`log N(residual | 0, K)` for the covariance `cov`, by `solver`.

    The solver owns the algebra and the derivative: `Cholesky` and `ConjugateGradient` never
    differentiate through their factorisation or iterations (the derivative with respect to
    `K`, `(alpha alpha^T - K^{-1}) / 2`, exact or a stochastic trace estimate, goes to
    `Covariance.pullback`); `StructuredGradients` is differentiated through its closed form.

    **Arguments:**

    - `cov`: the `eqgp.Covariance` of the observations (noise included), size `R`.
    - `residual`: targets minus the prior mean, shape `(R,)`, in `cov`'s order.
    - `solver`: an `eqgp.AbstractSolver` (`eqgp.Cholesky()`, `eqgp.ConjugateGradient()`, ...).
    - `key`: probes of a stochastic solver (`None`: a fixed key).

    **Returns:** a scalar. `GaussianProcess.log_marginal_likelihood(obs)` builds the arguments.
    """
    if not isinstance(cov, Covariance):
        raise TypeError(f"`cov` must be an eqgp.Covariance; got {type(cov).__name__}.")
    if not isinstance(solver, AbstractSolver):
        raise TypeError(f"`solver` must be an eqgp solver instance such as eqgp.Cholesky(); got {solver!r:.80}.")
    if getattr(residual, "shape", None) != (cov.size,):
        raise ValueError(
            f"`residual` must have shape ({cov.size},) (one entry per row of `cov`); "
            f"got {getattr(residual, 'shape', type(residual).__name__)}."
        )
    return solver.log_marginal_likelihood(cov, residual, key)
