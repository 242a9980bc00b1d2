"""Hyper-parameter storage: positive values kept unconstrained (`raw = softplus^{-1}(value)`),
checked where they enter, and read in the inputs' dtype."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

# A constrained hyper-parameter as given to a constructor: a number, an array or a list.
Hyper = ArrayLike | Sequence[float]


def inverse_softplus(y):
    return y + jnp.log(-jnp.expm1(-y))


def positive(name: str, value, *, per: str | None = None) -> Array:
    """Validate a constrained positive hyper-parameter and return its raw (unconstrained) value.

    `per`: what the entries of a 1-D value stand for ("input dimension" for ARD
    lengthscales, "operator output" for a noise group); None for a scalar."""
    if isinstance(value, jax.core.Tracer):
        v = jnp.asarray(value)
        v = eqx.error_if(v, ~jnp.all((v > 0) & jnp.isfinite(v)), f"`{name}` must be positive and finite.")
    else:
        v = np.asarray(value)
        if not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            raise TypeError(f"`{name}` must be a real number; got {value!r}.")
        if v.ndim > (0 if per is None else 1):
            raise ValueError(
                f"`{name}` must be a scalar{'' if per is None else f' or a 1-D array (one per {per})'}; "
                f"got shape {v.shape}."
            )
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"`{name}` must be positive and finite; got {value!r}.")
        v = jnp.asarray(v, dtype=float)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(float)
    return inverse_softplus(v)


def like(param: Array, x: Array) -> Array:
    # Hyper-parameters follow the inputs' dtype, so float32 data works with
    # float64-default parameters under strict dtype promotion.
    return param.astype(x.dtype)


def per_dimension(name: str, param: Array, x1: Array) -> Array:
    """A scalar or per-dimension hyper-parameter, checked against the points' dimension
    (known only at the call) and cast to their dtype."""
    if param.ndim == 1 and param.shape[0] != x1.shape[-1]:
        raise ValueError(
            f"the kernel has {param.shape[0]} ARD `{name}` values but the inputs have "
            f"{x1.shape[-1]} dimensions; give one {name} per input dimension or a scalar."
        )
    return like(param, x1)
