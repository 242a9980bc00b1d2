import functools
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._checks import as_points
from ._gram import _symmetric_gram, operator_diag, operator_gram
from ._jit import jit
from ._kernels import AbstractKernel, _positive
from ._observations import ObservationGroup, Observations
from ._operators import AbstractOperator, Value
from ._solvers import AbstractSolver, Cholesky


class ZeroMean(eqx.Module):
    """The zero mean function."""

    def __call__(self, x: Float[Array | np.ndarray, " D"]) -> Float[Array, ""]:
        return jnp.zeros((), x.dtype)


class ConstantMean(eqx.Module):
    """A constant (trainable) mean `c`; its derivatives are zero."""

    constant: Float[Array | np.ndarray, ""]

    def __init__(self, constant: ArrayLike = 0.0):
        self.constant = jnp.asarray(constant, dtype=float)

    def __call__(self, x: Float[Array | np.ndarray, " D"]) -> Float[Array, ""]:
        return self.constant.astype(x.dtype)


def _group_mean(mean: Callable, g: ObservationGroup) -> Array:
    # The operator applied to the mean function: derivative observations get the mean's
    # derivatives automatically.
    out = eqx.filter_vmap(lambda x: g.operator.apply(mean, x), out_axes=1)(g.X)
    return out.reshape(-1)


def _group_noise(noise: Array, g: ObservationGroup) -> Array:
    P = g.targets.shape[1]
    total = jnp.broadcast_to(noise.astype(g.X.dtype), (P,)) + jnp.broadcast_to(g.noise, (P,))
    return jnp.repeat(total, g.X.shape[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gaussian_loglik(solver: AbstractSolver, K: Array, r: Array) -> Array:
    return _gaussian_loglik_fwd(solver, K, r)[0]


def _gaussian_loglik_fwd(solver, K, r):
    state = solver.init(K)
    alpha = solver.solve(state, r)
    value = -0.5 * (r @ alpha + solver.logdet(state) + r.shape[0] * math.log(2 * math.pi))
    return value, (state, alpha)


def _gaussian_loglik_bwd(solver, res, g):
    # d/dK = 1/2 (alpha alpha^T - K^{-1}), d/dr = -alpha: one inverse from the factor
    # instead of differentiating through the Cholesky.
    state, alpha = res
    Kinv = solver.inverse(state)
    dK = 0.5 * g * (jnp.outer(alpha, alpha) - Kinv)
    return dK, -g * alpha


_gaussian_loglik.defvjp(_gaussian_loglik_fwd, _gaussian_loglik_bwd)


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
        noise = self.noise
        G = len(obs.groups)
        if len(noise) == 1:
            return noise * G
        if len(noise) != G:
            raise ValueError(
                f"the model has {len(noise)} noise entries but the observations have {G} groups; "
                "give one noise entry per group or a single shared one."
            )
        return noise

    def _prior(self, obs: Observations, symmetric_pullback: bool = False):
        if not isinstance(obs, Observations):
            raise TypeError(f"`obs` must be an eqgp.Observations; got {type(obs).__name__}.")
        noise = self._noise_for(obs)
        for g, n in zip(obs.groups, noise):
            if n.shape not in ((), (g.targets.shape[1],)):
                raise ValueError(
                    f"a noise entry of shape {n.shape} does not fit {type(g.operator).__name__} "
                    f"with {g.targets.shape[1]} outputs; use a scalar or shape ({g.targets.shape[1]},)."
                )
        if symmetric_pullback:
            K = _symmetric_gram((self.kernel, tuple((g.operator, g.X) for g in obs.groups)))
        else:
            K = operator_gram(self.kernel, obs, obs)
        diag = jnp.concatenate([_group_noise(n, g) for g, n in zip(obs.groups, noise)])
        K = K + jnp.diag(diag)
        m = jnp.concatenate([_group_mean(self.mean, g) for g in obs.groups])
        y = obs.flat_targets()
        y = eqx.error_if(y, ~jnp.all(jnp.isfinite(y)), "eqgp: the observation targets hold NaN or inf.")
        return K, y - m

    @jit
    def log_marginal_likelihood(self, obs: Observations) -> Float[Array, ""]:
        """The exact log marginal likelihood `log p(obs | model)`.

        Its gradient uses the closed form `1/2 tr((alpha alpha^T - K^{-1}) dK)` pulled back
        through the gram, not autodiff through the Cholesky factorisation.
        """
        K, r = self._prior(obs, symmetric_pullback=True)
        return _gaussian_loglik(self.solver, K, r)

    @jit
    def condition(self, obs: Observations) -> "Posterior":
        """The posterior given `obs`: predictive means, variances, covariances and samples
        of any operator (values, gradients, ...) of the latent function at new points."""
        K, r = self._prior(obs)
        state = self.solver.init(K)
        return Posterior(self, obs, state, self.solver.solve(state, r))


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
    state: Array
    alpha: Float[Array | np.ndarray, " R"]

    def _cross(self, X, operator):
        if not isinstance(operator, AbstractOperator):
            raise TypeError(f"`operator` must be an eqgp operator; got {operator!r:.80}.")
        X = as_points("X", X, self.obs.dim)
        if X.dtype != self.alpha.dtype:
            raise TypeError(f"`X` must have dtype {self.alpha.dtype}; got {X.dtype}.")
        return X, operator.size(X.shape[1]), operator_gram(self.gp.kernel, (operator, X), self.obs)

    def _whitened(self, X, operator):
        # L^{-1} K(obs, X): its column norms are the variance reduction at X.
        X, P, Ks = self._cross(X, operator)
        return X, P, self.gp.solver.solve_lower(self.state, Ks.T)

    def _noise(self, noise_group, N):
        if noise_group is None:
            return 0.0
        g = self.obs.groups[noise_group]
        return _group_noise(self.gp._noise_for(self.obs)[noise_group], g)[:: g.X.shape[0]].repeat(N)

    @jit
    def mean(self, X: Float[Array | np.ndarray, "N D"], operator: AbstractOperator = Value()) -> Array:
        """Predictive mean of `operator` of the latent function at `X`."""
        X, P, Ks = self._cross(X, operator)
        m = eqx.filter_vmap(lambda x: operator.apply(self.gp.mean, x), out_axes=1)(X).reshape(-1)
        return _unflatten(m + Ks @ self.alpha, X.shape[0], P)

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
        X, P, V = self._whitened(X, operator)
        var = operator_diag(self.gp.kernel, operator, X) - jnp.sum(V * V, axis=0)
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
        X, _, V = self._whitened(X, operator)
        cov = operator_gram(self.gp.kernel, (operator, X), (operator, X)) - V.T @ V
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
