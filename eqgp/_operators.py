import abc
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float


def _directional(f: Callable, x: Array, V: Array) -> Array:
    """Directional derivatives of `f` at `x` along the rows of `V`: shape `(K, *f(x).shape)`.

    Forward mode along only the requested directions: selecting components happens
    before differentiating, so nothing unrequested is computed."""
    return jax.vmap(lambda v: jax.jvp(f, (x,), (v,))[1])(V)


def _unit(dims, D: int, dtype) -> Array:
    return jnp.eye(D, dtype=dtype)[np.asarray(dims, dtype=int)]


def _scalar(f: Callable, x: Array) -> bool:
    # A scalar function has one output and many inputs: its derivatives come cheapest in
    # reverse mode (one pass for the whole gradient); a vector-valued one (the inner block
    # of a gram) is differentiated forward along the requested directions, which makes a
    # gradient-by-gradient block forward-over-reverse.
    return jax.eval_shape(f, x).shape == ()


def _derivatives(f: Callable, x: Array, V: Array) -> Array:
    """`V @ grad f(x)` (reverse mode) for a scalar `f`, else forward mode along the rows of `V`."""
    if _scalar(f, x):
        return V @ jax.grad(f)(x)
    return _directional(f, x, V)


def _jvp(f: Callable, x: Array, v: Array) -> Array:
    return jax.jvp(f, (x,), (v.astype(x.dtype),))[1]


class AbstractOperator(eqx.Module):
    """A linear functional of the latent function at a point (an observation type).

    `apply(f, x)` maps a function `f: (D,) -> Q` to the stacked outputs `(P, *Q)` of
    the operator at `x`; nesting two operators around a kernel gives their cross
    covariance block `A_x1 B_x2 k(x1, x2)`.

    `order`: how many derivatives of `f` the operator takes (0 for values, 1 for
    gradients, 2 for Hessians); a kernel whose process is less smooth is refused. None
    (the default for a user operator) skips the check."""

    order: ClassVar[int | None] = None

    @abc.abstractmethod
    def size(self, dim: int) -> int:
        """The number of outputs `P` at one point with `dim` input dimensions."""

    @abc.abstractmethod
    def apply(self, f: Callable, x: Float[Array, " D"]) -> Array:
        """The operator's outputs for the function `f` at the point `x`, shape `(P, *Q)`."""

    @abc.abstractmethod
    def contract(self, f: Callable, x: Float[Array, " D"], v: Float[Array, " P"]) -> Array:
        """`sum_p v[p] * apply(f, x)[p]`, computed as one product where the operator allows
        (a single forward-mode derivative along the combined direction): what the
        matrix-free covariance product needs per pair of points."""


class Value(AbstractOperator):
    """The function value `f(x)` (one output)."""

    order: ClassVar[int] = 0

    def size(self, dim: int) -> int:
        return 1

    def apply(self, f, x):
        return f(x)[None]

    def contract(self, f, x, v):
        return v[0] * f(x)


class Gradient(AbstractOperator):
    """The gradient `df/dx` (D outputs, in dimension order)."""

    order: ClassVar[int] = 1

    def size(self, dim: int) -> int:
        return dim

    def apply(self, f, x):
        if _scalar(f, x):
            return jax.grad(f)(x)
        return _directional(f, x, jnp.eye(x.shape[0], dtype=x.dtype))

    def contract(self, f, x, v):
        return _jvp(f, x, v)


class ValueAndGradient(AbstractOperator):
    """The value and the gradient, `[f(x), df/dx_0, ..., df/dx_{D-1}]` (D + 1 outputs):
    what `eqgp.gradient_gram` uses, sharing the primal computation between them."""

    order: ClassVar[int] = 1

    def size(self, dim: int) -> int:
        return dim + 1

    def apply(self, f, x):
        if _scalar(f, x):
            y, dy = jax.value_and_grad(f)(x)
            return jnp.concatenate([y[None], dy])
        E = jnp.eye(x.shape[0], dtype=x.dtype)
        y, dy = jax.vmap(lambda v: jax.jvp(f, (x,), (v,)), out_axes=(None, 0))(E)
        return jnp.concatenate([y[None], dy])

    def contract(self, f, x, v):
        y, dy = jax.jvp(f, (x,), (v[1:].astype(x.dtype),))
        return v[0] * y + dy


class Partial(AbstractOperator):
    """Some components of the gradient, `df/dx_i` for `i` in `dims` (in that order)."""

    order: ClassVar[int] = 1

    dims: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, dims):
        """**Arguments:** `dims`, an int or a sequence of distinct input-dimension indices."""
        dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        if not dims or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
            raise ValueError(f"`dims` must be non-negative integers; got {dims!r}.")
        if len(set(dims)) != len(dims):
            raise ValueError(f"`dims` must be distinct; got {dims!r}.")
        self.dims = tuple(int(d) for d in dims)

    def size(self, dim: int) -> int:
        if max(self.dims) >= dim:
            raise ValueError(
                f"Partial(dims={self.dims}) asks for dimension {max(self.dims)} but the "
                f"inputs have only {dim} dimensions."
            )
        return len(self.dims)

    def apply(self, f, x):
        self.size(x.shape[0])
        V = _unit(self.dims, x.shape[0], x.dtype)
        if len(self.dims) == 1:  # one jvp beats a full reverse pass
            return _directional(f, x, V)
        return _derivatives(f, x, V)

    def contract(self, f, x, v):
        self.size(x.shape[0])
        direction = jnp.zeros(x.shape, x.dtype).at[np.asarray(self.dims)].set(v.astype(x.dtype))
        return _jvp(f, x, direction)


class Directional(AbstractOperator):
    """Directional derivatives `v . df/dx` along one direction `v` of shape `(D,)`, or
    along each row of `v` of shape `(K, D)` (K outputs). Directions are used as given
    (not normalised)."""

    order: ClassVar[int] = 1

    directions: Float[Array, "K D"]

    def __init__(self, v: ArrayLike):
        """**Arguments:** `v`, shape `(D,)` or `(K, D)`."""
        v = jnp.asarray(v)
        if not jnp.issubdtype(v.dtype, jnp.floating):
            v = v.astype(float)
        if v.ndim == 1:
            v = v[None]
        if v.ndim != 2:
            raise ValueError(f"`v` must have shape (D,) or (K, D); got {tuple(v.shape)}.")
        if not isinstance(v, jax.core.Tracer):
            norms = np.linalg.norm(np.asarray(v), axis=1)
            if not np.all(np.isfinite(norms)):
                raise ValueError(f"`v` must be finite; got {v}.")
            if np.any(norms == 0):
                raise ValueError(
                    f"`v` holds a zero direction (row(s) {np.flatnonzero(norms == 0).tolist()}): its observations "
                    "would be pure noise. Give non-zero directions."
                )
        self.directions = v

    def size(self, dim: int) -> int:
        if self.directions.shape[1] != dim:
            raise ValueError(
                f"Directional has directions of dimension {self.directions.shape[1]} but "
                f"the inputs have {dim} dimensions."
            )
        return self.directions.shape[0]

    def apply(self, f, x):
        self.size(x.shape[0])
        V = self.directions.astype(x.dtype)
        if V.shape[0] == 1:
            return _directional(f, x, V)
        return _derivatives(f, x, V)

    def contract(self, f, x, v):
        self.size(x.shape[0])
        return _jvp(f, x, v.astype(x.dtype) @ self.directions.astype(x.dtype))


class Hessian(AbstractOperator):
    """Second derivatives `d2f/dx_i dx_j`: the upper triangle `i <= j` in row-major order
    (D (D + 1) / 2 outputs; the lower triangle repeats it and would make the observation
    covariance singular), or only the diagonal `d2f/dx_i^2` with `diagonal=True` (D
    outputs, GPyTorch's `RBFKernelGradGrad`)."""

    order: ClassVar[int] = 2

    diagonal: bool = eqx.field(static=True, default=False)

    def pairs(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        if self.diagonal:
            return np.arange(dim), np.arange(dim)
        return np.triu_indices(dim)

    def size(self, dim: int) -> int:
        return len(self.pairs(dim)[0])

    def apply(self, f, x):
        I, J = self.pairs(x.shape[0])
        if _scalar(f, x):  # forward over reverse: D Hessian-vector products
            return jax.jacfwd(jax.grad(f))(x)[I, J]
        Vi = _unit(I, x.shape[0], x.dtype)
        Vj = _unit(J, x.shape[0], x.dtype)

        def second(vi, vj):
            return jax.jvp(lambda y: jax.jvp(f, (y,), (vj,))[1], (x,), (vi,))[1]

        return jax.vmap(second)(Vi, Vj)

    def contract(self, f, x, v):
        # A weighted sum of second derivatives has no single-product form in general.
        return jnp.tensordot(v.astype(x.dtype), self.apply(f, x), 1)
