"""The native linear-recurrence primitive and `sumcumprod` built on it.

`linear_recurrence(a, b, reverse=...)` is a JAX primitive whose every rule calls back
into the primitive: the JVP is the same recurrence with another `b`, the transpose is
the recurrence in the other direction with `a` shifted by one, and the batching rule
moves the batch axis to the front (the native kernels treat every leading axis as a
row). Each direction lowers to one XLA FFI custom call into the C++ (CPU) or CUDA
handlers, so `jit`, `vmap`, `grad`, `jvp`, `jacfwd`, `jacrev` and `hessian` to any
order all run the native kernels. Where no handler exists (extension not built,
CUDA module absent, another platform) the primitive lowers to a pure-JAX associative
scan, with a one-time warning.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, Float

from ._native import BUILT_PLATFORMS, native_platforms

_TARGET = "eqgp_linear_recurrence"
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _shift(z, reverse: bool):
    """z_{i+1} (reverse) or z_{i-1} (forward) along the last axis, zero-filled."""
    pad = [(0, 0)] * (z.ndim - 1)
    if reverse:
        return jnp.pad(z[..., 1:], pad + [(0, 1)])
    return jnp.pad(z[..., :-1], pad + [(1, 0)])


def linear_recurrence_reference(a, b, *, reverse: bool):
    """Pure-JAX `linear_recurrence` by `jax.lax.associative_scan` over affine maps."""

    def compose(p, q):  # p applied first, then q
        (a1, b1), (a2, b2) = p, q
        return a2 * a1, a2 * b1 + b2

    if a.shape[-1] == 0:
        return b
    return jax.lax.associative_scan(compose, (a, b), reverse=reverse, axis=a.ndim - 1)[1]


linear_recurrence_p = Primitive("eqgp_linear_recurrence")


def _jit_impl(prim):
    """Eager application of a primitive: one cached jit per (bool) parameter set."""

    @functools.cache
    def jitted(params):
        return jax.jit(lambda *args: prim.bind(*args, **dict(params)))

    return lambda *args, **params: jitted(tuple(sorted(params.items())))(*args)


def _native_lowering(target: str):
    rule = jax.ffi.ffi_lowering(target)

    def lowering(ctx, *args, **params):
        # Attributes normalised to exact C types: an int where a bool is bound fails, and
        # True == 1 would collide in jax's compilation cache.
        return rule(ctx, *args, **{k: bool(v) for k, v in params.items()})

    return lowering


linear_recurrence_p.def_impl(_jit_impl(linear_recurrence_p))
linear_recurrence_p.def_abstract_eval(lambda a, b, *, reverse: jax.core.ShapedArray(b.shape, b.dtype))


_fallback_warned = False


def _fallback(a, b, *, reverse):
    global _fallback_warned
    if not _fallback_warned:
        _fallback_warned = True
        warnings.warn(
            "eqgp: no native linear-recurrence handler for this platform (native handlers: "
            f"{native_platforms() or 'none, the extension is not built'}); using the pure-JAX "
            "associative scan, which is correct but much slower.",
            RuntimeWarning,
            stacklevel=2,
        )
    return linear_recurrence_reference(a, b, reverse=reverse)


mlir.register_lowering(linear_recurrence_p, mlir.lower_fun(_fallback, multiple_results=False))

# The CUDA kernels give each row one thread block (or one warp): a few very long rows leave
# most of the GPU idle, where XLA's associative scan is several times faster (numbers in
# docs/performance.md); with many rows the native kernel wins. So on CUDA, arrays of fewer
# than `_CUDA_FEW_ROWS` rows that are at least `_CUDA_LONG_ROW` long lower to the scan.
_CUDA_FEW_ROWS = 64
_CUDA_LONG_ROW = 1 << 18


def _cuda_prefers_scan(shape) -> bool:
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return len(shape) > 0 and rows < _CUDA_FEW_ROWS and shape[-1] >= _CUDA_LONG_ROW


def _cuda_lowering(native, reference):
    """`native` (a lowering rule), or `reference` lowered (a function of the operands) for
    the few-long-rows shapes of `_cuda_prefers_scan`."""
    scan = mlir.lower_fun(reference, multiple_results=False)

    def lowering(ctx, *args, **params):
        if _cuda_prefers_scan(ctx.avals_in[0].shape):
            return scan(ctx, *args, **params)
        return native(ctx, *args, **params)

    return lowering


for _platform in BUILT_PLATFORMS:
    rule = _native_lowering(_TARGET)
    if _platform == "cuda":
        rule = _cuda_lowering(rule, lambda a, b, *, reverse: linear_recurrence_reference(a, b, reverse=bool(reverse)))
    mlir.register_lowering(linear_recurrence_p, rule, platform=_platform)


def _jvp(primals, tangents, *, reverse):
    a, b = primals
    da, db = tangents
    z = linear_recurrence_p.bind(a, b, reverse=reverse)
    if type(da) is ad.Zero and type(db) is ad.Zero:
        return z, ad.Zero.from_primal_value(z)
    rhs = None
    if type(da) is not ad.Zero:
        rhs = da * _shift(z, reverse)
    if type(db) is not ad.Zero:
        rhs = db if rhs is None else rhs + db
    return z, linear_recurrence_p.bind(a, rhs, reverse=reverse)


def _transpose(ct, a, b, *, reverse):
    if ad.is_undefined_primal(a):
        raise NotImplementedError("linear_recurrence is linear in b only")
    if type(ct) is ad.Zero:
        return None, ad.Zero(b.aval)
    # z = L_a b with L_a lower (or upper) bidiagonal-inverse; L_a^T runs the other way
    # with a shifted by one.
    return None, linear_recurrence_p.bind(_shift(a, not reverse), ct, reverse=not reverse)


def _rows_batcher(prim):
    """The batching rule of a primitive whose native kernel treats every leading axis as
    a row: batch axes to the front, unbatched operands broadcast, one call."""

    def rule(args, dims, **params):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        moved = [
            jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size,) + x.shape)
            for x, d in zip(args, dims)
        ]
        return prim.bind(*moved, **params), 0

    return rule


ad.primitive_jvps[linear_recurrence_p] = _jvp
ad.primitive_transposes[linear_recurrence_p] = _transpose
batching.primitive_batchers[linear_recurrence_p] = _rows_batcher(linear_recurrence_p)


# Half precisions are computed in float32 (the recurrence's products lose everything in
# float16) and returned in the input's dtype.
_HALF_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def _check_float(name: str, x, half: bool = False) -> Array:
    if not isinstance(x, (jax.Array, np.ndarray, np.generic, float, list, tuple)):
        raise TypeError(f"`{name}` must be an array; got {type(x).__name__}.")
    x = jnp.asarray(x)
    if x.dtype not in _FLOAT_DTYPES and not (half and x.dtype in _HALF_DTYPES):
        allowed = "float16, bfloat16, float32 or float64" if half else "float32 or float64"
        raise TypeError(
            f"`{name}` must have dtype {allowed}; got {x.dtype}. Cast it first, e.g. `{name}.astype(jnp.float32)`."
        )
    if x.ndim == 0:
        raise ValueError(
            f"`{name}` must have at least one axis (the recurrence runs along the last axis); got a scalar."
        )
    return x


def linear_recurrence(
    a: Float[Array | np.ndarray, "*batch n"], b: Float[Array | np.ndarray, "*batch n"], *, reverse: bool
) -> Float[Array, "*batch n"]:
    """The first-order linear recurrence along the last axis.

    `reverse=False`: `z[..., i] = a[..., i] * z[..., i - 1] + b[..., i]`;
    `reverse=True`: `z[..., i] = a[..., i] * z[..., i + 1] + b[..., i]`; the value past
    the end is zero. Leading axes are batch axes.

    **Arguments:**

    - `a`: multipliers, shape `(..., n)`, float32 or float64.
    - `b`: offsets, same shape and dtype as `a`.
    - `reverse`: a Python bool, the direction of the recurrence.

    **Returns:**

    `z`, same shape and dtype as `b`.
    """
    if not isinstance(reverse, (bool, np.bool_)):
        raise TypeError(f"`reverse` must be a Python bool; got {type(reverse).__name__}.")
    a = _check_float("a", a)
    b = _check_float("b", b)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            "`a` and `b` must have the same shape and dtype; got "
            f"a: {a.dtype}{list(a.shape)} and b: {b.dtype}{list(b.shape)}."
        )
    return linear_recurrence_p.bind(a, b, reverse=bool(reverse))


# --- sumcumprod and its fused Jacobian ----------------------------------------------
#
# sumcumprod(x) = linear_recurrence(x, x, reverse=True) = z. Its Jacobian at x maps a
# tangent t to J t = linear_recurrence(x, t * (1 + shift(z)), reverse=True), and the
# transpose is J^T t = (1 + shift(z)) * linear_recurrence(shift(x), t, reverse=False).
# Built from the generic rules each of these costs a recurrence plus two or three
# elementwise passes over the array; `sumcumprod_jvp_p(x, t)` lowers to the recurrence
# for z and one fused native call `eqgp_sumcumprod_jvp(x, t, z)` (the same operands on
# CPU and CUDA). In reverse mode z is the forward's output, which XLA computes once.

sumcumprod_jvp_p = Primitive("eqgp_sumcumprod_jvp")


def _scp_jvp_reference(x, t, *, transpose):
    scale = 1 + _shift(linear_recurrence_p.bind(x, x, reverse=True), True)
    if transpose:
        return scale * linear_recurrence_p.bind(_shift(x, False), t, reverse=False)
    return linear_recurrence_p.bind(x, t * scale, reverse=True)


sumcumprod_jvp_p.def_impl(_jit_impl(sumcumprod_jvp_p))


def _scp_abstract_eval(x, t, *, transpose):
    if not (x.shape == t.shape and x.dtype == t.dtype):
        raise ValueError(
            "sumcumprod_jvp_p: `x` and `t` must share shape and dtype; got "
            f"x: {x.dtype}{list(x.shape)}, t: {t.dtype}{list(t.shape)}."
        )
    return jax.core.ShapedArray(t.shape, t.dtype)


sumcumprod_jvp_p.def_abstract_eval(_scp_abstract_eval)

mlir.register_lowering(
    sumcumprod_jvp_p, mlir.lower_fun(_scp_jvp_reference, multiple_results=False)
)  # the fallback: its recurrence warns once where no native handler exists


def _scp_jvp_native(x, t, *, transpose):
    # z = sumcumprod(x) goes in as an operand that XLA allocates (XLA:GPU refused FFI
    # scratch memory): the native recurrence first, then the fused product.
    z = linear_recurrence_p.bind(x, x, reverse=True)
    call = jax.ffi.ffi_call("eqgp_sumcumprod_jvp", jax.ShapeDtypeStruct(t.shape, t.dtype))
    return call(x, t, z, transpose=bool(transpose))


for _platform in BUILT_PLATFORMS:
    rule = mlir.lower_fun(_scp_jvp_native, multiple_results=False)
    if _platform == "cuda":
        rule = _cuda_lowering(rule, _scp_jvp_reference)
    mlir.register_lowering(sumcumprod_jvp_p, rule, platform=_platform)


def _scp_jvp_rule(primals, tangents, *, transpose):
    x, t = primals
    dx, dt = tangents
    out = sumcumprod_jvp_p.bind(x, t, transpose=transpose)
    tangent = None
    if type(dt) is not ad.Zero:  # linear in t: the fused op again
        tangent = sumcumprod_jvp_p.bind(x, dt, transpose=transpose)
    if type(dx) is not ad.Zero:  # through x: the generic rules
        _, rest = jax.jvp(lambda x_: _scp_jvp_reference(x_, t, transpose=transpose), (x,), (dx,))
        tangent = rest if tangent is None else tangent + rest
    if tangent is None:
        return out, ad.Zero.from_primal_value(out)
    return out, tangent


def _scp_transpose(ct, x, t, *, transpose):
    if ad.is_undefined_primal(x):
        raise NotImplementedError("the sumcumprod Jacobian product is linear in t only")
    if type(ct) is ad.Zero:
        return None, ad.Zero(t.aval)
    return None, sumcumprod_jvp_p.bind(x, ct, transpose=not transpose)


ad.primitive_jvps[sumcumprod_jvp_p] = _scp_jvp_rule
ad.primitive_transposes[sumcumprod_jvp_p] = _scp_transpose
batching.primitive_batchers[sumcumprod_jvp_p] = _rows_batcher(sumcumprod_jvp_p)


@jax.custom_jvp
def _sumcumprod(x):
    return linear_recurrence_p.bind(x, x, reverse=True)


@_sumcumprod.defjvp
def _sumcumprod_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _sumcumprod(x), sumcumprod_jvp_p.bind(x, dx, transpose=False)


def _axis(x: Array, axis) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"`axis` must be an int; got {type(axis).__name__}.")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"`axis` {axis} is out of range for an array of rank {x.ndim} (shape {x.shape}).")
    return int(axis) % x.ndim


def _along(fn, x: Array, axis: int) -> Array:
    """`fn` (which works along the last axis) applied along `axis`."""
    if axis == x.ndim - 1:
        return fn(x)
    return jnp.moveaxis(fn(jnp.moveaxis(x, axis, -1)), -1, axis)


def sumcumprod(
    x: Float[Array | np.ndarray, "*batch n"], axis: int = -1, reverse: bool = True
) -> Float[Array, "*batch n"]:
    """`y[..., i] = sum_{j >= i} prod_{k=i..j} x[..., k]` along `axis` (`reverse=True`,
    the default), or the forward form `y[..., i] = sum_{j <= i} prod_{k=j..i} x[..., k]`
    (`reverse=False`, the same recurrence run the other way).

    Equal to `linear_recurrence(x, x, reverse=reverse)` along `axis`. Runs the native
    kernels (one custom call, also under `vmap`), and is closed under `jit`, `vmap` and
    every order of forward and reverse differentiation. In the reverse form a
    Jacobian-vector or vector-Jacobian product is one further fused native call on `x`,
    the cotangent and the forward's output; the forward form differentiates through the
    recurrence's own rules.
    `sumcumprod(jnp.ones(10))` is `[10, 9, ..., 1]`. An `axis` other than the last costs
    two transposes.

    **Arguments:**

    - `x`: float32 or float64 (float16 and bfloat16 are computed in float32 and returned in
      their own dtype), at least one axis; the other axes are batch axes.
    - `axis`: the axis the recurrence runs along (default: the last).
    - `reverse`: a Python bool, the direction (default: from the end, as above).

    **Returns:**

    An array of the shape and dtype of `x`.
    """
    x = _check_float("x", x, half=True)
    if not isinstance(reverse, (bool, np.bool_)):
        raise TypeError(f"`reverse` must be a Python bool; got {type(reverse).__name__}.")
    axis = _axis(x, axis)
    if x.dtype in _HALF_DTYPES:
        return sumcumprod(x.astype(jnp.float32), axis, bool(reverse)).astype(x.dtype)
    if reverse:
        return _along(_sumcumprod, x, axis)
    return _along(lambda v: linear_recurrence_p.bind(v, v, reverse=False), x, axis)


def sumcumprod_reference(
    x: Float[Array | np.ndarray, "*batch n"], axis: int = -1, reverse: bool = True
) -> Float[Array, "*batch n"]:
    """Pure-JAX `sumcumprod` (associative scan); the reference the native op is tested on."""
    x = _check_float("x", x, half=True)
    if x.dtype in _HALF_DTYPES:
        return sumcumprod_reference(x.astype(jnp.float32), axis, reverse).astype(x.dtype)
    return _along(lambda v: linear_recurrence_reference(v, v, reverse=bool(reverse)), x, _axis(x, axis))
