# Trace-time validation shared by the public functions: shape, dtype and structure
# problems raise here, naming the argument, what was expected and what was given.
import jax
import jax.numpy as jnp
import numpy as np


def as_points(name: str, X, dim: int | None = None) -> jax.Array:
    """`X` as a floating (N, D) array, or a ValueError/TypeError naming `name`."""
    if not hasattr(X, "shape") or not hasattr(X, "dtype"):
        try:
            X = np.asarray(X)
        except Exception:  # noqa: BLE001 - reported below as a TypeError
            raise TypeError(f"`{name}` must be an array of shape (N, D); got {type(X).__name__}.") from None
    if not jnp.issubdtype(X.dtype, jnp.floating):
        raise TypeError(
            f"`{name}` must be a floating-point array of shape (N, D); got dtype {X.dtype}. "
            f"Cast it first, e.g. `{name}.astype(float)`."
        )
    if jnp.dtype(X.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise TypeError(
            f"`{name}` has dtype {X.dtype}; eqgp's Gaussian processes compute in float32 or float64 "
            f"(float16/bfloat16 cannot hold a covariance factorisation). Cast it, e.g. "
            f"`{name}.astype(jnp.float32)`."
        )
    if X.ndim != 2:
        hint = (
            f" For N points in one dimension use `{name}[:, None]`; for one point in D dimensions, `{name}[None]`."
            if X.ndim == 1
            else ""
        )
        raise ValueError(f"`{name}` must have shape (N, D); got shape {tuple(X.shape)}.{hint}")
    if dim is not None and X.shape[1] != dim:
        raise ValueError(
            f"`{name}` has {X.shape[1]} input dimensions (shape {tuple(X.shape)}) but {dim} "
            "were expected (the other inputs' D)."
        )
    return jnp.asarray(X)


def check_same_dtype(**arrays) -> None:
    dtypes = {name: x.dtype for name, x in arrays.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise TypeError(f"inputs must share one floating dtype; got {got}.")


def as_key(name: str, key):
    """A `jax.random` key from `key`: a key (typed, or the legacy `uint32[2]`), an integer seed
    (converted with `jax.random.key`), or `None` (returned as is)."""
    if key is None:
        return None
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    dtype = getattr(key, "dtype", None)
    if dtype is not None and (
        jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) or (dtype == jnp.uint32 and key.shape == (2,))
    ):
        return key
    raise TypeError(f"`{name}` must be a jax.random key (e.g. `jax.random.key(0)`) or an int seed; got {key!r:.80}.")


def check_int(name: str, value, least: int) -> int:
    """`value` as an int `>= least` (a bool is not one), or a ValueError naming `name`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
        raise ValueError(f"`{name}` must be an int >= {least}; got {value!r}.")
    return int(value)
