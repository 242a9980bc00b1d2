import abc
import functools
import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

# A constrained hyper-parameter as given to a constructor: a number, an array or a list.
Hyper = ArrayLike | Sequence[float]


def _inverse_softplus(y):
    return y + jnp.log(-jnp.expm1(-y))


def _positive(name: str, value, *, vector: bool = False) -> Array:
    """Validate a constrained positive hyper-parameter and return its raw (unconstrained) value."""
    if isinstance(value, jax.core.Tracer):
        v = jnp.asarray(value)
        v = eqx.error_if(v, jnp.any(v <= 0), f"`{name}` must be positive.")
    else:
        v = np.asarray(value)
        if not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            raise TypeError(f"`{name}` must be a real number; got {value!r}.")
        if v.ndim > (1 if vector else 0):
            raise ValueError(
                f"`{name}` must be a scalar{' or a 1-D array (one per input dimension)' if vector else ''}; "
                f"got shape {v.shape}."
            )
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"`{name}` must be positive and finite; got {value!r}.")
        v = jnp.asarray(v, dtype=float)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(float)
    return _inverse_softplus(v)


def _like(param: Array, x: Array) -> Array:
    # Hyper-parameters follow the inputs' dtype, so float32 data works with
    # float64-default parameters under strict dtype promotion.
    return param.astype(x.dtype)


class AbstractKernel(eqx.Module):
    """A covariance function, written as a scalar function of two points.

    Subclass it and implement `__call__(x1, x2)` for single points of shape `(D,)`;
    eqgp maps it over points (`eqgp.gram`) and differentiates it for derivative
    observations (`eqgp.gradient_gram`, `eqgp.operator_gram`). A kernel never sees a
    batch axis. Kernels combine with `+` and `*` (also with a positive scalar, `c * k`),
    and `sum([...])` works.
    """

    @abc.abstractmethod
    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        """**Arguments:** two points `x1`, `x2` of shape `(D,)`.

        **Returns:** the covariance `k(x1, x2)`, a scalar.
        """

    def __add__(self, other):
        if isinstance(other, AbstractKernel):
            return Sum(self, other)
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, (int, float)) and other == 0:  # so that sum([k1, k2]) works
            return self
        if isinstance(other, AbstractKernel):
            return Sum(other, self)
        return NotImplemented

    def __mul__(self, other):
        if isinstance(other, AbstractKernel):
            return Product(self, other)
        if isinstance(other, (int, float, np.ndarray, np.generic, jax.Array)):
            return Product(Constant(other), self)
        return NotImplemented

    def __rmul__(self, other):
        if isinstance(other, AbstractKernel):
            return Product(other, self)
        if isinstance(other, (int, float, np.ndarray, np.generic, jax.Array)):
            return Product(Constant(other), self)
        return NotImplemented


class AbstractVarianceKernel(AbstractKernel):
    """A kernel with a positive output scale stored unconstrained as `raw_variance`."""

    raw_variance: eqx.AbstractVar[Float[Array, ""]]

    @property
    def variance(self) -> Float[Array, ""]:
        return jax.nn.softplus(self.raw_variance)


def _lengthscale(ls: Array, x1: Array) -> Array:
    if ls.ndim == 1 and ls.shape[0] != x1.shape[-1]:
        raise ValueError(
            f"the kernel has {ls.shape[0]} ARD lengthscales but the inputs have "
            f"{x1.shape[-1]} dimensions; give one lengthscale per input dimension or a scalar."
        )
    return _like(ls, x1)


def _check_pair(x1, x2):
    if x1.ndim != 1 or x2.shape != x1.shape:
        raise ValueError(
            "a kernel is called on two single points of shape (D,); got shapes "
            f"{tuple(x1.shape)} and {tuple(x2.shape)}. Use `eqgp.gram` for sets of points."
        )


class AbstractStationaryKernel(AbstractVarianceKernel):
    """A kernel `variance * profile(s)` of the squared scaled distance
    `s = sum(((x1 - x2) / lengthscale) ** 2)`.

    Working in `s` (smooth at coincident points) rather than in `r = sqrt(s)` keeps
    every derivative block exact and finite where `x1 == x2`.
    """

    raw_lengthscale: eqx.AbstractVar[Float[Array, "*D"]]

    @property
    def lengthscale(self) -> Float[Array, "*D"]:
        return jax.nn.softplus(self.raw_lengthscale)

    @abc.abstractmethod
    def profile(self, s: Float[Array, ""]) -> Float[Array, ""]:
        """The correlation as a function of the squared scaled distance `s`."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        d = (x1 - x2) / _lengthscale(self.lengthscale, x1)
        return _like(self.variance, x1) * self.profile(jnp.sum(d * d))


class RBF(AbstractStationaryKernel):
    """Squared exponential: `variance * exp(-s / 2)`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (a scalar, or one per input dimension for ARD) and
        `variance`, both positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)

    def profile(self, s):
        return jnp.exp(-0.5 * s)


# Matérn profiles in s = r^2. With G_p(s) = P_p(sqrt(s)) exp(-sqrt(s)) for the
# half-integer orders nu = p + 1/2 (G_0 = e^-u, G_1 = (1 + u) e^-u,
# G_2 = (s + 3u + 3) e^-u, u = sqrt(s)), the Bessel identity
# d/dr [r^nu K_nu(r)] = -r^nu K_{nu-1}(r) gives dG_p/ds = -G_{p-1}/2. Written with
# that rule, every derivative stays finite at s = 0 as far as the process is
# differentiable, where autodiff through sqrt gives NaN and clamping gives 0.
@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _matern_profile(p: int, s):
    u = jnp.sqrt(s)
    poly = {0: 1.0, 1: 1.0 + u, 2: s + 3.0 * u + 3.0}[p]
    return poly * jnp.exp(-u)


@_matern_profile.defjvp
def _matern_profile_jvp(p, primals, tangents):
    (s,), (ds,) = primals, tangents
    y = _matern_profile(p, s)
    if p > 0:
        return y, -0.5 * _matern_profile(p - 1, s) * ds
    # dG_0/ds = -e^-u / (2u) is infinite at s = 0, where the tangent of a squared
    # distance is zero too; the products it enters (Matérn-3/2 second derivatives)
    # tend to 0 there, so use 0. (Matérn-1/2 itself is not differentiable at 0.)
    pos = s > 0
    safe = jnp.where(pos, s, 1.0)
    dy = jnp.where(pos, -0.5 * jnp.exp(-jnp.sqrt(safe)) / jnp.sqrt(safe), 0.0)
    return y, dy * ds


def _matern(p: int, s):
    nu = p + 0.5
    return _matern_profile(p, 2.0 * nu * s) / float(math.prod(range(1, 2 * p, 2)))


class Matern12(AbstractStationaryKernel):
    """Matérn-1/2 (exponential): `variance * exp(-r)`, `r = sqrt(s)`.

    Its process is not differentiable, so derivative observations are not meaningful
    with it (its derivative blocks at coincident points are not the limit of anything).
    """

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension) and `variance`, positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)

    def profile(self, s):
        return _matern(0, s)


class Matern32(AbstractStationaryKernel):
    """Matérn-3/2: `variance * (1 + sqrt(3) r) exp(-sqrt(3) r)`; once differentiable, so
    value and gradient observations are exact (also at coincident points)."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension) and `variance`, positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)

    def profile(self, s):
        return _matern(1, s)


class Matern52(AbstractStationaryKernel):
    """Matérn-5/2: `variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)`; twice
    differentiable, so value and gradient observations are exact (also at coincident
    points, where `d2k/dx1dx2 = 5 / (3 l^2) I`)."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension) and `variance`, positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)

    def profile(self, s):
        return _matern(2, s)


class RationalQuadratic(AbstractStationaryKernel):
    """Rational quadratic: `variance * (1 + s / (2 alpha)) ** -alpha`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]
    raw_alpha: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0, alpha: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension), `variance` and the
        scale-mixture parameter `alpha`, all positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)
        self.raw_alpha = _positive("alpha", alpha)

    @property
    def alpha(self) -> Float[Array, ""]:
        return jax.nn.softplus(self.raw_alpha)

    def profile(self, s):
        alpha = _like(self.alpha, s)
        return (1.0 + s / (2.0 * alpha)) ** (-alpha)


class Periodic(AbstractVarianceKernel):
    """Periodic (exp-sine-squared):
    `variance * exp(-2 * sum_d sin(pi (x1_d - x2_d) / period) ** 2 / lengthscale_d ** 2)`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]
    raw_period: Float[Array, "*D"]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0, period: Hyper = 1.0):
        """**Arguments:** `lengthscale` and `period` (each a scalar or one per dimension)
        and `variance`, all positive."""
        self.raw_lengthscale = _positive("lengthscale", lengthscale, vector=True)
        self.raw_variance = _positive("variance", variance)
        self.raw_period = _positive("period", period, vector=True)

    @property
    def lengthscale(self):
        return jax.nn.softplus(self.raw_lengthscale)

    @property
    def period(self):
        return jax.nn.softplus(self.raw_period)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        # sin^2 is even, so no |x1 - x2| (and no kink at coincident points) is needed.
        t = jnp.sin(jnp.pi * (x1 - x2) / _lengthscale(self.period, x1))
        t = t / _lengthscale(self.lengthscale, x1)
        return _like(self.variance, x1) * jnp.exp(-2.0 * jnp.sum(t * t))


class Linear(AbstractVarianceKernel):
    """Linear (dot product): `variance * x1 . x2`."""

    raw_variance: Float[Array, ""]

    def __init__(self, variance: ArrayLike = 1.0):
        """**Arguments:** `variance`, positive."""
        self.raw_variance = _positive("variance", variance)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        return _like(self.variance, x1) * jnp.dot(x1, x2)


class Polynomial(AbstractVarianceKernel):
    """Polynomial: `(variance * x1 . x2 + offset) ** degree`."""

    raw_variance: Float[Array, ""]
    raw_offset: Float[Array, ""]
    degree: int = eqx.field(static=True)

    def __init__(self, degree: int = 2, variance: ArrayLike = 1.0, offset: ArrayLike = 1.0):
        """**Arguments:** the integer `degree` (>= 1), `variance` and `offset`, positive."""
        if not isinstance(degree, (int, np.integer)) or isinstance(degree, bool) or degree < 1:
            raise ValueError(f"`degree` must be an integer >= 1; got {degree!r}.")
        self.degree = int(degree)
        self.raw_variance = _positive("variance", variance)
        self.raw_offset = _positive("offset", offset)

    @property
    def offset(self):
        return jax.nn.softplus(self.raw_offset)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        base = _like(self.variance, x1) * jnp.dot(x1, x2) + _like(self.offset, x1)
        return base**self.degree


class Constant(AbstractVarianceKernel):
    """Constant: `variance` for every pair of points."""

    raw_variance: Float[Array, ""]

    def __init__(self, variance: ArrayLike = 1.0):
        """**Arguments:** `variance`, positive."""
        self.raw_variance = _positive("variance", variance)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        return _like(self.variance, x1)


class White(AbstractVarianceKernel):
    """White noise: `variance` where `x1 == x2` exactly, else 0. Its derivative blocks
    are zero (the indicator is flat almost everywhere)."""

    raw_variance: Float[Array, ""]

    def __init__(self, variance: ArrayLike = 1.0):
        """**Arguments:** `variance`, positive."""
        self.raw_variance = _positive("variance", variance)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        same = jax.lax.stop_gradient(jnp.all(x1 == x2))
        return jnp.where(same, _like(self.variance, x1), jnp.zeros((), x1.dtype))


class Sum(AbstractKernel):
    """`k1(x1, x2) + k2(x1, x2)`; what `k1 + k2` builds."""

    kernel1: AbstractKernel
    kernel2: AbstractKernel

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel1(x1, x2) + self.kernel2(x1, x2)


class Product(AbstractKernel):
    """`k1(x1, x2) * k2(x1, x2)`; what `k1 * k2` and `c * k` build."""

    kernel1: AbstractKernel
    kernel2: AbstractKernel

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel1(x1, x2) * self.kernel2(x1, x2)


class Warped(AbstractKernel):
    """`kernel(warp(x1), warp(x2))` for any `warp` mapping a point to a point (an
    `eqx.nn.MLP`, a chain ending in `eqgp.nn.SumCumProd`, a user Module...). Derivative
    observations differentiate through the warp."""

    kernel: AbstractKernel
    warp: Callable

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel(self.warp(x1), self.warp(x2))
