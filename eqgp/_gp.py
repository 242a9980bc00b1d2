import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from ._checks import as_key, as_points
from ._covariance import TILE_BYTES
from ._gram import _operator_diag, _operator_gram
from ._jit import jit
from ._kernels import AbstractKernel
from ._linalg import cholesky, factor_inverse_t, not_pd
from ._observations import Observations
from ._operators import AbstractOperator, Value
from ._parameters import inverse_softplus as positive_raw, positive
from ._prior import ConstantMean, ZeroMean, covariance, group_mean, group_noise, noise_per_group, prior
from ._solvers import AbstractSolver, AbstractSolverState, default_solver

# Default lower bounds of the noise variance per dtype (`GaussianProcess(noise_floor=...)`).
_NOISE_FLOOR = {jnp.dtype(jnp.float32): 1e-4, jnp.dtype(jnp.float64): 1e-10}


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
    noise_floor: float | None = eqx.field(static=True)

    def __init__(
        self,
        kernel: AbstractKernel,
        mean: Callable | float | Float[Array | np.ndarray, ""] | None = None,
        noise=1e-2,
        solver: AbstractSolver | None = None,
        noise_floor: float | None = None,
    ):
        """**Arguments:**

        - `kernel`: an `eqgp.kernels.AbstractKernel`.
        - `mean`: `None` (zero), a number (a trainable constant) or any Module/callable
          mapping a point `(D,)` to a scalar.
        - `noise`: trainable noise variance(s): one positive scalar for every observation,
          or a sequence with one entry per observation group, each a scalar or one value
          per operator output (e.g. value noise, then each derivative's).
        - `solver`: linear algebra, default `eqgp.Cholesky()`.
        - `noise_floor`: a lower bound added to every noise variance (the variance used is
          `noise + noise_floor`), so that training cannot drive the noise to where the
          factorisation fails. `None` picks it from the dtype: `1e-4` for float32 (as
          GPyTorch's `GreaterThan(1e-4)` noise constraint), `1e-10` for float64. Pass `0.0`
          for none.
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
            self.raw_noise = tuple(positive(f"noise[{i}]", n, per="operator output") for i, n in enumerate(noise))
        else:
            self.raw_noise = (positive("noise", noise, per="operator output"),)
        if solver is None:
            solver = default_solver()
        elif not isinstance(solver, AbstractSolver):
            hint = " (the class; call it: `eqgp.Cholesky()`)" if isinstance(solver, type) else ""
            raise TypeError(
                f"`solver` must be an eqgp solver instance such as eqgp.Cholesky() or "
                f"eqgp.ConjugateGradient(); got {solver!r:.80}{hint}."
            )
        self.solver = solver
        if noise_floor is not None and not (isinstance(noise_floor, (int, float)) and 0 <= noise_floor < math.inf):
            raise ValueError(f"`noise_floor` must be None or a finite number >= 0; got {noise_floor!r}.")
        self.noise_floor = None if noise_floor is None else float(noise_floor)

    @property
    def noise(self) -> tuple[Array, ...]:
        """The noise variances used, floor included: one entry per observation group (or
        one shared entry)."""
        return self._noise_in(None)

    def _noise_in(self, dtype) -> tuple[Array, ...]:
        """`softplus(raw) + floor` per entry, in `dtype` with its floor (None: each entry's own)."""
        out = []
        for r in self.raw_noise:
            d = r.dtype if dtype is None else dtype
            out.append(jax.nn.softplus(r).astype(d) + self._floor(d))
        return tuple(out)

    def _floor(self, dtype) -> float:
        if self.noise_floor is not None:
            return self.noise_floor
        return _NOISE_FLOOR.get(jnp.dtype(dtype), 0.0)

    def _noise_for(self, obs: Observations) -> tuple[Array, ...]:
        """The noise entries used with `obs`, in its dtype with that dtype's floor."""
        if not isinstance(obs, Observations):
            raise TypeError(f"`obs` must be an eqgp.Observations; got {type(obs).__name__}.")
        return noise_per_group(self._noise_in(obs.groups[0].X.dtype), obs)

    def _prior(self, obs: Observations):
        return prior(self.kernel, self.mean, self._noise_for(obs), obs)

    @jit
    def log_marginal_likelihood(
        self, obs: Observations, key: PRNGKeyArray | int | None = None, *, profile: bool = False
    ) -> Float[Array, ""]:
        """The log marginal likelihood `log p(obs | model)`: exact with `Cholesky`, a
        stochastic estimate with `ConjugateGradient` (whose probes `key` seeds).

        Its gradient never differentiates through a factorisation or an iteration: the
        solver hands the derivative with respect to the covariance, `(alpha alpha^T -
        K^{-1}) / 2`, to the covariance's pullback.

        **Arguments:**

        - `obs`: an `eqgp.Observations`.
        - `key`: a `jax.random` key for stochastic solvers; `None` uses a fixed one.
        - `profile`: the concentrated (profile) likelihood: the covariance's overall scale
          `s` (signal variance and noise together, the noise a fixed fraction of the signal)
          is set to its optimum `s = r^T K^{-1} r / R` in closed form, so only the other
          hyper-parameters (lengthscales, noise-to-signal ratio) matter, as in SMT's and
          DiceKriging's kriging. `with_profiled_scale(obs)` returns the model at that scale,
          whose plain likelihood equals this value. Known observation noise is scaled with
          the rest (use it with trainable noise only for the value to be exact).
        """
        key = as_key("key", key)
        if not isinstance(profile, bool):
            raise TypeError(f"`profile` must be a bool; got {profile!r}.")
        cov, r = self._prior(obs)
        return self.solver.log_marginal_likelihood(cov, r, key, profile)

    def with_profiled_scale(self, obs: Observations, key: PRNGKeyArray | int | None = None) -> "GaussianProcess":
        """This model with its signal variance and trainable noise multiplied by the scale
        that maximises the likelihood of `obs` (`s = r^T K^{-1} r / R`, see
        `log_marginal_likelihood(profile=True)`); the kernel's signal variance is found as
        in `eqgp.initialise` (a kernel without one raises a TypeError)."""
        # `condition` called as a user calls it (no `key` argument where there is none), so
        # conditioning the returned model reuses its compiled program.
        post = self.condition(obs) if key is None else self.condition(obs, key)
        return self._scaled_by_profile(obs, post.alpha)

    @jit
    def _scaled_by_profile(self, obs: Observations, alpha) -> "GaussianProcess":
        from ._hyperparameters import scale_signal  # noqa: PLC0415 - it imports GaussianProcess

        _, r = self._prior(obs)
        s = jnp.dot(r, alpha) / max(r.shape[0], 1)
        s = jnp.where(s > 0, s, 1.0)
        model = eqx.tree_at(lambda m: m.kernel, self, scale_signal(self.kernel, s))
        raw = []
        for entry in self.raw_noise:
            floor = self._floor(entry.dtype)
            scaled = (jax.nn.softplus(entry) + floor) * s.astype(entry.dtype) - floor
            tiny = jnp.finfo(entry.dtype).tiny
            raw.append(positive_raw(jnp.maximum(scaled, tiny)))
        return eqx.tree_at(lambda m: m.raw_noise, model, tuple(raw))

    @jit
    def leave_one_out(self, obs: Observations, *, combine_groups: bool = False) -> "LeaveOneOut":
        """Leave-one-out cross-validation in closed form (Rasmussen & Williams §5.4.2),
        leaving out one *point* at a time: its value and all its derivative rows together,
        as a block. From one factorisation of `K` (dense, `O(R^3)` and `R^2` memory):
        for a block `B` of rows, the held-out residual is `[K^{-1}]_BB^{-1} (K^{-1} r)_B`
        and its predictive covariance (noise included) `[K^{-1}]_BB^{-1}`.

        **Arguments:**

        - `obs`: an `eqgp.Observations`.
        - `combine_groups`: `False`: a block is one point of one group (a
          `ValueAndGradient` group leaves out a point's value and gradient together).
          `True`: point `i` of every group is one block (e.g. energies and forces given as two
          groups at the same configurations); every group must have the same number of points.

        **Returns:** an `eqgp.LeaveOneOut`: per block family `residual` `(N, P)` (target minus
        the held-out predictive mean) and `covariance` `(N, P, P)`.
        """
        return LeaveOneOut(tuple((residual, cov) for residual, cov, _, _ in self._leave_one_out(obs, combine_groups)))

    def _leave_one_out(self, obs: Observations, combine_groups: bool):
        """Per block family: the held-out residuals `(N, P)`, covariances `(N, P, P)`, the
        blocks of `alpha = K^{-1} r` `(N, P)` and the Cholesky factors of `[K^{-1}]_BB`."""
        if not isinstance(combine_groups, bool):
            raise TypeError(f"`combine_groups` must be a bool; got {combine_groups!r}.")
        cov, r = self._prior(obs)
        index = _loo_blocks(obs, combine_groups)
        if r.shape[0] == 0:
            empty = lambda i, *extra: jnp.zeros(i.shape + extra, r.dtype)  # noqa: E731
            return [(empty(i), empty(i, i.shape[-1]), empty(i), empty(i, i.shape[-1])) for i in index]
        # With the solver's jitter/retries where it has them. M = L^{-T} overwrites the
        # factor once the solve for alpha has read it (one R x R matrix at a time), and
        # K^{-1}'s diagonal blocks are M's row blocks times their transposes (?trtri: half
        # the flops of forming K^{-1} by ?potri).
        Lt, check = self.solver.dense_factor_t(cov, _LOO_NOT_PD)
        alpha = jax.scipy.linalg.cho_solve((Lt.T, True), r) + check
        return _leave_one_out_of_factor(Lt, check, alpha, index)

    @jit
    def leave_one_out_log_density(self, obs: Observations, *, combine_groups: bool = False) -> Float[Array, ""]:
        """The leave-one-out log predictive density, `sum_B log N(y_B | mu_{-B}, Sigma_B)`
        over the blocks of `leave_one_out` (each point's value and derivatives together):
        an objective to maximise instead of the likelihood (`eqgp.fit_hyperparameters(...,
        objective="loo")`), GPyTorch's `LeaveOneOutPseudoLikelihood` extended to derivative
        blocks. Differentiable; dense."""
        total = jnp.zeros((), obs.groups[0].X.dtype)
        for residual, _, a, C in self._leave_one_out(obs, combine_groups):
            # With Sigma_B = [K^{-1}]_BB^{-1} = (C C^T)^{-1} and residual = Sigma_B a:
            # residual^T Sigma_B^{-1} residual = a^T residual, log det Sigma_B = -2 sum log diag C.
            logdet = -2 * jnp.sum(jnp.log(jnp.diagonal(C, axis1=1, axis2=2)))
            total = total - 0.5 * (jnp.sum(a * residual) + logdet + residual.size * math.log(2 * math.pi))
        return total

    @jit
    def condition(self, obs: Observations, key: PRNGKeyArray | int | None = None) -> "Posterior":
        """The posterior given `obs`: predictive means, variances, covariances and samples
        of any operator (values, gradients, ...) of the latent function at new points.

        **Arguments:** `obs`, an `eqgp.Observations`; `key` as in `log_marginal_likelihood`."""
        key = as_key("key", key)
        cov, r = self._prior(obs)
        state = self.solver.init(cov, key)
        alpha = self.solver.solve(state, r)
        return Posterior(self, obs, self.solver.for_prediction(state), alpha)


def _leave_one_out_of_factor(Lt, check, alpha, index, inverse=None):
    """`GaussianProcess._leave_one_out`'s blocks from the transposed Cholesky factor `Lt` of
    `K`, its failure `check` and `alpha = K^{-1} r`. `Lt` is dead afterwards: `M = L^{-T}`
    overwrites it (in place where it is an intermediate, or an argument donated to an output
    of its shape: `inverse`, a list, receives `M`)."""
    M = factor_inverse_t(Lt, alpha)
    if inverse is not None:
        inverse.append(M)
    out = []
    for idx in index:
        C = jnp.linalg.cholesky(_inverse_blocks(M, idx) + check)  # (N, P, P)
        eye = jnp.eye(idx.shape[1], dtype=alpha.dtype)
        covariance = jax.vmap(lambda c, eye=eye: jax.scipy.linalg.cho_solve((c, True), eye))(C)
        a = alpha[idx]
        residual = jnp.einsum("npq,nq->np", covariance, a)
        out.append((residual, 0.5 * (covariance + jnp.swapaxes(covariance, 1, 2)), a, C))
    return out


def _inverse_blocks(M, idx):
    """`[K^{-1}]_BB = M_B M_B^T` `(N, P, P)` for the row blocks `idx` `(N, P)` of `M = L^{-T}`,
    a chunk of blocks at a time (their rows of `M` are never all gathered at once)."""
    N, P = idx.shape
    R = M.shape[0]
    c = int(max(1, min(N, 2**23 // max(1, P * R * M.dtype.itemsize))))
    n = -(-N // c)
    chunks = np.concatenate([idx, np.broadcast_to(idx[:1], (n * c - N, P))]).reshape(n, c, P)

    def one(rows):
        Mb = M[rows]  # (c, P, R)
        return jnp.einsum("cpr,cqr->cpq", Mb, Mb)

    out = one(chunks[0])[None] if n == 1 else jax.lax.map(one, jnp.asarray(chunks))
    return out.reshape(n * c, P, P)[:N]


# A tile of the posterior mean's product on CPU (bytes; see `Posterior.mean`).
_CPU_MEAN_TILE_BYTES = 2**18

_LOO_NOT_PD = not_pd("the observation covariance", "Raise the noise or use `noise_floor`.")


class LeaveOneOut(eqx.Module):
    """Closed-form leave-one-out results (`GaussianProcess.leave_one_out`): `blocks`, one
    `(residual (N, P), covariance (N, P, P))` pair per block family (per group, or one for
    `combine_groups=True`); outputs in the group's operator order (values first for
    `ValueAndGradient`, then each group's in turn when combined)."""

    blocks: tuple[tuple[Array, Array], ...]


def _loo_blocks(obs: Observations, combine: bool) -> list[np.ndarray]:
    """Row indices `(N, P)` of each block family, in the covariance's (component-major) order."""
    per_group, start = [], 0
    for g in obs.groups:
        N, P = g.targets.shape
        per_group.append(start + np.arange(P)[None, :] * N + np.arange(N)[:, None])
        start += N * P
    if not combine:
        return per_group
    sizes = {i.shape[0] for i in per_group}
    if len(sizes) != 1:
        raise ValueError(
            "`combine_groups=True` leaves out point i of every group together, so every group must have the "
            f"same number of points; got {[i.shape[0] for i in per_group]}."
        )
    return [np.concatenate(per_group, axis=1)]


_SAMPLE_TRIES = 6
_SAMPLE_NOT_PD = not_pd("the predictive covariance", "Raise `jitter` of `Posterior.sample`.")


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
    state: AbstractSolverState
    alpha: Float[Array | np.ndarray, " R"]

    def _points(self, X, operator):
        if not isinstance(operator, AbstractOperator):
            raise TypeError(f"`operator` must be an eqgp operator; got {operator!r:.80}.")
        X = as_points("X", X, self.obs.dim)
        if X.dtype != self.alpha.dtype:
            raise TypeError(f"`X` must have dtype {self.alpha.dtype}; got {X.dtype}.")
        return X, operator.size(X.shape[1])

    @staticmethod
    def _finite(out, X):
        # Checked on the (small) result, not on `X`: a check that everything downstream of `X`
        # depends on keeps XLA from reusing the cross-covariances' buffers (0.22 -> 0.32 R x R
        # matrices of temporaries for a mean and a variance at 600 rows).
        return eqx.error_if(out, ~jnp.all(jnp.isfinite(X)), "eqgp: the prediction points `X` hold NaN or inf.")

    def _reduction(self, X, operator, diagonal: bool):
        # K(X, obs) K^{-1} K(obs, X), or its diagonal: the variance the observations explain.
        Ks = _operator_gram(self.gp.kernel, [(operator, X)], [(g.operator, g.X) for g in self.obs.groups])
        return self.gp.solver.inv_quad(self.state, Ks.T, diagonal)

    def _noise(self, noise_group, N, operator):
        if noise_group is None:
            return 0.0
        G = len(self.obs.groups)
        if not isinstance(noise_group, (int, np.integer)) or isinstance(noise_group, bool) or not 0 <= noise_group < G:
            raise ValueError(
                f"`noise_group` must be None or the index of an observation group, 0 to {G - 1}; got {noise_group!r}."
            )
        g = self.obs.groups[noise_group]
        if g.targets.shape[1] != operator.size(g.X.shape[1]) or type(g.operator) is not type(operator):
            raise ValueError(
                f"`noise_group={noise_group}` is a group of {type(g.operator).__name__} observations "
                f"({g.targets.shape[1]} outputs per point), but the prediction is of {type(operator).__name__} "
                f"({operator.size(g.X.shape[1])} outputs): the noise of a new observation comes from a group "
                "with the same operator."
            )
        noise = self.gp._noise_for(self.obs)[noise_group]
        if g.noise.ndim == 2:  # known noise per target: a new observation has the model's noise only
            g = eqx.tree_at(lambda g: g.noise, g, jnp.zeros((), g.X.dtype))
        return group_noise(noise, g)[:: g.X.shape[0]].repeat(N)

    @jit
    def mean(self, X: Float[Array | np.ndarray, "N D"], operator: AbstractOperator = Value()) -> Array:
        """Predictive mean of `operator` of the latent function at `X`."""
        X, P = self._points(X, operator)
        m = group_mean(self.gp.mean, operator, X)
        cov = covariance(self.gp.kernel, self.gp._noise_for(self.obs), self.obs)
        # On CPU, small tiles: a tile's kernel intermediates stay in cache (the symmetric
        # force field's forces at 1 000 configurations from 200: 64 MiB tiles 0.44 s and
        # 382 MB of temporaries, 256 KiB tiles 0.05 s and 9 MB). Elsewhere tiles sized like
        # the dense path's slabs, a fraction of what the observations' covariance takes.
        R = self.alpha.shape[0]
        if jax.default_backend() == "cpu":
            tile = _CPU_MEAN_TILE_BYTES
        else:
            tile = int(min(TILE_BYTES, max(R * R * X.dtype.itemsize // 8, 2**24)))
        return self._finite(_unflatten(m + cov.cross_mv(operator, X, self.alpha, tile_bytes=tile), X.shape[0], P), X)

    @jit
    def variance(
        self,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        noise_group: int | None = None,
    ) -> Array:
        """Predictive variance of `operator` at `X`: of the latent function, or with
        `noise_group=g` of a new noisy observation like those of observation group `g`
        (whose operator should match `operator`): the model's noise of that group plus the
        group's known noise where that is one per output (a per-target known noise is not
        carried over to new points)."""
        X, P = self._points(X, operator)
        var = _operator_diag(self.gp.kernel, operator, X) - self._explained(X, operator, P)
        var = jnp.maximum(var, 0.0) + self._noise(noise_group, X.shape[0], operator)
        return self._finite(_unflatten(var, X.shape[0], P), X)

    def _explained(self, X, operator, P):
        # The diagonal of `_reduction`, in batches of points: the cross-covariance of all new
        # points (P N columns against R rows: for 1 000 points' values and gradients in D = 27,
        # five times a 5 600-row covariance) is never held at once.
        N = X.shape[0]
        R = sum(g.targets.size for g in self.obs.groups)
        budget = min(max(R * R * X.dtype.itemsize // 8, 2**24), 2**26)
        c = int(max(1, budget // max(1, 3 * P * R * X.dtype.itemsize)))
        if c >= N:
            return self._reduction(X, operator, diagonal=True)
        n = -(-N // c)
        Xp = jnp.concatenate([X, jnp.broadcast_to(X[:1], (n * c - N, X.shape[1]))]).reshape(n, c, X.shape[1])
        out = jax.lax.map(lambda Xc: self._reduction(Xc, operator, diagonal=True).reshape(P, c), Xp)
        return out.transpose(1, 0, 2).reshape(P, n * c)[:, :N].reshape(-1)

    @jit
    def covariance(
        self,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        noise_group: int | None = None,
    ) -> Array:
        """Full predictive covariance of `operator` at `X`, `(N P, N P)`, component-major."""
        X, _ = self._points(X, operator)
        cov = _operator_gram(self.gp.kernel, [(operator, X)], [(operator, X)]) - self._reduction(X, operator, False)
        cov = 0.5 * (cov + cov.T)
        cov = cov + jnp.diag(jnp.broadcast_to(self._noise(noise_group, X.shape[0], operator), (cov.shape[0],)))
        return self._finite(cov, X)

    @jit
    def update(self, obs: Observations, key: PRNGKeyArray | int | None = None) -> "Posterior":
        """The posterior given this one's observations and the new `obs` (appended as further
        groups), reusing the work done for this one.

        The solver extends its work: `Cholesky` extends the factor instead of recomputing it,
        `O(R^2 R2)` for `R2` new rows on `R` old ones instead of `O((R + R2)^3)` (equal to
        `gp.condition(Observations(*old.groups, *obs.groups))` to rounding with the default
        `jitter=0`; a jitter applies to the new block's Schur complement only);
        `ConjugateGradient` warm-starts the new solve from this posterior's solution and
        rebuilds its preconditioner (with `key`); `StructuredGradients` cannot, and says so.

        For Bayesian optimisation: condition once, then `update` with each new evaluation.
        Needs one noise shared by all groups (`noise` a scalar, or per-group noise given in
        `obs`'s own `ObservationGroup(noise=...)`).

        **Arguments:** `obs`, an `eqgp.Observations` of the same input dimension and dtype;
        `key` as in `condition` (matrix-free solvers only).
        """
        if not isinstance(obs, Observations):
            raise TypeError(f"`obs` must be an eqgp.Observations; got {type(obs).__name__}.")
        if len(self.gp.raw_noise) != 1:
            raise ValueError(
                "`Posterior.update` appends observation groups, so the GP's noise must be one entry shared by "
                f"all groups; this GP has {len(self.gp.raw_noise)} (one per group). Give the new groups' noise "
                "in their ObservationGroup(noise=...) instead, or condition afresh."
            )
        if obs.dim != self.obs.dim:
            raise ValueError(f"`obs` must have D = {self.obs.dim} like the conditioned observations; got {obs.dim}.")
        if obs.groups[0].X.dtype != self.alpha.dtype:
            raise TypeError(f"`obs` must have dtype {self.alpha.dtype} like the conditioned observations.")
        key = as_key("key", key)
        combined = Observations(*self.obs.groups, *obs.groups)
        cov, r = self.gp._prior(combined)
        solver = self.gp.solver
        state, alpha = solver.extend(self.state, self.alpha, cov, r, key)
        return Posterior(self.gp, combined, solver.for_prediction(state), alpha)

    @jit
    def sample(
        self,
        key: PRNGKeyArray | int,
        X: Float[Array | np.ndarray, "N D"],
        operator: AbstractOperator = Value(),
        num_samples: int = 1,
        jitter: float = 1e-9,
    ) -> Array:
        """Joint samples of `operator` of the latent function at `X`:
        shape `(num_samples, N)` or `(num_samples, N, P)`.

        The predictive covariance is factorised with `jitter` times the mean of its
        diagonal added (as `eqgp.Cholesky`), retrying with tenfold jitter where that fails
        (at observed points it is nearly singular), with a warning saying what it needed.
        `key`: a `jax.random` key or an int seed."""
        key = as_key("key", key)
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"`num_samples` must be an int >= 1; got {num_samples!r}.")
        mean = self.mean(X, operator)
        cov = self.covariance(X, operator)
        n = cov.shape[0]
        L = cholesky(cov, jitter, max_tries=_SAMPLE_TRIES, message=_SAMPLE_NOT_PD)
        z = jax.random.normal(key, (num_samples, n), dtype=cov.dtype)
        flat = mean.T.reshape(-1) if mean.ndim == 2 else mean
        draws = flat[None] + z @ L.T
        N = X.shape[0]
        return draws if mean.ndim == 1 else draws.reshape(num_samples, -1, N).transpose(0, 2, 1)
