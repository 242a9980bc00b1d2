"""Mean functions, and the assembly of the prior of some observations: the covariance
operator (kernel + noise) and the residual `y - m`."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._covariance import Covariance
from ._observations import ObservationGroup, Observations


class ZeroMean(eqx.Module):
    """The zero mean function."""

    def __call__(self, x: Float[Array | np.ndarray, " D"]) -> Float[Array, ""]:
        return jnp.zeros((), x.dtype)


class ConstantMean(eqx.Module):
    """A constant (trainable) mean `c`; its derivatives are zero."""

    constant: Float[Array | np.ndarray, ""]

    def __init__(self, constant: ArrayLike = 0.0):
        """**Arguments:** `constant`, a number."""
        self.constant = jnp.asarray(constant, dtype=float)

    def __call__(self, x: Float[Array | np.ndarray, " D"]) -> Float[Array, ""]:
        return self.constant.astype(x.dtype)


def group_mean(mean: Callable, operator, X: Array) -> Array:
    """The operator applied to the mean function at each point, component-major `(P N,)`:
    derivative observations get the mean's derivatives automatically."""
    out = eqx.filter_vmap(lambda x: operator.apply(mean, x), out_axes=1)(X)
    return out.reshape(-1)


def group_noise(noise: Array, g: ObservationGroup) -> Array:
    """The diagonal noise of one group, component-major `(P N,)`: the model's trainable noise
    entry plus the group's known noise."""
    N, P = g.targets.shape
    model = jnp.broadcast_to(noise.astype(g.X.dtype), (P,))
    if g.noise.ndim == 2:  # one known noise per target
        return (model[:, None] + g.noise.T).reshape(-1)
    return jnp.repeat(model + jnp.broadcast_to(g.noise, (P,)), N)


def noise_per_group(noise: tuple[Array, ...], obs: Observations) -> tuple[Array, ...]:
    """One noise entry per observation group (a single entry is shared), shape-checked."""
    G = len(obs.groups)
    if len(noise) == 1:
        noise = noise * G
    elif len(noise) != G:
        raise ValueError(
            f"the model has {len(noise)} noise entries but the observations have {G} groups; "
            "give one noise entry per group or a single shared one."
        )
    for i, (g, n) in enumerate(zip(obs.groups, noise)):
        P = g.targets.shape[1]
        if n.shape not in ((), (P,)):
            raise ValueError(
                f"noise entry {i} has shape {n.shape}, which does not fit group {i} "
                f"({type(g.operator).__name__}, {P} outputs per point); use a scalar or shape ({P},)."
            )
    return noise


def covariance(kernel, noise: tuple[Array, ...], obs: Observations) -> Covariance:
    """The covariance of `obs` (kernel + noise), `noise` one entry per group (from
    `noise_per_group`); no value checks (see `prior`)."""
    diag = jnp.concatenate([group_noise(n, g) for g, n in zip(obs.groups, noise)])
    return Covariance(kernel, tuple((g.operator, g.X) for g in obs.groups), diag)


def prior(kernel, mean: Callable, noise: tuple[Array, ...], obs: Observations) -> tuple[Covariance, Array]:
    """The covariance of `obs` and the residual `y - m`, checked for NaN/inf under `jit`.
    `noise` is one entry per group (from `noise_per_group`)."""
    cov = covariance(kernel, noise, obs)
    m = jnp.concatenate([group_mean(mean, g.operator, g.X) for g in obs.groups])
    y = obs.flat_targets()
    # Value problems are only visible at run time (under jit too): check where they enter.
    # The checks are chained on (y, diag) and the covariance is built from the checked diag,
    # so everything downstream (the Cholesky and its own check) waits for them: the first
    # problem is the one reported, on GPU as on CPU.
    checked = (y, cov.noise)
    checked = eqx.error_if(checked, ~jnp.all(jnp.isfinite(y)), "eqgp: the observation targets hold NaN or inf.")
    checked = eqx.error_if(
        checked,
        ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(g.X)) for g in obs.groups])),
        "eqgp: the observation points `X` hold NaN or inf.",
    )
    for name, leaf in _inexact_leaves(kernel):
        message = f"eqgp: kernel hyper-parameter `{name}` is NaN or inf (diverged training?)."
        checked = eqx.error_if(checked, ~jnp.all(jnp.isfinite(leaf)), message)
    for name, leaf in _inexact_leaves(mean):
        message = f"eqgp: mean-function parameter `{name}` is NaN or inf."
        checked = eqx.error_if(checked, ~jnp.all(jnp.isfinite(leaf)), message)
    y, diag = eqx.error_if(
        checked,
        ~jnp.all(jnp.isfinite(cov.noise)) | jnp.any(cov.noise < 0),
        "eqgp: the noise variance is NaN, inf or negative.",
    )
    return eqx.tree_at(lambda c: c.noise, cov, diag), y - m


def _inexact_leaves(tree) -> list[tuple[str, Array]]:
    """The inexact-array leaves of `tree` with readable paths, e.g. `kernel.raw_lengthscale`
    as `k1.raw_lengthscale`."""
    leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(tree, eqx.is_inexact_array))[0]
    return [(jax.tree_util.keystr(path).lstrip("."), leaf) for path, leaf in leaves]
