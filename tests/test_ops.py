import functools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest
from helpers import assert_close, lowered_custom_calls, sumcumprod_quadratic, tol
from hypothesis import given, settings, strategies as st
from jax.test_util import check_grads

import eqgp
from eqgp.ops import linear_recurrence, sumcumprod, sumcumprod_reference


def test_native_cpu_handler_is_built():
    # The extension must be there: otherwise every test below would only exercise the fallback.
    assert "cpu" in eqgp.ops.NATIVE_PLATFORMS


def test_ones():
    assert_close(sumcumprod(jnp.ones(10)), np.arange(10, 0, -1))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (2,), (1025,), (3, 0), (3, 7), (2, 3, 5), (4, 1025)])
def test_forward_matches_references(dtype, shape):
    x = jax.random.uniform(jax.random.key(1), shape, dtype, 0.2, 1.05)
    y = sumcumprod(x)
    assert y.shape == shape and y.dtype == dtype
    if shape[-1] <= 100:
        assert_close(y, sumcumprod_quadratic(x), **tol(dtype))
    assert_close(y, jax.jit(sumcumprod_reference)(x), **tol(dtype))


@pytest.mark.parametrize("reverse", [True, False])
def test_linear_recurrence_matches_reference(reverse):
    a, b = jax.random.normal(jax.random.key(2), (2, 3, 50))
    z = linear_recurrence(a, b, reverse=reverse)
    zr = np.zeros((3, 50))
    acc = np.zeros(3)
    order = range(49, -1, -1) if reverse else range(50)
    for i in order:
        acc = np.asarray(a[:, i]) * acc + np.asarray(b[:, i])
        zr[:, i] = acc
    assert_close(z, zr, rtol=1e-12, atol=1e-12)


def test_transposed_and_strided_inputs():
    x = jax.random.uniform(jax.random.key(3), (40, 30), jnp.float64, 0.2, 1.0)
    assert_close(jax.jit(lambda x: sumcumprod(x.T))(x), sumcumprod_quadratic(np.asarray(x).T), rtol=1e-12)
    assert_close(
        jax.jit(lambda x: sumcumprod(x[::2, ::3]))(x), sumcumprod_quadratic(np.asarray(x)[::2, ::3]), rtol=1e-12
    )


def test_vmap_is_one_custom_call_and_per_row():
    out = jax.vmap(sumcumprod)(jnp.ones((10, 10)))
    assert_close(out, np.tile(np.arange(10, 0, -1), (10, 1)))
    hlo = jax.jit(jax.vmap(sumcumprod)).lower(jnp.ones((10, 10))).compile().as_text()
    assert hlo.count("custom-call(") == 1
    assert "while" not in hlo


@pytest.mark.parametrize("in_axes", [0, 1])
def test_vmap_axes(in_axes):
    x = jax.random.uniform(jax.random.key(4), (6, 7, 5), jnp.float64, 0.2, 1.0)
    out = jax.vmap(sumcumprod, in_axes=in_axes)(x)
    assert_close(out, sumcumprod_quadratic(np.moveaxis(np.asarray(x), in_axes, 0)), rtol=1e-12)


def test_nested_vmap():
    x = jax.random.uniform(jax.random.key(5), (3, 4, 6), jnp.float64, 0.2, 1.0)
    out = jax.vmap(jax.vmap(sumcumprod, in_axes=1), in_axes=0)(x)
    assert_close(out, sumcumprod_quadratic(np.swapaxes(np.asarray(x), 1, 2)), rtol=1e-12)
    hlo = jax.jit(jax.vmap(jax.vmap(sumcumprod))).lower(x).compile().as_text()
    assert hlo.count("custom-call(") == 1


def test_vmap_of_linear_recurrence_with_one_operand_unbatched():
    a = jax.random.uniform(jax.random.key(6), (8,), jnp.float64, 0.2, 1.0)
    B = jax.random.normal(jax.random.key(7), (5, 8))
    out = jax.vmap(lambda b: linear_recurrence(a, b, reverse=False))(B)
    assert_close(out, jnp.stack([linear_recurrence(a, b, reverse=False) for b in B]), rtol=1e-12)


@pytest.mark.parametrize("modes", [("fwd",), ("rev",), ("fwd", "rev")])
def test_check_grads_order_2(modes):
    x = jax.random.uniform(jax.random.key(8), (3, 6), jnp.float64, 0.3, 1.0)
    check_grads(sumcumprod, (x,), order=2, modes=modes)
    a, b = jax.random.uniform(jax.random.key(9), (2, 3, 6), jnp.float64, 0.3, 1.0)
    for reverse in (True, False):
        check_grads(functools.partial(linear_recurrence, reverse=reverse), (a, b), order=2, modes=modes)


def test_jacobians_and_hessian_match_reference():
    x = jax.random.uniform(jax.random.key(10), (9,), jnp.float64, 0.2, 1.1)

    def f(v):
        return jnp.sum(jnp.sin(sumcumprod(v)))

    def fr(v):
        return jnp.sum(jnp.sin(sumcumprod_reference(v)))

    J = jax.jit  # each side compiled once (eager, every small op compiles on its own)
    assert_close(J(jax.jacfwd(sumcumprod))(x), J(jax.jacfwd(sumcumprod_reference))(x), rtol=1e-12)
    assert_close(J(jax.jacrev(sumcumprod))(x), J(jax.jacfwd(sumcumprod_reference))(x), rtol=1e-12)
    assert_close(J(jax.hessian(f))(x), J(jax.hessian(fr))(x), rtol=1e-10, atol=1e-12)
    assert_close(J(jax.grad(f))(x), J(jax.grad(fr))(x), rtol=1e-12)
    # Third order, forward over reverse over forward.
    third = J(jax.jacfwd(jax.hessian(f)))(x)
    assert_close(third, J(jax.jacfwd(jax.hessian(fr)))(x), rtol=1e-9, atol=1e-10)


def test_grad_runs_native_recurrences_only():
    x = jnp.ones((4, 16))
    hlo = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod(v) ** 2))).lower(x).compile().as_text()
    assert hlo.count("custom-call(") == 2  # forward (z is needed for z**2) and the fused vector-Jacobian product
    assert 'custom_call_target="eqgp_sumcumprod_jvp"' in hlo
    # The product reads z = sumcumprod(x) as an operand on every platform: the recurrence
    # computing it is the forward's, which XLA computes once.
    hlo = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod(v)))).lower(x).compile().as_text()
    assert hlo.count("custom-call(") == 2
    assert 'custom_call_target="eqgp_sumcumprod_jvp"' in hlo
    hlo = jax.jit(jax.value_and_grad(lambda v: jnp.sum(sumcumprod(v)))).lower(x).compile().as_text()
    assert hlo.count("custom-call(") == 2


def test_cpu_and_cuda_lower_each_target_with_the_same_operands():
    # One FFI signature per target: the same operand list on both platforms (lowered here,
    # no GPU needed).
    x = jax.ShapeDtypeStruct((4, 16), jnp.float32)

    def operands(platform):
        fn = jax.grad(lambda v: jnp.sum(sumcumprod(v)))
        text = jax.jit(fn).trace(x).lower(lowering_platforms=(platform,)).as_text()
        return sorted(
            (line.split("custom_call @")[1].split("(")[0], line.split("(")[1].count("%"))
            for line in text.splitlines()
            if "custom_call @" in line
        )

    cpu = operands("cpu")
    assert cpu == [("eqgp_linear_recurrence", 2), ("eqgp_sumcumprod_jvp", 3)], cpu
    if "cuda" in eqgp._native.BUILT_PLATFORMS:
        assert operands("cuda") == cpu


@functools.partial(jax.jit, static_argnums=2)
def _jacobian_product_reference(x, t, transpose):
    """J t or J^T t of sumcumprod by the associative-scan reference's own autodiff."""
    if transpose:
        return jax.vjp(sumcumprod_reference, x)[1](t)[0]
    return jax.jvp(sumcumprod_reference, (x,), (t,))[1]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (2,), (3, 0), (3, 7), (2, 3, 5), (2, 1025), (3, 1024)])
@pytest.mark.parametrize("transpose", [False, True])
def test_fused_jacobian_products_match_reference(dtype, shape, transpose):
    kx, kt = jax.random.split(jax.random.key(21))
    x = jax.random.uniform(kx, shape, dtype, 0.2, 1.05)
    t = jax.random.normal(kt, shape, dtype)
    out = eqgp._ops.sumcumprod_jvp_p.bind(x, t, transpose=transpose)
    assert out.shape == shape and out.dtype == dtype
    assert_close(out, _jacobian_product_reference(x, t, transpose), **tol(dtype))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(37, 50), (100, 400), (3, 2**20 + 3)])
def test_fused_jacobian_products_scratch(dtype, shape):
    # The native products recompute sumcumprod(x) a few rows at a time into scratch:
    # rows over several groups and a remainder, several threads (100 x 400), and a
    # request too large for the per-thread buffer (3 x 2^20 + 3), which gets its own.
    kx, kt = jax.random.split(jax.random.key(25))
    x = jax.random.uniform(kx, shape, dtype, 0.2, 1.0)
    t = jax.random.normal(kt, shape, dtype)
    for transpose in (False, True):
        got = eqgp._ops.sumcumprod_jvp_p.bind(x, t, transpose=transpose)
        if shape[1] > 2**20:  # the own-buffer path against the kept-buffer one (a row at a time): bit for bit
            rows = [eqgp._ops.sumcumprod_jvp_p.bind(x[i : i + 1], t[i : i + 1], transpose=transpose) for i in range(3)]
            np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.concatenate(rows)))
            continue
        ref = _jacobian_product_reference(x.astype(jnp.float64), t.astype(jnp.float64), transpose)
        rtol = tol(dtype)["rtol"]
        assert_close(got, ref, rtol=rtol, atol=rtol * float(jnp.abs(ref).max()))


def test_fused_jacobian_products_are_adjoint():
    kx, kt, ks = jax.random.split(jax.random.key(22), 3)
    x = jax.random.uniform(kx, (3, 40), jnp.float64, 0.2, 1.05)
    t, s = jax.random.normal(kt, (2, 3, 40), jnp.float64)
    jt = eqgp._ops.sumcumprod_jvp_p.bind(x, t, transpose=False)
    jts = eqgp._ops.sumcumprod_jvp_p.bind(x, s, transpose=True)
    assert_close(jnp.vdot(jt, s), jnp.vdot(t, jts), rtol=1e-12)
    dense = jax.jit(jax.jacfwd(sumcumprod_reference))(x[0])  # (n, n)
    assert_close(jt[0], dense @ t[0], rtol=1e-12)
    assert_close(jts[0], dense.T @ s[0], rtol=1e-12)


@pytest.mark.parametrize("in_axes", [(0, 0), (1, 1), (0, None), (None, 0)])
def test_fused_jacobian_product_vmap(in_axes):
    kx, kt = jax.random.split(jax.random.key(23))
    x = jax.random.uniform(kx, (4, 9), jnp.float64, 0.2, 1.05)
    t = jax.random.normal(kt, (4, 9), jnp.float64)
    # An unbatched operand is one row, shared by every batch element.
    operands = [v if ax is not None else v[0] for v, ax in zip((x, t), in_axes)]
    for transpose in (False, True):
        f = functools.partial(eqgp._ops.sumcumprod_jvp_p.bind, transpose=transpose)
        got = jax.vmap(f, in_axes=in_axes)(*operands)
        size = next(v.shape[ax] for v, ax in zip(operands, in_axes) if ax is not None)
        ref = [
            f(*[v if ax is None else jnp.take(v, i, axis=ax) for v, ax in zip(operands, in_axes)]) for i in range(size)
        ]
        assert_close(got, jnp.stack(ref), rtol=1e-12)


def test_vmap_of_grad():
    X = jax.random.uniform(jax.random.key(11), (4, 9), jnp.float64, 0.2, 1.0)
    g = jax.vmap(jax.grad(lambda v: jnp.sum(sumcumprod(v) ** 2)))(X)
    gr = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(sumcumprod_reference(v) ** 2))))(X)
    assert_close(g, gr, rtol=1e-12)


@pytest.mark.parametrize("x", [jnp.ones(3, jnp.int32), jnp.ones(3, jnp.complex64), jnp.ones(3, bool)])
def test_bad_dtype_is_type_error(x):
    # Under the test suite's jaxtyping hook the annotation check fires first; both name `x`.
    with pytest.raises(TypeError, match="float32 or float64|parameter 'x'"):
        sumcumprod(x)


def test_scalar_is_value_error():
    with pytest.raises((ValueError, TypeError), match="at least one axis|parameter 'x'"):
        sumcumprod(jnp.float64(1.0))


def test_reverse_must_be_bool():
    with pytest.raises(TypeError, match="reverse"):
        linear_recurrence(jnp.ones(3), jnp.ones(3), reverse=1)


def test_mismatched_operands():
    with pytest.raises((ValueError, TypeError), match="same shape and dtype|parameter 'b'"):
        linear_recurrence(jnp.ones(3), jnp.ones(4), reverse=True)


def test_reference_fallback_warns_once(monkeypatch):
    import eqgp._ops as ops

    monkeypatch.setattr(ops, "_fallback_warned", False)
    with pytest.warns(RuntimeWarning, match="pure-JAX"):
        ops._fallback(jnp.ones(3), jnp.ones(3), reverse=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops._fallback(jnp.ones(3), jnp.ones(3), reverse=True)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    seed=st.integers(0, 2**31 - 1),
    lo=st.floats(-1.5, 0.0),
    hi=st.floats(0.1, 1.2),
)
def test_property_matches_quadratic(shape, seed, lo, hi):
    x = jax.random.uniform(jax.random.key(seed), tuple(shape), jnp.float64, lo, hi)
    assert_close(sumcumprod(x), sumcumprod_quadratic(x), rtol=1e-10, atol=1e-12)


def test_float32_grad():
    x = jax.random.uniform(jax.random.key(12), (5, 33), jnp.float32, 0.2, 1.0)
    g = jax.grad(lambda v: jnp.sum(sumcumprod(v)))(x)
    gr = jax.jit(jax.grad(lambda v: jnp.sum(sumcumprod_reference(v))))(x)
    assert g.dtype == jnp.float32
    assert_close(g, gr, **tol(jnp.float32))


def test_under_filter_jit():
    x = jnp.linspace(0.1, 0.9, 12)
    assert_close(eqx.filter_jit(sumcumprod)(x), sumcumprod_quadratic(x), rtol=1e-12)


@pytest.mark.parametrize("transpose", [False, True])
def test_jacobian_product_fallback_formula(transpose):
    # The lowering used where no native handler exists (and the rule for derivatives
    # through x) computes the products from x alone by the generic recurrences.
    import eqgp._ops as ops

    kx, kt = jax.random.split(jax.random.key(27))
    x = jax.random.uniform(kx, (3, 2, 33), jnp.float64, 0.2, 1.05)
    t = jax.random.normal(kt, (3, 2, 33), jnp.float64)
    got = jax.jit(ops._scp_jvp_reference, static_argnames="transpose")(x, t, transpose=transpose)
    assert_close(got, _jacobian_product_reference(x, t, transpose), rtol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_sumcumprod_axis_and_direction(axis, reverse, dtype):
    x = jax.random.uniform(jax.random.key(1), (3, 5, 6), dtype, -1.2, 1.2)
    ref = jax.jit(functools.partial(eqgp.ops.sumcumprod_reference, axis=axis, reverse=reverse))
    op = functools.partial(eqgp.ops.sumcumprod, axis=axis, reverse=reverse)
    assert_close(op(x), ref(x), **tol(dtype))
    # Independent closed form: the explicit double sum along the axis.
    xm = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = xm.shape[-1]
    want = np.zeros_like(xm)
    for i in range(n):
        for j in range(n):
            lo, hi = (i, j) if reverse else (j, i)
            if lo <= hi and ((reverse and j >= i) or (not reverse and j <= i)):
                want[..., i] += np.prod(xm[..., lo : hi + 1], axis=-1)
    assert_close(op(x), np.moveaxis(want, -1, axis), **tol(dtype))
    f = lambda v: jnp.sum(jnp.sin(op(v)))  # noqa: E731
    g = lambda v: jnp.sum(jnp.sin(ref(v)))  # noqa: E731
    assert_close(jax.jit(jax.grad(f))(x), jax.jit(jax.grad(g))(x), **tol(dtype))
    layer = eqgp.nn.SumCumProd(axis=axis, reverse=reverse)
    assert_close(eqx.filter_jit(layer)(x), ref(x), **tol(dtype))


def test_sumcumprod_axis_and_direction_are_checked():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="`axis` 2 is out of range for an array of rank 2"):
        eqgp.ops.sumcumprod(x, axis=2)
    # Under the suite's jaxtyping/beartype hook the annotations are checked first.
    with pytest.raises((TypeError, jaxtyping.TypeCheckError), match="`axis` must be an int|parameter 'axis'"):
        eqgp.ops.sumcumprod(x, axis=1.0)
    with pytest.raises(
        (TypeError, jaxtyping.TypeCheckError), match="`reverse` must be a Python bool|parameter 'reverse'"
    ):
        eqgp.ops.sumcumprod(x, reverse="yes")


def test_native_platforms_are_those_present():
    has_gpu = any(d.platform == "gpu" for d in jax.devices())
    assert ("cuda" in eqgp.ops.NATIVE_PLATFORMS) == (has_gpu and "cuda" in eqgp._native.BUILT_PLATFORMS)
    assert not hasattr(eqgp.ops, "linear_recurrence_p") and not hasattr(eqgp.ops, "sumcumprod_jvp_p")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_computes_in_float32(dtype):
    x = jax.random.uniform(jax.random.key(7), (3, 40), jnp.float32, 0.2, 1.0).astype(dtype)
    y = sumcumprod(x)
    assert y.dtype == dtype
    want = sumcumprod_quadratic(np.asarray(x.astype(jnp.float32)))
    assert_close(y.astype(jnp.float32), want, rtol=1e-2 if dtype == jnp.bfloat16 else 2e-3)
    g = jax.grad(lambda v: jnp.sum(sumcumprod(v).astype(jnp.float32)))(x)
    assert g.dtype == dtype


def test_four_threads_at_once_give_correct_results():
    import concurrent.futures

    xs = [jax.random.uniform(jax.random.key(i), (64, 257), jnp.float64, 0.2, 1.0) for i in range(4)]
    fn = jax.jit(lambda v: (sumcumprod(v), jax.grad(lambda u: jnp.sum(sumcumprod(u)))(v)))
    fn(xs[0])  # compile first: the threads then run the same executable concurrently
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda x: [jax.block_until_ready(fn(x)) for _ in range(5)][-1], xs))
    ref_grad = jax.jit(jax.grad(lambda u: jnp.sum(sumcumprod_reference(u))))
    for x, (y, g) in zip(xs, outs):
        assert_close(y, sumcumprod_quadratic(x), rtol=1e-12)
        assert_close(g, ref_grad(x), rtol=1e-10)


def _cuda_custom_calls(fn, *shapes):
    return lowered_custom_calls(fn, *(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes), platform="cuda")


@pytest.mark.skipif("cuda" not in eqgp._native.BUILT_PLATFORMS, reason="the CUDA module is not built")
def test_cuda_lowers_few_long_rows_to_the_scan():
    # One thread block per row leaves an H200 idle with 16 rows of 2^22 (37x a device copy,
    # 5x XLA's associative scan): such shapes lower to the scan on CUDA, every other shape
    # and every direction of differentiation to the native calls. Lowered here, no GPU needed.
    grad = jax.grad(lambda v: jnp.sum(sumcumprod(v)))
    jvp = lambda v, t: jax.jvp(sumcumprod, (v,), (t,))  # noqa: E731
    for shape in [(16, 1 << 22), (1 << 22,), (2, 8, 1 << 18)]:
        assert _cuda_custom_calls(sumcumprod, shape) == []
        assert _cuda_custom_calls(grad, shape) == []
        assert _cuda_custom_calls(jvp, shape, shape) == []
    for shape in [(3, 5), (64, 1 << 22), (16, 1 << 17), (4096,)]:
        assert _cuda_custom_calls(sumcumprod, shape) == ["eqgp_linear_recurrence"]
        assert _cuda_custom_calls(grad, shape) == ["eqgp_linear_recurrence", "eqgp_sumcumprod_jvp"]
        assert "eqgp_sumcumprod_jvp" in _cuda_custom_calls(jvp, shape, shape)
