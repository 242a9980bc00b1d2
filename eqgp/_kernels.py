import abc
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._parameters import Hyper, like, per_dimension, positive


class AbstractKernel(eqx.Module):
    """A covariance function, written as a scalar function of two points.

    Subclass it and implement `__call__(x1, x2)` for single points of shape `(D,)`;
    eqgp maps it over points (`eqgp.gram`) and differentiates it for derivative
    observations (`eqgp.gradient_gram`, `eqgp.operator_gram`). A kernel never sees a
    batch axis. Kernels combine with `+` and `*`, also with a positive number (`k + 1.0`
    adds a `Constant` kernel, `c * k` scales it), and `sum([...])` works.

    **Smoothness.** `smoothness` is how many times the process's sample paths are
    (mean-square) differentiable: `math.inf` for smooth kernels (the default, also for a
    user kernel), 0 for Matérn-1/2, 1 for Matérn-3/2, 2 for Matérn-5/2; composites take
    the smallest of their parts. An observation operator that needs more derivatives
    (`Gradient` needs 1, `Hessian` 2) raises an error when the covariance is built. A
    user kernel that is only finitely smooth declares it as a class attribute:
    `smoothness = 1`.

    **Trainable fields.** Hyper-parameters are the kernel's inexact-array leaves
    (`eqx.is_inexact_array`): store them as `jnp.asarray(...)` (or unconstrained, as a
    `raw_*` field with a property, as the built-in kernels do). A field holding a Python
    `float`/`int` would be silently frozen, so it triggers a warning at construction;
    mark deliberate constants `eqx.field(static=True)`.
    """

    smoothness: ClassVar[float] = math.inf

    def __check_init__(self):
        frozen = [
            f.name
            for f in dataclasses.fields(self)
            if not f.metadata.get("static", False)
            and isinstance(getattr(self, f.name, None), (float, int))
            and not isinstance(getattr(self, f.name, None), bool)
        ]
        if frozen:
            warnings.warn(
                f"{type(self).__name__} field(s) {', '.join(repr(n) for n in frozen)} hold Python numbers, "
                "which eqgp.fit and optax never train (they are not arrays). Use jnp.asarray(value) "
                "to train a field, or declare it `eqx.field(static=True)` to freeze it on purpose.",
                UserWarning,
                stacklevel=3,
            )

    @abc.abstractmethod
    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        """**Arguments:** two points `x1`, `x2` of shape `(D,)`.

        **Returns:** the covariance `k(x1, x2)`, a scalar.
        """

    def __add__(self, other):
        if isinstance(other, AbstractKernel):
            return Sum(self, other)
        if _is_number(other):
            return self if _is_zero(other) else Sum(self, Constant(other))
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, AbstractKernel):
            return Sum(other, self)
        if _is_number(other):  # 0 + k: so that sum([k1, k2]) works
            return self if _is_zero(other) else Sum(Constant(other), self)
        return NotImplemented

    def __mul__(self, other):
        if isinstance(other, AbstractKernel):
            return Product(self, other)
        if _is_number(other):
            return Product(Constant(other), self)
        return NotImplemented

    def __rmul__(self, other):
        if isinstance(other, AbstractKernel):
            return Product(other, self)
        if _is_number(other):
            return Product(Constant(other), self)
        return NotImplemented


def scalar_call(kernel: "AbstractKernel") -> Callable:
    """`kernel` as `(x1, x2) -> k(x1, x2)`, refusing at trace time a `__call__` that does
    not return a scalar (a user kernel returning a vector would otherwise surface as a
    reshape error deep inside a gram)."""

    def k(x1, x2):
        out = kernel(x1, x2)
        if jnp.shape(out) != ():
            raise TypeError(
                f"{type(kernel).__name__}.__call__ must return a scalar for two points of shape (D,); "
                f"got shape {tuple(jnp.shape(out))}. A kernel sees single points, never a batch "
                "(reduce over dimensions, e.g. with jnp.sum)."
            )
        return out

    return k


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.ndarray, np.generic, jax.Array)) and not isinstance(x, bool)


def _is_zero(x) -> bool:
    return not isinstance(x, jax.core.Tracer) and np.ndim(x) == 0 and float(x) == 0.0


class AbstractVarianceKernel(AbstractKernel):
    """A kernel with a positive output scale stored unconstrained as `raw_variance`."""

    raw_variance: eqx.AbstractVar[Float[Array, ""]]

    @property
    def variance(self) -> Float[Array, ""]:
        return jax.nn.softplus(self.raw_variance)


def _check_pair(x1, x2):
    if x1.ndim != 1 or x2.shape != x1.shape:
        raise ValueError(
            "a kernel is called on two single points of shape (D,); got shapes "
            f"{tuple(x1.shape)} and {tuple(x2.shape)}. Use `eqgp.gram` for sets of points."
        )


class AbstractLengthscaleKernel(AbstractVarianceKernel):
    """A kernel with positive lengthscales (a scalar or one per input dimension, ARD)
    stored unconstrained as `raw_lengthscale`."""

    raw_lengthscale: eqx.AbstractVar[Float[Array, "*D"]]

    @property
    def lengthscale(self) -> Float[Array, "*D"]:
        return jax.nn.softplus(self.raw_lengthscale)


class AbstractStationaryKernel(AbstractLengthscaleKernel):
    """A kernel `variance * profile(s)` of the squared scaled distance
    `s = sum(((x1 - x2) / lengthscale) ** 2)`.

    Working in `s` (smooth at coincident points) rather than in `r = sqrt(s)` keeps
    every derivative block exact and finite where `x1 == x2`.
    """

    @abc.abstractmethod
    def profile(self, s: Float[Array, ""]) -> Float[Array, ""]:
        """The correlation as a function of the squared scaled distance `s`."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        d = (x1 - x2) / per_dimension("lengthscale", self.lengthscale, x1)
        return like(self.variance, x1) * self.profile(jnp.dot(d, d))


class RBF(AbstractStationaryKernel):
    """Squared exponential: `variance * exp(-s / 2)`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (a scalar, or one per input dimension for ARD) and
        `variance`, both positive."""
        self.raw_lengthscale = positive("lengthscale", lengthscale, per="input dimension")
        self.raw_variance = positive("variance", variance)

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


class AbstractMatern(AbstractStationaryKernel):
    """Matérn kernels of half-integer order `nu = order + 1/2`: `variance * G(s)` with the
    profile above; the process is `order` times differentiable (`smoothness = order`)."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]
    order: ClassVar[int]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension) and `variance`, positive."""
        self.raw_lengthscale = positive("lengthscale", lengthscale, per="input dimension")
        self.raw_variance = positive("variance", variance)

    @property
    def smoothness(self) -> float:
        return float(self.order)

    def profile(self, s):
        return _matern(self.order, s)


class Matern12(AbstractMatern):
    """Matérn-1/2 (exponential): `variance * exp(-r)`, `r = sqrt(s)`.

    Its process is not differentiable (`smoothness = 0`): derivative observations are
    refused with it."""

    order: ClassVar[int] = 0


class Matern32(AbstractMatern):
    """Matérn-3/2: `variance * (1 + sqrt(3) r) exp(-sqrt(3) r)`; once differentiable, so
    value and gradient observations are exact (also at coincident points); `Hessian`
    observations are refused."""

    order: ClassVar[int] = 1


class Matern52(AbstractMatern):
    """Matérn-5/2: `variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)`; twice
    differentiable, so value, gradient and Hessian observations are exact (also at
    coincident points, where `d2k/dx1dx2 = 5 / (3 l^2) I`)."""

    order: ClassVar[int] = 2


class RationalQuadratic(AbstractStationaryKernel):
    """Rational quadratic: `variance * (1 + s / (2 alpha)) ** -alpha`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]
    raw_alpha: Float[Array, ""]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0, alpha: ArrayLike = 1.0):
        """**Arguments:** `lengthscale` (scalar or one per dimension), `variance` and the
        scale-mixture parameter `alpha`, all positive."""
        self.raw_lengthscale = positive("lengthscale", lengthscale, per="input dimension")
        self.raw_variance = positive("variance", variance)
        self.raw_alpha = positive("alpha", alpha)

    @property
    def alpha(self) -> Float[Array, ""]:
        return jax.nn.softplus(self.raw_alpha)

    def profile(self, s):
        alpha = like(self.alpha, s)
        return (1.0 + s / (2.0 * alpha)) ** (-alpha)


class Periodic(AbstractLengthscaleKernel):
    """Periodic (exp-sine-squared):
    `variance * exp(-2 * sum_d sin(pi (x1_d - x2_d) / period) ** 2 / lengthscale_d ** 2)`."""

    raw_lengthscale: Float[Array, "*D"]
    raw_variance: Float[Array, ""]
    raw_period: Float[Array, "*D"]

    def __init__(self, lengthscale: Hyper = 1.0, variance: ArrayLike = 1.0, period: Hyper = 1.0):
        """**Arguments:** `lengthscale` and `period` (each a scalar or one per dimension)
        and `variance`, all positive."""
        self.raw_lengthscale = positive("lengthscale", lengthscale, per="input dimension")
        self.raw_variance = positive("variance", variance)
        self.raw_period = positive("period", period, per="input dimension")

    @property
    def period(self):
        return jax.nn.softplus(self.raw_period)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        # sin^2 is even, so no |x1 - x2| (and no kink at coincident points) is needed.
        t = jnp.sin(jnp.pi * (x1 - x2) / per_dimension("period", self.period, x1))
        t = t / per_dimension("lengthscale", self.lengthscale, x1)
        return like(self.variance, x1) * jnp.exp(-2.0 * jnp.dot(t, t))


class _ScaleOnly(AbstractVarianceKernel):
    """A kernel whose only hyper-parameter is its positive `variance`."""

    raw_variance: Float[Array, ""]

    def __init__(self, variance: ArrayLike = 1.0):
        """**Arguments:** `variance`, positive."""
        self.raw_variance = positive("variance", variance)


class Linear(_ScaleOnly):
    """Linear (dot product): `variance * x1 . x2`."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        return like(self.variance, x1) * jnp.dot(x1, x2)


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
        self.raw_variance = positive("variance", variance)
        self.raw_offset = positive("offset", offset)

    @property
    def offset(self):
        return jax.nn.softplus(self.raw_offset)

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        base = like(self.variance, x1) * jnp.dot(x1, x2) + like(self.offset, x1)
        return base**self.degree


class Constant(_ScaleOnly):
    """Constant: `variance` for every pair of points."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        return like(self.variance, x1)


class White(_ScaleOnly):
    """White noise: `variance` where `x1 == x2` exactly, else 0. Its derivative blocks
    are zero (the indicator is flat almost everywhere)."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        same = jax.lax.stop_gradient(jnp.all(x1 == x2))
        return jnp.where(same, like(self.variance, x1), jnp.zeros((), x1.dtype))


class _AbstractPair(AbstractKernel):
    """Two kernels combined pointwise: as smooth as the rougher of the two."""

    kernel1: AbstractKernel
    kernel2: AbstractKernel

    @property
    def smoothness(self) -> float:
        return min(self.kernel1.smoothness, self.kernel2.smoothness)


class Sum(_AbstractPair):
    """`k1(x1, x2) + k2(x1, x2)`; what `k1 + k2` builds."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel1(x1, x2) + self.kernel2(x1, x2)


class Product(_AbstractPair):
    """`k1(x1, x2) * k2(x1, x2)`; what `k1 * k2` and `c * k` build."""

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel1(x1, x2) * self.kernel2(x1, x2)


class Warped(AbstractKernel):
    """`kernel(warp(x1), warp(x2))` for any `warp` mapping a point to a point (an
    `eqx.nn.MLP`, a chain ending in `eqgp.nn.SumCumProd`, a user Module...). Derivative
    observations differentiate through the warp.

    Smoothness: the kernel's, or the warp's where it is known: a `smoothness` attribute
    on the warp, or an `eqx.nn.MLP` whose activation is `jax.nn.relu` (piecewise linear:
    0). Otherwise the warp is taken as smooth."""

    kernel: AbstractKernel
    warp: Callable

    @property
    def smoothness(self) -> float:
        return min(self.kernel.smoothness, _warp_smoothness(self.warp))

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        return self.kernel(self.warp(x1), self.warp(x2))


def _warp_smoothness(warp) -> float:
    declared = getattr(warp, "smoothness", None)
    if isinstance(declared, (int, float)):
        return float(declared)
    if isinstance(warp, eqx.nn.MLP) and warp.activation in (jax.nn.relu, jax.nn.relu6, jax.nn.hard_tanh):
        return 0.0
    if isinstance(warp, eqx.nn.Sequential):
        return min((_warp_smoothness(layer) for layer in warp.layers), default=math.inf)
    return math.inf


class Invariant(AbstractKernel):
    """A kernel invariant under a finite group `G` acting on the inputs: for molecules, the
    permutations of identical atoms acting on the Cartesian coordinates (sGDML's `perms`).

    - `one_sided=True` (default): `k_G(x1, x2) = (1/|G|) sum_g k(x1, g x2)`, |G| kernel
      evaluations per pair (sGDML's symmetrised kernel). It is a symmetric positive
      semi-definite kernel when `k(g x1, g x2) = k(x1, x2)` for every `g` (the base kernel
      is itself unchanged by moving both points together: an isotropic kernel on
      Cartesian coordinates or on interatomic distances, a single-lengthscale kernel
      warped through a permutation-invariant descriptor).
    - `one_sided=False`: `(1/|G|^2) sum_h sum_g k(h x1, g x2)`, |G|^2 evaluations per pair,
      a covariance for any base kernel (e.g. ARD lengthscales).

    Either way `k_G(g x1, x2) = k_G(x1, g x2) = k_G(x1, x2)`, and every derivative block
    (forces, Hessians) still comes from autodiff of this function. The group elements are
    evaluated as one batch (`vmap`), not a Python loop. The mean over the group keeps the
    prior variance at the base kernel's for a point that the group leaves unchanged and
    lowers it towards `1/|G|` of it for a point far from all its images (the signal
    variance hyper-parameter absorbs this when it is trained).

    Give the group as `permutations` `(G, D)`, each row a permutation of `range(D)` with
    `(g x)[i] = x[perm[i]]`, or as `maps` `(G, D, D)` (constant matrices, `g x = M x`;
    not trained). The group must contain the identity and be closed under composition
    (checked for permutations).
    """

    kernel: AbstractKernel
    maps: Float[Array, "G D D"] | None
    permutations: tuple[tuple[int, ...], ...] | None = eqx.field(static=True)
    one_sided: bool = eqx.field(static=True)

    def __init__(self, kernel: AbstractKernel, permutations=None, *, maps=None, one_sided: bool = True):
        if not isinstance(kernel, AbstractKernel):
            raise TypeError(f"`kernel` must be an eqgp kernel; got {type(kernel).__name__}.")
        if (permutations is None) == (maps is None):
            raise ValueError("give exactly one of `permutations` (G, D) and `maps` (G, D, D).")
        if not isinstance(one_sided, bool):
            raise TypeError(f"`one_sided` must be a bool; got {one_sided!r}.")
        self.kernel = kernel
        self.one_sided = one_sided
        if permutations is not None:
            P = np.asarray(permutations)
            if P.ndim != 2 or P.shape[0] == 0 or not np.issubdtype(P.dtype, np.integer):
                raise ValueError(
                    f"`permutations` must be a non-empty (G, D) array of integers; got {np.shape(permutations)} "
                    f"of {P.dtype}."
                )
            D = P.shape[1]
            ident = np.arange(D)
            for row in P:
                if not np.array_equal(np.sort(row), ident):
                    raise ValueError(
                        f"`permutations`: every row must be a permutation of range({D}); got {row.tolist()}."
                    )
            rows = {tuple(int(i) for i in row) for row in P}
            if len(rows) != P.shape[0]:
                raise ValueError("`permutations` has repeated rows (each group element once).")
            if tuple(ident) not in rows:
                raise ValueError("`permutations` must contain the identity (a group does).")
            for a in rows:
                for b in rows:
                    if tuple(np.asarray(a)[list(b)]) not in rows:
                        raise ValueError(
                            "`permutations` is not closed under composition (not a group): add the compositions, "
                            "e.g. with eqgp.kernels.Invariant.closure."
                        )
            self.permutations = tuple(tuple(int(i) for i in row) for row in P)
            self.maps = None
        else:
            M = jnp.asarray(maps)
            if M.ndim != 3 or M.shape[0] == 0 or M.shape[1] != M.shape[2] or not jnp.issubdtype(M.dtype, jnp.floating):
                raise ValueError(f"`maps` must be a non-empty (G, D, D) float array; got {M.shape} of {M.dtype}.")
            self.maps = M
            self.permutations = None

    @staticmethod
    def closure(permutations) -> np.ndarray:
        """The smallest group of permutations containing `permutations` and the identity."""
        P = np.asarray(permutations)
        if P.ndim != 2 or not np.issubdtype(P.dtype, np.integer):
            raise ValueError(f"`permutations` must be a (G, D) array of integers; got {P.shape} of {P.dtype}.")
        group = {tuple(range(P.shape[1]))} | {tuple(int(i) for i in row) for row in P}
        while True:
            new = {tuple(np.asarray(a)[list(b)]) for a in group for b in group} - group
            if not new:
                return np.asarray(sorted(group))
            group |= new

    @property
    def size(self) -> int:
        return len(self.permutations) if self.permutations is not None else self.maps.shape[0]

    @property
    def smoothness(self) -> float:
        return self.kernel.smoothness

    def _images(self, x: Float[Array, " D"]) -> Float[Array, "G D"]:
        if self.permutations is not None:
            return x[jnp.asarray(self.permutations)]
        return jax.lax.stop_gradient(self.maps).astype(x.dtype) @ x

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        D = len(self.permutations[0]) if self.permutations is not None else self.maps.shape[-1]
        if x1.shape[-1] != D:
            raise ValueError(
                f"eqgp.kernels.Invariant: the group acts on {D} dimensions; the points have {x1.shape[-1]}."
            )
        images2 = self._images(x2)
        if self.one_sided:
            return jnp.mean(jax.vmap(lambda z: self.kernel(x1, z))(images2))
        images1 = self._images(x1)
        return jnp.mean(jax.vmap(lambda a: jax.vmap(lambda b: self.kernel(a, b))(images2))(images1))


class ActiveDims(AbstractKernel):
    """`kernel(x1[dims], x2[dims])`: a kernel that sees only some input dimensions (as
    GPyTorch's `active_dims`), e.g. one kernel per group of inputs in a sum.

    The derivatives along the other dimensions are structurally zero: autodiff never
    differentiates the kernel along them, and their blocks come out as exact zeros (a
    gradient observation along an unused dimension then carries only its noise)."""

    kernel: AbstractKernel
    dims: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, kernel: AbstractKernel, dims):
        """**Arguments:** `kernel`, and `dims`: an int or a sequence of distinct
        non-negative input-dimension indices the kernel sees (in that order)."""
        if not isinstance(kernel, AbstractKernel):
            raise TypeError(f"`kernel` must be an eqgp kernel; got {type(kernel).__name__}.")
        dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        if not dims or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ValueError(f"`dims` must be non-negative integers; got {dims!r}.")
        if len(set(dims)) != len(dims):
            raise ValueError(f"`dims` must be distinct; got {dims!r}.")
        self.kernel = kernel
        self.dims = tuple(int(d) for d in dims)

    @property
    def smoothness(self) -> float:
        return self.kernel.smoothness

    def __call__(self, x1: Float[Array, " D"], x2: Float[Array, " D"]) -> Float[Array, ""]:
        _check_pair(x1, x2)
        if max(self.dims) >= x1.shape[0]:
            raise ValueError(
                f"ActiveDims(dims={self.dims}) asks for dimension {max(self.dims)} but the inputs have "
                f"{x1.shape[0]} dimensions."
            )
        idx = np.asarray(self.dims)
        return self.kernel(x1[idx], x2[idx])
