from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from ._checks import as_points
from ._covariance import Covariance
from ._gram import operator_diag, operator_gram
from ._jit import jit
from ._kernels import AbstractKernel, _positive
from ._likelihood import log_marginal_likelihood
from ._observations import Observations
from ._operators import AbstractOperator, Value
from ._prior import ConstantMean, ZeroMean, group_mean, group_noise, noise_per_group, prior
from ._solvers import AbstractSolver, Cholesky


class GaussianProcess(eqx.Module):
    """An exact Gaussian process with observations of any linear operator (values,
    gradients, partial and directional derivatives, Hessians).

    A cheap Module: building it does no linear algebra. Train it with
    `eqx.filter_value_and_grad` and optax (or `eqgp.fit`); condition it with `condition`.
    """

    kernel: AbstractKernel
    mean: Callable
    raw_noise: tuple[Float[Array, "*P"], ...]
    solver: AbstractSolver

    def __init__(
        self,
        kernel: AbstractKernel,
        mean: Callable | float | None = None,
        noise=1e-2,
        solver: AbstractSolver | None = None,
    ):
        """**Arguments:**

        - `kernel`: an `eqgp.kernels.AbstractKernel`.
        - `mean`: `None` (zero), a number (a trainable constant) or any Module/callable
          mapping a point `(D,)` to a scalar.
        - `noise`: trainable noise variance(s): one positive scalar for every observation,
          or a sequence with one entry per observation group, each a scalar or one value
          per operator output (e.g. value noise, then each derivative's).
        - `solver`: linear algebra, default `eqgp.Cholesky()`.
        """
        if not isinstance(kernel, AbstractKernel):
            raise TypeError(f"`kernel` must be an eqgp kernel; got {type(kernel).__name__}.")
        if mean is None:
            mean = ZeroMean()
        elif isinstance(mean, (int, float, np.ndarray, np.generic, jax.Array)):
            mean = ConstantMean(mean)
        elif not callable(mean):
            raise TypeError(f"`mean` must be None, a number or a callable; got {mean!r:.80}.")
        self.kernel = kernel
        self.mean = mean
        if isinstance(noise, (list, tuple)):
            if not noise:
                raise ValueError("`noise` must not be an empty sequence.")
            self.raw_noise = tuple(_positive(f"noise[{i}]", n, vector=True) for i, n in enumerate(noise))
        else:
            self.raw_noise = (_positive("noise", noise, vector=True),)
        self.solver = Cholesky() if solver is None else solver

    @property
    def noise(self) -> tuple[Array, ...]:
        """The noise variances, one entry per observation group (or one shared entry)."""
        return tuple(jax.nn.softplus(r) for r in self.raw_noise)

    def _noise_for(self, obs: Observations) -> tuple[Array, ...]:
        return noise_per_group(self.noise, obs)

    @jit
    def log_marginal_likelihood(self, obs: Observations, key: PRNGKeyArray | None = None) -> Float[Array, ""]:
        """The log marginal likelihood `log p(obs | model)`: exact with `Cholesky`, a
        stochastic estimate with `ConjugateGradient` (whose probes `key` seeds).

        Its gradient never differentiates through the solver: the solver hands the
        derivative with respect to the covariance, `(alpha alpha^T - K^{-1}) / 2`, to the
        covariance operator's pullback.

        **Arguments:**

        - `obs`: an `eqgp.Observations`.
        - `key`: a `jax.random` key for stochastic solvers; `None` uses a fixed one.
        """
        cov, r = prior(self.kernel, self.mean, self.noise, obs)
        return log_marginal_likelihood(cov, r, self.solver, key)

    @jit
    def condition(self, obs: Observations, key: PRNGKeyArray | None = None) -> "Posterior":
        """The posterior given `obs`: predictive means, variances, covariances and samples
        of any operator (values, gradients, ...) of the latent function at new points.

        **Arguments:** `obs`, an `eqgp.Observations`; `key` as in `log_marginal_likelihood`."""
        cov, r = prior(self.kernel, self.mean, self.noise, obs)
        state = self.solver.init(cov, key)
        return Posterior(self, obs, cov, state, self.solver.solve(state, r))


def _unflatten(v: Array, N: int, P: int) -> Array:
    return v if P == 1 else v.reshape(P, N).T


class Posterior(eqx.Module):
    """A Gaussian process conditioned on observations (built by `GaussianProcess.condition`).

    Every method takes test points `X` `(N, D)` and an `operator` (default `eqgp.Value()`).
    Outputs have shape `(N,)` for one-output operators and `(N, P)` otherwise, except
    `covariance`, which is `(N P, N P)` in component-major order.
    """

    gp: GaussianProcess
    obs: Observations
    cov: Covariance
    state: object
    alpha: Float[Array | np.ndarray, " R"]

    def _points(self, X, operator):
        if not isinstance(operator, AbstractOperator):
            raise TypeError(f"`operator` must be an eqgp operator; got {operator!r:.80}.")
        X = as_points("X", X, self.obs.dim)
        if X.dtype != self.alpha.dtype:
            raise TypeError(f"`X` must have dtype {self.alpha.dtype}; got {X.dtype}.")
        return X, operator.size(X.shape[1])

    def _reduction(self, X, operator, diagonal: bool):
        # K(X, obs) K^{-1} K(obs, X), or its diagonal: the variance the observations explain.
        Ks = operator_gram(self.gp.kernel, (operator, X), self.obs)
        return self.gp.solver.inv_quad(self.state, Ks.T, diagonal)

    def _noise(self, noise_group, N):
        if noise_group is None:
            return 0.0
        g = self.obs.groups[noise_group]
        return group_noise(self.gp._noise_for(self.obs)[noise_group], g)[:: g.X.shape[0]].repeat(N)

    @jit
    def mean(self, X: Float[Array | np.ndarray, "N D"], operator: AbstractOperator = Value()) -> Array:
        """Predictive mean of `operator` of the latent function at `X`."""
        X, P = self._points(X, operator)
        m = group_mean(self.gp.mean, operator, X)
        return _unflatten(m + self.cov.cross_mv(operator, X, self.alpha), X.shape[0], P)

    @jit
    def variance(
        self,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        noise_group: int | None = None,
    ) -> Array:
        """Predictive variance of `operator` at `X`: of the latent function, or with
        `noise_group=g` of a new noisy observation like those of observation group `g`
        (whose operator should match `operator`)."""
        X, P = self._points(X, operator)
        var = operator_diag(self.gp.kernel, operator, X) - self._reduction(X, operator, diagonal=True)
        var = jnp.maximum(var, 0.0) + self._noise(noise_group, X.shape[0])
        return _unflatten(var, X.shape[0], P)

    @jit
    def covariance(
        self,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        noise_group: int | None = None,
    ) -> Array:
        """Full predictive covariance of `operator` at `X`, `(N P, N P)`, component-major."""
        X, _ = self._points(X, operator)
        cov = operator_gram(self.gp.kernel, (operator, X), (operator, X)) - self._reduction(X, operator, False)
        cov = 0.5 * (cov + cov.T)
        return cov + jnp.diag(jnp.broadcast_to(self._noise(noise_group, X.shape[0]), (cov.shape[0],)))

    @jit
    def sample(
        self,
        key: PRNGKeyArray,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        num_samples: int = 1,
        jitter: float = 1e-9,
    ) -> Array:
        """Joint samples of `operator` of the latent function at `X`:
        shape `(num_samples, N)` or `(num_samples, N, P)`."""
        mean = self.mean(X, operator)
        cov = self.covariance(X, operator)
        n = cov.shape[0]
        L = jnp.linalg.cholesky(
            cov + jitter * jnp.maximum(jnp.mean(jnp.diagonal(cov)), 1.0) * jnp.eye(n, dtype=cov.dtype)
        )
        L = eqx.error_if(
            L, ~jnp.all(jnp.isfinite(L)), "eqgp: the predictive covariance is not positive definite; raise `jitter`."
        )
        z = jax.random.normal(key, (num_samples, n), dtype=cov.dtype)
        flat = mean.T.reshape(-1) if mean.ndim == 2 else mean
        draws = flat[None] + z @ L.T
        N = X.shape[0]
        return draws if mean.ndim == 1 else draws.reshape(num_samples, -1, N).transpose(0, 2, 1)
