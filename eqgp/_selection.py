"""Choosing the lengthscales by a search over one common factor: scored by closed-form
leave-one-out errors, by the error on held-out observations (sGDML's validation grid) or by
the likelihood."""

import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._hyperparameters import _scale_lengthscale, map_stationary
from ._jit import full_precision
from ._kernels import AbstractStationaryKernel, ActiveDims, Invariant, Product, Sum, Warped
from ._observations import Observations

_CRITERIA = ("loo", "validation", "profile", "likelihood")
_SEARCHES = ("descend", "grid")


class Selection(eqx.Module):
    """What `eqgp.select_lengthscales` tried: every `factor` (times the starting
    lengthscales) in the order evaluated, its `score` (lower is better: a mean absolute
    error, or a negative log likelihood), the chosen `factor` and the `criterion`."""

    factors: np.ndarray
    scores: np.ndarray
    factor: float
    criterion: str

    def __repr__(self):
        order = np.argsort(self.factors)
        pairs = ", ".join(f"{f:.4g}: {s:.5g}" for f, s in zip(self.factors[order], self.scores[order]))
        return f"Selection(criterion={self.criterion!r}, factor={self.factor:.4g}, scores={{{pairs}}})"


def scale_lengthscales(kernel, factor):
    """`kernel` with every stationary lengthscale multiplied by `factor` (through `Warped`,
    `ActiveDims`, `Invariant`, sums and products)."""
    return map_stationary(kernel, lambda k, _: _scale_lengthscale(k, factor))


def _has_lengthscale(kernel) -> bool:
    if isinstance(kernel, (Warped, ActiveDims, Invariant)):
        return _has_lengthscale(kernel.kernel)
    if isinstance(kernel, (Sum, Product)):
        return _has_lengthscale(kernel.kernel1) or _has_lengthscale(kernel.kernel2)
    return isinstance(kernel, AbstractStationaryKernel)


def _mean_abs_residual(blocks):
    total = sum(jnp.sum(jnp.abs(residual)) for residual, *_ in blocks)
    return total / sum(residual.size for residual, *_ in blocks)


@eqx.filter_jit
def _score(gp, factor, obs, validation, criterion: str, combine_groups: bool):
    model = eqx.tree_at(lambda m: m.kernel, gp, scale_lengthscales(gp.kernel, factor))
    if criterion == "loo":
        return _mean_abs_residual(model._leave_one_out(obs, combine_groups))
    if criterion == "validation":
        post = model.condition(obs)
        errors = [
            jnp.abs(post.mean(g.X, g.operator).reshape(g.targets.shape) - g.targets).reshape(-1)
            for g in validation.groups
        ]
        return jnp.mean(jnp.concatenate(errors))
    return -model.log_marginal_likelihood(obs, profile=criterion == "profile")


def _loo_of_factor(rest, Lt):
    from ._gp import _leave_one_out_of_factor, _loo_blocks  # noqa: PLC0415 - _gp imports this module's users

    obs, combine_groups, check, alpha = rest
    inverse = []
    blocks = _leave_one_out_of_factor(Lt, check, alpha, _loo_blocks(obs, combine_groups), inverse)
    return _mean_abs_residual(blocks), inverse[0]


# The factor is donated and L^{-T} returned (and dropped): XLA reuses a donated argument only
# for an output of its shape, so ?trtri overwrites it in place (one R x R matrix, not two).
_loo_of_factor = eqx.filter_jit(full_precision(_loo_of_factor), donate="all-except-first")


def _loo_score(model, obs, combine_groups: bool):
    """The leave-one-out score of `model` from `model.condition(obs)`'s own factor (a solver
    that `holds_dense_factor`, as `Cholesky`): the program that factorises is the one that
    conditions, so the selection's final `condition` (and the user's) compiles nothing new."""
    post = model.condition(obs)
    Lt, check = model.solver.held_factor_t(post.state)
    score, _ = _loo_of_factor((obs, combine_groups, check, post.alpha), Lt)
    return score


def select_lengthscales(
    gp,
    obs: Observations,
    *,
    criterion: str = "loo",
    validation: Observations | None = None,
    factors=None,
    refine: int = 2,
    search: str = "descend",
    combine_groups: bool = False,
):
    """Choose the lengthscales of `gp` by a search over one factor that multiplies all of
    them, on a log-spaced grid (`factors`), then `refine` rounds that try the two factors
    either side of the best at half the previous log-step (sGDML's validation grid,
    refined).

    `search="descend"` (default) starts at the grid's factor nearest 1 (the lengthscales
    `gp` has) and moves to the better neighbour until neither neighbour is better: a few
    evaluations when the start is within a few grid steps of the best, and the grid's
    minimum where the score has one minimum on it. `search="grid"` scores every factor
    (for scores with several minima).

    Every other hyper-parameter is kept, and the factors share their compiled programs
    (with `"loo"` and a `Cholesky` solver, `gp.condition`'s own, so that conditioning the
    selected model compiles nothing new). The noise is kept as given (a noise fixed
    relative to the signal, as an interpolating force field uses, makes the predictive
    mean independent of the signal variance).

    Criteria (each a score to minimise):

    - `"loo"` (default): the mean absolute leave-one-out residual of the predictive mean,
      leaving out each point's value and derivatives as a block (closed form from one
      factorisation, `GaussianProcess.leave_one_out`): cross-validation without held-out
      data. Dense, `O(R^3)`; with `Cholesky`, one `R x R` matrix (the factor, inverted in place).
    - `"validation"`: the mean absolute error of the predictive mean on `validation`
      (held-out observations, e.g. forces of other configurations): sGDML's selection.
    - `"profile"`, `"likelihood"`: the negative log marginal likelihood (with the signal
      variance profiled out, or as the model has it). On deterministic data with a
      misspecified kernel the likelihood can prefer lengthscales that predict worse (see
      the "Choosing hyper-parameters" tutorial): then use `"loo"`.

    A best factor at the edge of the grid is warned about (extend `factors`).

    **Arguments:**

    - `gp`: an `eqgp.GaussianProcess` whose kernel has stationary lengthscales (its
      starting point: e.g. `eqgp.initialise`'s or your own).
    - `obs`: the training `eqgp.Observations`.
    - `criterion`, `validation`: as above.
    - `factors`: the grid, positive numbers (default `2.0 ** arange(-4, 5)`: 1/16 to 16).
    - `refine`: rounds of refinement (each two more evaluations).
    - `search`: `"descend"` or `"grid"`, as above.
    - `combine_groups`: as in `leave_one_out` (e.g. energies and forces as two groups at
      the same configurations leave out together).

    **Returns:** `(gp, selection)`: the model at the chosen factor and an
    `eqgp.Selection` (every factor tried and its score).

    ```python
    gp, selection = eqgp.select_lengthscales(gp, forces)  # closed-form leave-one-out
    ```
    """
    from ._gp import GaussianProcess  # noqa: PLC0415 - _gp imports this module's users

    if not isinstance(gp, GaussianProcess):
        raise TypeError(f"`gp` must be an eqgp.GaussianProcess; got {type(gp).__name__}.")
    if not isinstance(obs, Observations):
        raise TypeError(f"`obs` must be an eqgp.Observations; got {type(obs).__name__}.")
    if criterion not in _CRITERIA:
        raise ValueError(f"`criterion` must be one of {_CRITERIA}; got {criterion!r}.")
    if (criterion == "validation") != (validation is not None):
        raise ValueError(
            "`validation` (held-out eqgp.Observations) goes with `criterion='validation'` and only with it; got "
            f"criterion={criterion!r} and validation={type(validation).__name__}."
        )
    if validation is not None and not isinstance(validation, Observations):
        raise TypeError(f"`validation` must be an eqgp.Observations; got {type(validation).__name__}.")
    if validation is not None and validation.dim != obs.dim:
        raise ValueError(f"`validation` must have D = {obs.dim} like `obs`; got {validation.dim}.")
    if not _has_lengthscale(gp.kernel):
        raise ValueError(
            f"`gp`'s kernel {type(gp.kernel).__name__} has no stationary lengthscale to select (RBF, Matérn, "
            "RationalQuadratic, possibly inside Warped, Invariant, ActiveDims, sums or products)."
        )
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise ValueError(f"`refine` must be an int >= 0; got {refine!r}.")
    if not isinstance(combine_groups, bool):
        raise TypeError(f"`combine_groups` must be a bool; got {combine_groups!r}.")
    grid = 2.0 ** np.arange(-4, 5) if factors is None else np.asarray(factors, dtype=float)
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError(f"`factors` must be a non-empty 1-D sequence of positive numbers; got {factors!r}.")
    grid = np.unique(grid)

    if search not in _SEARCHES:
        raise ValueError(f"`search` must be one of {_SEARCHES}; got {search!r}.")

    dtype = jax.tree.leaves(eqx.filter(gp, eqx.is_inexact_array))[0].dtype
    by_condition = criterion == "loo" and gp.solver.holds_dense_factor
    tried: dict[float, float] = {}

    def evaluate(f):
        if f not in tried:
            if by_condition:
                model = eqx.tree_at(lambda m: m.kernel, gp, scale_lengthscales(gp.kernel, jnp.asarray(f, dtype)))
                score = _loo_score(model, obs, combine_groups)
            else:
                score = _score(gp, jnp.asarray(f, dtype), obs, validation, criterion, combine_groups)
            score = float(score)
            tried[f] = score if math.isfinite(score) else math.inf
        return tried[f]

    if search == "grid":
        for f in grid:
            evaluate(float(f))
    else:  # from the grid point nearest the starting lengthscales, to the better neighbour
        i = int(np.argmin(np.abs(np.log(grid))))
        while True:
            near = [j for j in (i - 1, i, i + 1) if 0 <= j < grid.size]
            j = min(near, key=lambda j: (evaluate(float(grid[j])), j != i))
            if j == i:
                break
            i = j
    best = min(tried, key=tried.get)
    if not math.isfinite(tried[best]):
        raise ValueError(f"every factor tried gave a non-finite {criterion!r} score: {tried}.")
    if grid.size > 1 and best in (grid[0], grid[-1]):
        warnings.warn(
            f"eqgp.select_lengthscales: the best factor {best:g} is at the edge of the grid "
            f"[{grid[0]:g}, {grid[-1]:g}]; extend `factors` beyond it.",
            stacklevel=2,
        )
    step = float(np.median(np.diff(np.log(grid)))) if grid.size > 1 else math.log(2.0)
    for _ in range(refine):
        step /= 2
        for f in (best * math.exp(-step), best * math.exp(step)):
            evaluate(f)
        best = min(tried, key=tried.get)
    model = eqx.tree_at(lambda m: m.kernel, gp, scale_lengthscales(gp.kernel, jnp.asarray(best, dtype)))
    report = Selection(np.asarray(list(tried)), np.asarray(list(tried.values())), best, criterion)
    return model, report
