import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels
from eqgp._prior import prior


class UserKernel(kernels.AbstractKernel):
    scale: jax.Array

    def __call__(self, x1, x2):
        return jnp.exp(-self.scale * jnp.sum((x1 - x2) ** 2)) * (1.0 + 0.1 * jnp.dot(x1, x2))


def _groups(key, D=3, dtype=jnp.float64):
    k1, k2, k3 = jax.random.split(key, 3)
    X = jax.random.uniform(k1, (9, D), dtype, -2, 2)
    Z = jax.random.uniform(k2, (5, D), dtype, -2, 2)
    V = jax.random.normal(k3, (2, D), dtype)
    return (
        (eqgp.ValueAndGradient(), X),
        (eqgp.Value(), Z),
        (eqgp.Gradient(), Z[:3]),
        (eqgp.Partial([0, 2]), Z),
        (eqgp.Partial(1), X[:2]),
        (eqgp.Directional(V), X[3:6]),
        (eqgp.Hessian(), Z[:2]),
        (eqgp.Hessian(diagonal=True), X[:1]),
        (eqgp.Gradient(), jnp.zeros((0, D), dtype)),  # an empty group
    )


KERNELS = [
    kernels.RBF([0.9, 1.2, 0.7], variance=1.3),
    kernels.Matern52(1.1) * kernels.Periodic(1.3, period=2.5),
    kernels.RationalQuadratic(0.8) + 0.5 * kernels.Matern52([1.0, 0.6, 1.4]),
    UserKernel(jnp.asarray(0.4)),
]


def _cov(kernel, groups):
    R = sum(op.size(X.shape[1]) * X.shape[0] for op, X in groups)
    noise = jnp.linspace(1e-3, 2e-3, R)
    return eqgp.Covariance(kernel, groups, noise)


@pytest.mark.parametrize(
    "kernel, tile_bytes",  # one point per tile, a few tiles, one tile
    [
        pytest.param(KERNELS[0], 2**14, marks=pytest.mark.slow),
        (KERNELS[1], 2**20),
        (KERNELS[2], 2**28),
        (KERNELS[3], 2**28),
    ],
)
def test_product_equals_dense_gram_for_every_operator(kernel, tile_bytes):
    groups = _groups(jax.random.key(0))
    if kernel is not KERNELS[0]:  # every operator with one kernel; the others (compile time) with a few
        pick = {1: (0, 4, 8), 2: (3, 5, 8), 3: (0, 3, 8)}[KERNELS.index(kernel)]
        groups = tuple(groups[i] for i in pick)
    cov = _cov(kernel, groups)
    mv = functools.partial(cov.mv, tile_bytes=tile_bytes)
    K = eqgp.operator_gram(kernel, list(groups), list(groups)) + jnp.diag(cov.noise)
    if kernel is not KERNELS[0]:  # as_matrix is operator_gram + noise; with every operator: compile time
        # (built in slabs: the same pairs, a different fusion: rounding only)
        assert_close(eqx.filter_jit(lambda c: c.as_matrix())(cov), K, rtol=1e-13, atol=1e-15)
    V = jax.random.normal(jax.random.key(1), (cov.size, 3), jnp.float64)
    KV = K @ V
    scale = jnp.max(jnp.abs(KV))
    assert float(jnp.max(jnp.abs(eqx.filter_jit(mv)(V) - KV)) / scale) < 1e-12
    if kernel is not KERNELS[0]:  # a single vector (compile time: not with every operator)
        assert float(jnp.max(jnp.abs(mv(V[:, 0]) - KV[:, 0])) / scale) < 1e-12
    assert_close(eqx.filter_jit(lambda c: c.diagonal())(cov), jnp.diagonal(K), rtol=1e-12)
    Xs = jax.random.uniform(jax.random.key(2), (4, 3), jnp.float64, -2, 2)
    op = eqgp.ValueAndGradient()
    assert_close(
        eqx.filter_jit(lambda c: c.cross_mv(op, Xs, V[:, 0], tile_bytes=tile_bytes))(cov),
        eqgp.operator_gram(kernel, (op, Xs), list(groups)) @ V[:, 0],
        rtol=1e-11,
        atol=1e-12,
    )


def test_kernel_column_across_groups():
    groups = _groups(jax.random.key(0))
    groups = tuple(groups[i] for i in (0, 3, 5, 6, 8))  # the operator kinds, an empty group
    cov = _cov(KERNELS[0], groups)
    K = eqgp.operator_gram(cov.kernel, list(groups), list(groups))
    cols = eqx.filter_jit(lambda c, i: jax.vmap(c.kernel_column)(i))(cov, jnp.arange(cov.size))
    assert_close(cols.T, K, rtol=1e-12, atol=1e-13)


def test_coincident_points_matern_product():
    X = jnp.array([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [0.5, -0.2, 0.0]])
    k = kernels.Matern52(0.8)
    cov = _cov(k, ((eqgp.ValueAndGradient(), X),))
    V = jax.random.normal(jax.random.key(1), (cov.size,), jnp.float64)
    out = eqx.filter_jit(lambda c, V: c.mv(V, tile_bytes=1))(cov, V)
    assert bool(jnp.all(jnp.isfinite(out)))
    assert_close(out, eqx.filter_jit(lambda c: c.as_matrix())(cov) @ V, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kernel", [pytest.param(KERNELS[1], marks=pytest.mark.slow), KERNELS[3]])
def test_pullbacks_equal_autodiff_of_the_dense_matrix(kernel):
    groups = _groups(jax.random.key(3))
    groups = ((groups[0][0], groups[0][1][:4]), groups[4], groups[5])
    if kernel is KERNELS[1]:  # the product of two kernels: compile time grows with the pairs of groups
        groups = (groups[0], groups[2])
    cov = _cov(kernel, groups)
    U = jax.random.normal(jax.random.key(4), (cov.size, 2), jnp.float64)
    V = jax.random.normal(jax.random.key(5), (cov.size, 2), jnp.float64)
    ref = eqx.filter_jit(eqx.filter_grad(lambda c: jnp.sum(U * (c.as_matrix() @ V))))(cov)
    low_rank = eqx.filter_jit(lambda c: c.pullback(U, V, tile_bytes=4096))(cov)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(low_rank)):
        assert_close(b, a, rtol=1e-10, atol=1e-11)  # kernel, points, directions, noise
    if kernel is KERNELS[3]:  # the dense (symmetric-pair) pullback once (compile time)
        dense = eqx.filter_jit(lambda c: c.pullback(U @ V.T))(cov)
        for a, c in zip(jax.tree.leaves(ref), jax.tree.leaves(dense)):
            assert_close(c, a, rtol=1e-10, atol=1e-11)


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_lml_gradient_wrt_points_and_kernel_equals_dense_autodiff():
    groups = _groups(jax.random.key(6), D=2)[:3]
    targets = [jax.random.normal(jax.random.key(i), (X.shape[0], op.size(2))) for i, (op, X) in enumerate(groups)]

    def lml(model, Xs, ours):
        obs = eqgp.Observations(*[eqgp.ObservationGroup(op, X, t) for (op, _), X, t in zip(groups, Xs, targets)])
        if ours:
            return model.log_marginal_likelihood(obs)
        cov, r = prior(model.kernel, model.mean, model._noise_for(obs), obs)
        return jax.scipy.stats.multivariate_normal.logpdf(r, jnp.zeros_like(r), cov.as_matrix())

    gp = eqgp.GaussianProcess(kernels.RBF([0.7, 1.3]), mean=0.3, noise=[0.1, 0.2, 0.05])
    Xs = [X for _, X in groups]
    grad = eqx.filter_jit(eqx.filter_grad(lambda args, ours: lml(*args, ours=ours)))  # model and points
    g1, g2 = grad((gp, Xs), True), grad((gp, Xs), False)
    assert len(jax.tree.leaves(g1)) == len(jax.tree.leaves(gp)) + len(Xs)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_float32_product():
    groups = _groups(jax.random.key(7), dtype=jnp.float32)[:4]
    k = kernels.RBF(1.0)
    R = sum(op.size(3) * X.shape[0] for op, X in groups)
    cov = eqgp.Covariance(k, groups, jnp.full(R, 1e-2, jnp.float32))
    V = jax.random.normal(jax.random.key(1), (R,), jnp.float32)
    out = eqx.filter_jit(lambda c, V: c.mv(V, tile_bytes=1))(cov, V)
    assert out.dtype == jnp.float32
    assert_close(out, eqx.filter_jit(lambda c: c.as_matrix())(cov) @ V, rtol=1e-4, atol=1e-4)


def _warped():
    class Pairs(eqx.Module):
        def __call__(self, x):
            return jnp.stack([jnp.sum(x**2), jnp.sin(x[0]) * x[1], x[2]])

    return kernels.Warped(kernels.Matern52(1.3), Pairs())


@pytest.mark.slow  # ~50 s per kernel on 2 cores (a scan step per point and per pair): CI's slow stage
@pytest.mark.parametrize("which", ["plain", "warped"])
def test_dense_matrix_in_slabs_and_pullback_in_chunks_equal_one_piece(which):
    """`as_matrix` writes slabs of rows into one buffer (the last slab overlapping the one
    before), and the dense pullback visits pairs in chunks (structured grams: slabs of rows);
    both agree with the one-piece computations whatever the piece size."""
    from eqgp._covariance import _symmetric_pullback

    groups = _groups(jax.random.key(7))
    groups = (groups[0], groups[1], groups[8], groups[3])  # 7 + 5 + 0 + 5 points; an empty group
    kernel = KERNELS[0] if which == "plain" else _warped()
    cov = _cov(kernel, groups)
    K = eqgp.operator_gram(kernel, list(groups), list(groups)) + jnp.diag(cov.noise)
    for slab in (700, None):  # a few points per slab (the last overlapping), one slab per group
        assert_close(eqx.filter_jit(lambda c, s=slab: c.as_matrix(slab_bytes=s))(cov), K, rtol=1e-13, atol=1e-15)
    W = jax.random.normal(jax.random.key(8), K.shape, jnp.float64)
    W = W + W.T

    def pulled(chunk):
        return eqx.filter_jit(eqx.filter_value_and_grad(lambda c: _symmetric_pullback(c.kernel, c.groups, W, chunk)))(
            cov
        )

    ref_value = jnp.sum(W * (K - jnp.diag(cov.noise)))
    ref_grad = eqx.filter_grad(lambda c: jnp.sum(W * c.as_matrix()))(cov)
    for chunk in (1000, None):
        value, grad = pulled(chunk)
        assert_close(value, ref_value, rtol=1e-12)
        for a, b in zip(jax.tree.leaves(grad.kernel), jax.tree.leaves(ref_grad.kernel), strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12)
        for (_, a), (_, b) in zip(grad.groups, ref_grad.groups, strict=True):  # the points' cotangents
            assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_leading_rows_pick_every_row_of_the_first_points_of_each_group():
    groups = _groups(jax.random.key(9))
    groups = (groups[0], groups[1], groups[3])  # 9 points x 4 rows, 5 x 1, 5 x 2: 51 rows
    cov = _cov(KERNELS[0], groups)
    np.testing.assert_array_equal(cov.leading_rows(10_000), np.arange(51))
    # 20 of 51 rows: the first ceil(N * 20 / 51) points of each group, all their rows
    rows = np.concatenate(
        [np.arange(4)[:, None] * 9 + np.arange(4), [36, 37], 41 + np.arange(2)[:, None] * 5 + np.arange(2)], axis=None
    )
    np.testing.assert_array_equal(np.sort(cov.leading_rows(20)), np.sort(rows))
