"""Acquisition functions for Bayesian optimisation, and their multi-start maximiser.

Each acquisition is a function of a `Posterior` and points `X` of shape `(N, D)`, returns
`(N,)` (higher is better), and is differentiable in `X`; the predicted value is the
posterior of `Value()` at `X`, whatever the posterior was conditioned on (values,
gradients, partial derivatives, ...). The convention is BoTorch's: `maximize=True` looks for
the objective's maximum, `maximize=False` for its minimum.
"""

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._checks import as_key, check_int
from ._gp import GaussianProcess, Posterior

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _check_posterior(posterior) -> None:
    if isinstance(posterior, GaussianProcess):
        raise TypeError(
            "`posterior` must be an eqgp.Posterior; got a GaussianProcess. Condition it first: `gp.condition(obs)`."
        )
    if not isinstance(posterior, Posterior):
        raise TypeError(
            f"`posterior` must be an eqgp.Posterior (from `gp.condition(obs)`); got {type(posterior).__name__}."
        )


def _check_maximize(maximize) -> None:
    if not isinstance(maximize, (bool, np.bool_)):
        raise TypeError(f"`maximize` must be a bool (True: look for the maximum); got {maximize!r}.")


def _finite_scalar(name: str, value, dtype, minimum=None) -> Array:
    """`value` as a scalar of `dtype`: a shape error at trace time, a value error (NaN, inf,
    below `minimum`) at run time, also under `jit`."""
    if isinstance(value, str) or not isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
        raise TypeError(f"`{name}` must be a number; got {value!r:.80}.")
    v = jnp.asarray(value)
    if v.ndim != 0:
        raise ValueError(f"`{name}` must be a scalar; got shape {v.shape}.")
    v = v.astype(dtype)
    bad = ~jnp.isfinite(v) if minimum is None else ~jnp.isfinite(v) | (v < minimum)
    rule = "finite" if minimum is None else f"finite and >= {minimum}"
    return eqx.error_if(v, bad, f"`{name}` must be {rule}.")


def _mean_sd(posterior: Posterior, X, floor=0.0):
    """The posterior mean and standard deviation of the value at `X`, the variance floored."""
    _check_posterior(posterior)
    mean = posterior.mean(X)
    return mean, jnp.sqrt(jnp.maximum(posterior.variance(X), floor))


def _improvement_z(posterior: Posterior, X, best_f, maximize: bool):
    _check_posterior(posterior)
    _check_maximize(maximize)
    mean, sd = _mean_sd(posterior, X, jnp.finfo(posterior.alpha.dtype).tiny)
    best = _finite_scalar("best_f", best_f, mean.dtype)
    u = mean - best if maximize else best - mean
    return u / sd, sd


def _log_h(z: Array) -> Array:
    """`log(phi(z) + z Phi(z))`, stable for every z (BoTorch's `log_ei` helper, derived
    from `Phi(z) = erfcx(-z / sqrt 2) exp(-z^2 / 2) / 2`)."""
    # z > -1: direct; h is at least h(-1) = 0.083 there.
    zp = jnp.maximum(z, -1.0)
    direct = jnp.log(jax.scipy.stats.norm.pdf(zp) + zp * jax.scipy.stats.norm.cdf(zp))
    # z <= -1: h(z) = exp(-z^2/2) / sqrt(2 pi) * (1 - |z| sqrt(pi/2) erfcx(|z| / sqrt 2)).
    a = jnp.minimum(-z, 1e6)  # beyond 1e6 the asymptotic form below is exact in float64
    a = jnp.maximum(a, 1.0)
    t = a * math.sqrt(math.pi / 2) * jax.scipy.special.erfcx(a / math.sqrt(2))
    tail = -0.5 * a**2 - _LOG_SQRT_2PI + jnp.log1p(-t)
    asymptotic = -0.5 * z**2 - _LOG_SQRT_2PI - 2.0 * jnp.log(jnp.maximum(-z, 1.0))  # 1 - t ~ 1/z^2
    tail = jnp.where(-z > 1e6, asymptotic, tail)
    return jnp.where(z > -1.0, direct, tail)


def expected_improvement(
    posterior: Posterior, X: Float[Array | np.ndarray, "N D"], best_f: ArrayLike, maximize: bool = True
) -> Float[Array, " N"]:
    """Expected improvement over the incumbent `best_f`: `E[max(f(X) - best_f, 0)]`
    (or `E[max(best_f - f(X), 0)]` with `maximize=False`) under the posterior.

    **Arguments:**

    - `posterior`: an `eqgp.Posterior` (from `GaussianProcess.condition`).
    - `X`: candidate points, shape `(N, D)`.
    - `best_f`: the best objective value observed so far, a scalar.
    - `maximize`: whether the objective is maximised (BoTorch's convention) or minimised.

    **Returns:** shape `(N,)`. Underflows to 0 far from the incumbent; optimise
    `log_expected_improvement` instead, whose gradient stays informative there.
    """
    z, sd = _improvement_z(posterior, X, best_f, maximize)
    return sd * (jax.scipy.stats.norm.pdf(z) + z * jax.scipy.stats.norm.cdf(z))


def log_expected_improvement(
    posterior: Posterior, X: Float[Array | np.ndarray, "N D"], best_f: ArrayLike, maximize: bool = True
) -> Float[Array, " N"]:
    """`log(expected_improvement(...))`, computed without underflow (as BoTorch's
    `LogExpectedImprovement`): finite, with useful gradients, even where the improvement
    is tens of standard deviations away. Arguments as `expected_improvement`.

    **Returns:** shape `(N,)`.
    """
    z, sd = _improvement_z(posterior, X, best_f, maximize)
    return jnp.log(sd) + _log_h(z)


def upper_confidence_bound(
    posterior: Posterior, X: Float[Array | np.ndarray, "N D"], beta: ArrayLike = 4.0, maximize: bool = True
) -> Float[Array, " N"]:
    """`mean + sqrt(beta) sd` of the posterior value at `X` (with `maximize=False`:
    `-(mean - sqrt(beta) sd)`, the lower bound negated, so that higher is better).

    **Arguments:** `posterior`, `X` (shape `(N, D)`), `beta >= 0` (the exploration weight;
    4 gives two standard deviations) and `maximize`.

    **Returns:** shape `(N,)`.
    """
    _check_maximize(maximize)
    mean, sd = _mean_sd(posterior, X)
    bonus = jnp.sqrt(_finite_scalar("beta", beta, mean.dtype, minimum=0)) * sd
    return mean + bonus if maximize else -(mean - bonus)


def maximize_acquisition(
    acquisition: Callable[[Float[Array, "N D"]], Float[Array, " N"]],
    lower: ArrayLike,
    upper: ArrayLike,
    key: PRNGKeyArray | int,
    num_starts: int = 32,
    steps: int = 100,
    learning_rate: float = 0.02,
    initial: Float[ArrayLike, "M D"] | None = None,
) -> tuple[Float[Array, " D"], Float[Array, ""]]:
    """Maximise a pointwise acquisition over the box `[lower, upper]` by multi-start
    gradient ascent: `num_starts` uniform random starts (and any `initial` points), all
    ascended at once (one batched call of `acquisition` per step) by Adam on coordinates
    scaled to the unit box, its rate decaying (cosine) to 1 % by the last step so that the
    points settle, each step projected back into the box; the best point found wins.

    **Arguments:**

    - `acquisition`: `X (N, D) -> (N,)`, each output depending on its own row only (as
      `expected_improvement` and friends: `lambda X: eqgp.log_expected_improvement(post, X, best)`).
    - `lower`, `upper`: the box, shape `(D,)` each, `lower < upper`.
    - `key`: a `jax.random` key (or an int seed) for the starts.
    - `num_starts`, `steps`, `learning_rate`: the ascent (the rate is in unit-box coordinates;
      its initial value).
    - `initial`: optional further starts, shape `(M, D)`, e.g. points near the incumbent
      (BoTorch's `batch_initial_conditions`); clipped into the box.

    **Returns:** `(x, value)`: the best point, shape `(D,)`, and its acquisition value.
    Usable under `jit` (`num_starts` and `steps` static).
    """
    key = as_key("key", key)
    if not callable(acquisition):
        raise TypeError(f"`acquisition` must be a function X (N, D) -> (N,); got {acquisition!r:.80}.")
    lower = jnp.asarray(lower)
    upper = jnp.asarray(upper)
    if lower.ndim != 1 or lower.shape != upper.shape:
        raise ValueError(f"`lower` and `upper` must have the same shape (D,); got {lower.shape} and {upper.shape}.")
    if not isinstance(lower, jax.core.Tracer) and not isinstance(upper, jax.core.Tracer):
        lo, hi = np.asarray(lower), np.asarray(upper)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError(f"`lower` and `upper` must be finite (a box); got {lo} and {hi}.")
        if not bool(np.all(lo < hi)):
            raise ValueError(f"`lower` must be below `upper` in every dimension; got {lo} and {hi}.")
    check_int("num_starts", num_starts, 1)
    check_int("steps", steps, 0)
    if isinstance(learning_rate, jax.core.Tracer):
        learning_rate = eqx.error_if(
            learning_rate, ~(learning_rate > 0) | ~jnp.isfinite(learning_rate), "`learning_rate` must be positive."
        )
    elif (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float, np.number))
        or not (0 < float(learning_rate) < math.inf)
    ):
        raise ValueError(f"`learning_rate` must be a positive finite number; got {learning_rate!r}.")
    dtype = jnp.result_type(lower.dtype, upper.dtype, float)
    lower, upper = lower.astype(dtype), upper.astype(dtype)
    width = upper - lower

    def in_box(U):  # unit-box coordinates (S, D) -> points
        return lower[None] + U * width[None]

    def scores(X):
        out = acquisition(X)
        if getattr(out, "shape", None) != (X.shape[0],):
            raise ValueError(
                f"`acquisition` must return one value per point, shape ({X.shape[0]},) for X of shape "
                f"{tuple(X.shape)}; got {getattr(out, 'shape', type(out).__name__)}. Pointwise acquisitions such "
                "as `lambda X: eqgp.log_expected_improvement(post, X, best)` do."
            )
        return out

    def objective(U):
        return -jnp.sum(scores(in_box(U)))

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, max(steps, 1), alpha=0.01))
    U0 = jax.random.uniform(key, (num_starts, lower.shape[0]), dtype)
    if initial is not None:
        initial = jnp.asarray(initial, dtype)
        if initial.ndim != 2 or initial.shape[1] != lower.shape[0]:
            raise ValueError(f"`initial` must have shape (M, {lower.shape[0]}); got {tuple(initial.shape)}.")
        U0 = jnp.concatenate([U0, jnp.clip((initial - lower[None]) / width[None], 0.0, 1.0)])

    def step(carry, _):
        U, state = carry
        g = jax.grad(objective)(U)
        g = jnp.where(jnp.isfinite(g), g, 0.0)  # a start where the acquisition is flat or NaN stays put
        updates, state = opt.update(g, state, U)
        return (jnp.clip(optax.apply_updates(U, updates), 0.0, 1.0), state), None

    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes int32 and float
        (U, _), _ = jax.lax.scan(step, (U0, opt.init(U0)), None, length=steps)
    X = in_box(U)
    values = scores(X)
    values = jnp.where(jnp.isnan(values), -jnp.inf, values)
    i = jnp.argmax(values)
    best = eqx.error_if(
        values[i],
        ~(values[i] > -jnp.inf),
        "eqgp.maximize_acquisition: the acquisition is NaN or -inf at every start and every step; check "
        "the posterior (NaN hyper-parameters?) and `best_f`, or use `log_expected_improvement`, which "
        "stays finite far from the incumbent.",
    )
    best = eqx.error_if(
        best,
        best == jnp.inf,
        "eqgp.maximize_acquisition: the acquisition is +inf at the point it chose, so that point says "
        "nothing about where to sample (a division by a zero predictive variance?); make the acquisition "
        "finite, e.g. floor the standard deviation.",
    )
    return X[i], best
