"""Hyper-parameters from the data: a documented initialisation, the signal scale in closed
form, and the default training recipe (`fit_hyperparameters`)."""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checks import check_int
from ._fit import FitError
from ._gram import _operator_diag
from ._kernels import (
    AbstractKernel,
    AbstractStationaryKernel,
    AbstractVarianceKernel,
    ActiveDims,
    Invariant,
    Product,
    Sum,
    Warped,
)
from ._minimize import _LINESEARCH_STEPS, _MEMORY_SIZE, _batched, _init, _init_batched, _solver as _lbfgs, minimize
from ._observations import Observations
from ._operators import Value, ValueAndGradient
from ._parameters import inverse_softplus
from ._prior import ConstantMean


def _set_raw(module, where, value):
    return eqx.tree_at(where, module, inverse_softplus(jnp.asarray(value, dtype=where(module).dtype)))


def _with_lengthscales(kernel: AbstractKernel, Z: np.ndarray, variance: float) -> AbstractKernel:
    """`kernel` with its lengthscales set from the spread of its inputs `Z` `(N, D)` and its
    signal variance (or variances, split over a sum) set to `variance`."""
    if isinstance(kernel, Warped):
        warped = np.asarray(jax.vmap(kernel.warp)(jnp.asarray(Z)))
        return eqx.tree_at(lambda k: k.kernel, kernel, _with_lengthscales(kernel.kernel, warped, variance))
    if isinstance(kernel, ActiveDims):
        inner = _with_lengthscales(kernel.kernel, Z[:, list(kernel.dims)], variance)
        return eqx.tree_at(lambda k: k.kernel, kernel, inner)
    if isinstance(kernel, Invariant):  # the group's images of a point have its spread
        return eqx.tree_at(lambda k: k.kernel, kernel, _with_lengthscales(kernel.kernel, Z, variance))
    if isinstance(kernel, Sum):
        k1 = _with_lengthscales(kernel.kernel1, Z, variance / 2)
        k2 = _with_lengthscales(kernel.kernel2, Z, variance / 2)
        return eqx.tree_at(lambda k: (k.kernel1, k.kernel2), kernel, (k1, k2))
    if isinstance(kernel, Product):
        k1 = _with_lengthscales(kernel.kernel1, Z, variance)
        k2 = _with_lengthscales(kernel.kernel2, Z, 1.0)
        return eqx.tree_at(lambda k: (k.kernel1, k.kernel2), kernel, (k1, k2))
    if isinstance(kernel, AbstractStationaryKernel):
        spread = np.std(Z, axis=0) if Z.shape[0] > 1 else np.ones(Z.shape[1])
        spread = np.where(spread > 0, spread, 1.0)
        if kernel.raw_lengthscale.ndim == 0:
            spread = np.exp(np.mean(np.log(spread)))
        elif kernel.raw_lengthscale.shape != spread.shape:
            raise ValueError(
                f"{type(kernel).__name__} has {kernel.raw_lengthscale.shape[0]} ARD lengthscales but its inputs "
                f"have {Z.shape[1]} dimensions."
            )
        kernel = _set_raw(kernel, lambda k: k.raw_lengthscale, spread)
    if isinstance(kernel, AbstractVarianceKernel):
        kernel = _set_raw(kernel, lambda k: k.raw_variance, variance)
    return kernel


def scale_signal(kernel: AbstractKernel, factor) -> AbstractKernel:
    """`kernel` with its signal variance multiplied by `factor` (every term of a sum; the
    first factor of a product; through `Warped`, `ActiveDims` and `Invariant`)."""
    if isinstance(kernel, (Warped, ActiveDims, Invariant)):
        return eqx.tree_at(lambda k: k.kernel, kernel, scale_signal(kernel.kernel, factor))
    if isinstance(kernel, Sum):
        both = (scale_signal(kernel.kernel1, factor), scale_signal(kernel.kernel2, factor))
        return eqx.tree_at(lambda k: (k.kernel1, k.kernel2), kernel, both)
    if isinstance(kernel, Product):
        return eqx.tree_at(lambda k: k.kernel1, kernel, scale_signal(kernel.kernel1, factor))
    if isinstance(kernel, AbstractVarianceKernel):
        return eqx.tree_at(
            lambda k: k.raw_variance,
            kernel,
            inverse_softplus(kernel.variance * jnp.asarray(factor, kernel.variance.dtype)),
        )
    raise TypeError(
        f"cannot find the signal variance of a {type(kernel).__name__} kernel to scale it; multiply the kernel "
        "by an `eqgp.kernels.Constant` (e.g. `Constant(1.0) * kernel`) to give it one."
    )


def _stack(models):
    params = [eqx.filter(m, eqx.is_inexact_array) for m in models]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params)
    return eqx.combine(stacked, eqx.filter(models[0], eqx.is_inexact_array, inverse=True))


def initialise(gp, obs: Observations, *, starts: int = 1, key=None, spread: float = 4.0, noise: float = 1e-4):
    """A `GaussianProcess` with hyper-parameters set from the data: eqgp's documented default
    starting point for training (`eqgp.fit_hyperparameters`, `eqgp.minimize`, `eqgp.fit`).

    - **Lengthscales**: per input dimension, the standard deviation of the inputs (all groups'
      points; the geometric mean for a scalar lengthscale; through `kernels.Invariant` the
      same). Through `kernels.Warped` the warped features' spread, through
      `kernels.ActiveDims` the dimensions the kernel sees.
    - **Signal variance**: the variance of the value targets about their mean; with
      derivative observations, each output's second moment over the prior variance that
      output has at unit signal variance (for an RBF, `E[(df/dx_d)^2] = variance / l_d^2`), so
      derivative targets set the scale consistently with values (they scale as the values'
      scale over the inputs' scale); the mean over all outputs. A sum's terms share it.
    - **Mean**: a `ConstantMean` becomes the mean of the value targets (left as is without
      value observations).
    - **Noise**: `noise` (relative) times the prior variance of the outputs each trainable noise
      entry covers (the smallest, for an entry shared by values and derivatives).

    Periodic periods, RationalQuadratic's `alpha`, polynomial offsets and custom kernels'
    parameters are left as given. Scaling the inputs by `c` scales the lengthscales by `c`;
    scaling the targets by `a` (derivatives by `a / c`) scales variance and noise by `a^2`.

    **Arguments:**

    - `gp`: the `eqgp.GaussianProcess` template (kernel structure, solver, noise layout).
    - `obs`: the `eqgp.Observations` (concrete arrays, not traced).
    - `starts`: with `n > 1`, `n` starting models stacked on a leading axis (for
      `eqgp.minimize(..., starts=n)`): the first is the default above, the others multiply
      every lengthscale by an independent log-uniform factor in `[1/spread, spread]`.
    - `key`: the random key (or int seed) of those factors; `None` uses 0.
    - `spread`, `noise`: as above.
    """
    from ._gp import GaussianProcess  # noqa: PLC0415 - _gp imports this module's users

    if not isinstance(gp, GaussianProcess):
        raise TypeError(f"`gp` must be an eqgp.GaussianProcess; got {type(gp).__name__}.")
    if not isinstance(obs, Observations):
        raise TypeError(f"`obs` must be an eqgp.Observations; got {type(obs).__name__}.")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(obs)):
        raise TypeError("eqgp.initialise reads the data's spread: call it outside jit/vmap/grad.")
    check_int("starts", starts, 1)
    for name, value, low in (("spread", spread, 1.0), ("noise", noise, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < math.inf:
            raise ValueError(f"`{name}` must be a finite number > {low:g}; got {value!r}.")
    X = np.concatenate([np.asarray(g.X) for g in obs.groups])
    if X.shape[0] == 0:
        raise ValueError("`obs` has no points to initialise from.")
    unit = _with_lengthscales(gp.kernel, X, 1.0)

    # Per output of every group: the targets' second moment (values: about their mean) over
    # the output's prior variance at unit signal variance.
    ratios, prior_unit, values = [], [], []
    for g in obs.groups:
        t = np.asarray(g.targets)
        N, P = t.shape
        if N == 0:
            prior_unit.append(np.ones(P))
            continue
        diag = np.asarray(_operator_diag(unit, g.operator, g.X)).reshape(P, N).mean(axis=1)
        prior_unit.append(diag)
        with_value = isinstance(g.operator, (Value, ValueAndGradient))  # the value is output 0
        for p in range(P):
            if with_value and p == 0:
                values.append(t[:, p])
                moment = np.var(t[:, p]) if N > 1 else t[0, p] ** 2
            else:
                moment = np.mean(t[:, p] ** 2)
            if diag[p] > 0 and moment > 0:
                ratios.append(moment / diag[p])
    variance = float(np.mean(ratios)) if ratios else 1.0
    kernel = _with_lengthscales(gp.kernel, X, variance)
    model = eqx.tree_at(lambda m: m.kernel, gp, kernel)
    if isinstance(gp.mean, ConstantMean) and values:
        constant = jnp.asarray(np.mean(np.concatenate(values)), dtype=gp.mean.constant.dtype)
        model = eqx.tree_at(lambda m: m.mean.constant, model, constant)

    # Noise: relative to the prior variance of the outputs each entry covers.
    entries = list(gp.raw_noise)
    if len(entries) == 1:
        covered = [np.concatenate(prior_unit)]
        widths = {len(p) for p in prior_unit}
        if entries[0].ndim == 1:  # one per output, shared by groups of equal width
            if len(widths) != 1:
                raise ValueError("the model's single per-output noise entry does not fit groups of different widths.")
            covered = [np.min(np.stack(prior_unit), axis=0)]
    elif len(entries) == len(obs.groups):
        covered = prior_unit
    else:
        raise ValueError(
            f"the model has {len(entries)} noise entries but the observations have {len(obs.groups)} groups; "
            "give one noise entry per group or a single shared one."
        )
    new = []
    for raw, cov in zip(entries, covered):
        level = noise * variance * (cov if raw.ndim == 1 else np.min(cov))
        new.append(inverse_softplus(jnp.asarray(np.maximum(level, 1e-300), dtype=raw.dtype)))
    model = eqx.tree_at(lambda m: m.raw_noise, model, tuple(new))
    if starts == 1:
        return model

    key = jax.random.key(0) if key is None else (jax.random.key(key) if isinstance(key, int) else key)
    models = [model]
    for k in jax.random.split(key, starts - 1):
        models.append(_jitter_lengthscales(model, k, math.log(spread)))
    return _stack(models)


def map_stationary(kernel: AbstractKernel, fn, key=None) -> AbstractKernel:
    """`kernel` with every stationary kernel `k` in it (through `Warped`, `ActiveDims`,
    `Invariant`, sums and products) replaced by `fn(k, key)`; `key` (or None) is split at
    each sum or product, one half per side."""
    if isinstance(kernel, (Warped, ActiveDims, Invariant)):
        return eqx.tree_at(lambda k: k.kernel, kernel, map_stationary(kernel.kernel, fn, key))
    if isinstance(kernel, (Sum, Product)):
        k1, k2 = (None, None) if key is None else jax.random.split(key)
        both = (map_stationary(kernel.kernel1, fn, k1), map_stationary(kernel.kernel2, fn, k2))
        return eqx.tree_at(lambda k: (k.kernel1, k.kernel2), kernel, both)
    if isinstance(kernel, AbstractStationaryKernel):
        return fn(kernel, key)
    return kernel


def _scale_lengthscale(kernel: AbstractStationaryKernel, factor) -> AbstractStationaryKernel:
    ls = jax.nn.softplus(kernel.raw_lengthscale)
    return eqx.tree_at(lambda k: k.raw_lengthscale, kernel, inverse_softplus(ls * factor))


def _jitter_lengthscales(model, key, log_spread: float):
    def jitter(kernel, key):
        shape, dtype = kernel.raw_lengthscale.shape, kernel.raw_lengthscale.dtype
        return _scale_lengthscale(kernel, jnp.exp(jax.random.uniform(key, shape, dtype, -log_spread, log_spread)))

    return eqx.tree_at(lambda m: m.kernel, model, map_stationary(model.kernel, jitter, key))


_OBJECTIVES = ("likelihood", "profile", "loo")

# Lengthscales train in log space. A `raw_lengthscale` leaf (stored as
# `softplus^{-1}(lengthscale)`) is trained as `u = log(softplus(raw))`, the log of the
# lengthscale, as scikit-learn and SMT train theirs: a lengthscale that must grow from 1 to
# 1 000 moves by 7 in u, where softplus makes it crawl (the gradient with respect to `raw`
# falls as one over the lengthscale): on SMT's WaterFlow (D = 8, 80 points) L-BFGS took
# 41-51 iterations instead of 133-162, to the same test error. A monotone map of the reals
# onto themselves keeps the optimum. Signal variance and noise keep softplus: trained in log
# space too, they let the noise-to-signal ratio reach 1e-15 within 21 iterations on a 4-D
# Rosenbrock (40 points), where the factorised likelihood is rounding (the model's
# likelihood moved by 800 when rescaled) and the test error was 15x that of log
# lengthscales alone (1.14x SMT's). Below `raw = -20` (values below
# 2e-9, where softplus is exp to 2e-9) `u` is `raw` shifted to meet it.
_SMALL = -20.0


def _is_lengthscale(path) -> bool:
    names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
    return bool(names) and names[-1] == "raw_lengthscale"


_SMALL_U = math.log(math.log1p(math.exp(_SMALL)))  # u at raw = _SMALL: continuous there


def _to_log(raw):
    return jnp.where(raw < _SMALL, raw - _SMALL + _SMALL_U, jnp.log(jax.nn.softplus(jnp.maximum(raw, _SMALL))))


def _from_log(u):
    return jnp.where(u < _SMALL_U, u - _SMALL_U + _SMALL, inverse_softplus(jnp.exp(jnp.maximum(u, _SMALL_U))))


def _map_raw(model, fn):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: fn(x) if eqx.is_inexact_array(x) and _is_lengthscale(path) else x, model
    )


@functools.cache
def _in_log_space(loss):
    """`loss` of a model whose lengthscales are given in log space (cached: one function,
    and so one compiled program, per loss)."""

    def loss_of_logs(model, *args):
        return loss(_map_raw(model, _from_log), *args)

    return loss_of_logs


def fit_hyperparameters(
    gp,
    obs: Observations,
    *,
    objective: str = "profile",
    starts: int = 8,
    runs: int = 1,
    key=None,
    max_steps: int = 500,
    **minimize_options,
):
    """eqgp's default training recipe: initialise from the data (`eqgp.initialise`), screen
    `starts` starting points by their objective, run L-BFGS (`eqgp.minimize`) from the
    `runs` best of them, keep the best result.

    **Starts and runs.** The starting points are the data's default and `starts - 1` with
    every lengthscale multiplied by a log-uniform factor in `[1/4, 4]`; each costs one
    evaluation of the objective (and its gradient) to screen, and only the `runs` lowest are
    trained (BoTorch's raw samples and restarts). `runs=starts` trains every start. The
    starts are screened (and, with `runs > 1`, trained) together with `vmap` on accelerators
    and one after another on CPU (`batched=`, as in `eqgp.minimize`).

    **Log lengthscales.** Lengthscales are trained as their logarithms (as scikit-learn and
    SMT do): one that must grow a thousandfold moves by 7, where the stored
    `softplus^{-1}(lengthscale)` would crawl. Signal variance and noise are trained as stored.
    The model returned is in the usual parametrisation; `report.grad_norm` is measured in
    the trained coordinates.

    Objectives:

    - `"profile"` (default): the log marginal likelihood with the signal variance profiled
      out in closed form (`log_marginal_likelihood(obs, profile=True)`; the trainable noise
      moves with it, as a fixed fraction — SMT's and DiceKriging's concentrated
      likelihood). The returned model carries the optimal scale (`with_profiled_scale`).
    - `"likelihood"`: the plain log marginal likelihood over every hyper-parameter.
    - `"loo"`: the leave-one-out log predictive density (`leave_one_out_log_density`),
      leaving out each point's value and derivatives as a block (dense: `Cholesky`).

    **Interpolation.** Deterministic data (a simulator, SMT's test functions) drives the
    noise towards zero, where a plain Cholesky factorisation of gradient observations fails.
    With the default dense solver (`Cholesky()`), training and the returned model use
    `Cholesky(jitter, max_tries=4)` (the solver's `for_training()`): where a factorisation
    fails it retries with a growing jitter (from `1e-8` of the mean prior variance, in
    float64) and warns with the jitter it needed, so the line search keeps its footing
    instead of stopping the run (as scikit-learn treats a failed factorisation). Other
    solvers are kept as given.

    **Input scales.** Give inputs comparable ranges (e.g. scale them to the unit box and
    the gradients by the box widths, as SMT's kriging does internally): a derivative's
    rows scale as one over its input's scale, and inputs spanning `0.05` to `1e5` (SMT's
    WaterFlow) put derivative rows twelve orders of magnitude apart, beyond what one
    noise floor or jitter treats (there: 1.2-1.9x SMT's error unscaled, 3-5x below it
    scaled).

    **Returns:** `(model, report)` as `eqgp.minimize` (`report.losses`: the final loss of
    each of the `runs` trained starts, best screened first).
    """
    if objective not in _OBJECTIVES:
        raise ValueError(f"`objective` must be one of {_OBJECTIVES}; got {objective!r}.")
    starts = check_int("starts", starts, 1)
    runs = min(check_int("runs", runs, 1), starts)
    if hasattr(gp, "solver"):  # (initialise names a wrong `gp`)
        gp = eqx.tree_at(lambda m: m.solver, gp, gp.solver.for_training())
    start = _map_raw(initialise(gp, obs, starts=starts, key=key), _to_log)
    loss = _in_log_space(_LOSSES[objective])
    try:
        if runs < starts:
            start = _screen(start, starts, runs, loss, obs, minimize_options)
        model, report = minimize(
            start, loss, obs, starts=None if runs == 1 else runs, max_steps=max_steps, **minimize_options
        )
    except FitError as e:  # hand back the model as the user knows it
        e.model = _map_raw(e.model, _from_log)
        raise
    model = _map_raw(model, _from_log)
    if objective == "profile":
        model = model.with_profiled_scale(obs)
    return model, report


def _screen(stacked, starts: int, runs: int, loss, obs, options: dict):
    """The `runs` starting points of `stacked` (a leading axis of `starts`) with the lowest
    loss, stacked (or the single best unstacked). Each is evaluated by `minimize`'s own
    compiled first step (value and gradient), so screening compiles nothing more; a start
    whose loss fails or is not finite ranks last."""
    params, static = eqx.partition(stacked, eqx.is_inexact_array)
    opt = _lbfgs(options.get("memory_size", _MEMORY_SIZE), options.get("linesearch_steps", _LINESEARCH_STEPS))
    values = []
    if _batched(options.get("batched")):  # every start's value in one program
        try:
            values = [float(v) for v in _init_batched(params, static, loss, (obs,), opt).value]
        except Exception as e:  # noqa: BLE001 - one start's failure stops the batch: one by one below
            if isinstance(e, KeyboardInterrupt):
                raise
    for i in range(starts if not values else 0):
        p = jax.tree.map(lambda x, i=i: x[i], params)
        try:
            value = float(_init(p, static, loss, (obs,), opt).value)
        except Exception as e:  # noqa: BLE001 - a failing start ranks last
            if isinstance(e, KeyboardInterrupt):
                raise
            value = math.inf
        values.append(value)
    values = [v if math.isfinite(v) else math.inf for v in values]
    keep = np.argsort(values, kind="stable")[:runs]
    if runs == 1:
        return eqx.combine(jax.tree.map(lambda x: x[int(keep[0])], params), static)
    return eqx.combine(jax.tree.map(lambda x: x[jnp.asarray(keep)], params), static)


def _neg_likelihood(model, obs):
    return -model.log_marginal_likelihood(obs)


def _neg_profile(model, obs):
    return -model.log_marginal_likelihood(obs, profile=True)


def _neg_loo(model, obs):
    return -model.leave_one_out_log_density(obs)


_LOSSES = {"likelihood": _neg_likelihood, "profile": _neg_profile, "loo": _neg_loo}
