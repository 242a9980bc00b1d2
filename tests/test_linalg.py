import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, tol
from jax.test_util import check_grads

import eqgp
from eqgp import kernels
from eqgp._gram import _symmetric_gram
from eqgp._linalg import HAVE_NATIVE_INVERSE, cholesky_inverse


def _spd(key, shape, dtype):
    n = shape[-1]
    A = jax.random.normal(key, shape, dtype)
    return A @ jnp.swapaxes(A, -1, -2) + jnp.broadcast_to(n * jnp.eye(n, dtype=dtype), shape)


def test_native_inverse_is_available_on_cpu():
    # scipy (a dependency of jax) provides LAPACK; without it every test below would
    # only exercise the generic path.
    assert HAVE_NATIVE_INVERSE
    L = jnp.linalg.cholesky(_spd(jax.random.key(0), (5, 5), jnp.float64))
    hlo = jax.jit(cholesky_inverse).trace(L).lower(lowering_platforms=("cpu",)).as_text()
    assert "eqgp_cholesky_inverse" in hlo


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (2, 2), (37, 37), (3, 20, 20), (2, 2, 6, 6)])
def test_cholesky_inverse_matches_inv(dtype, shape):
    K = _spd(jax.random.key(1), shape, jnp.float64)
    L = jnp.linalg.cholesky(K).astype(dtype) if shape[-1] else K.astype(dtype)
    out = jax.jit(cholesky_inverse)(L)
    assert out.shape == shape and out.dtype == dtype
    if shape[-1]:
        ref = jnp.linalg.inv(K)
        scale = float(jnp.max(jnp.abs(ref)))
        assert_close(out / scale, ref / scale, **tol(dtype))
        assert_close(out, jnp.swapaxes(out, -1, -2), rtol=0, atol=0)  # exactly symmetric


def test_cholesky_inverse_ignores_the_upper_triangle():
    L = jnp.linalg.cholesky(_spd(jax.random.key(2), (6, 6), jnp.float64))
    junk = L + jnp.triu(jnp.ones_like(L), 1)
    assert_close(cholesky_inverse(junk), cholesky_inverse(L), rtol=1e-14)


def test_cholesky_inverse_vmap_and_grads():
    L = jnp.linalg.cholesky(_spd(jax.random.key(3), (4, 7, 7), jnp.float64))
    assert_close(jax.vmap(cholesky_inverse)(L), jnp.linalg.inv(L @ jnp.swapaxes(L, -1, -2)), rtol=1e-10)
    check_grads(lambda M: cholesky_inverse(jnp.tril(M)), (L[0],), order=2, modes=("fwd", "rev"))


def _mixed_groups(key, dtype=jnp.float64):
    k1, k2, k3 = jax.random.split(key, 3)
    return (
        (eqgp.Value(), jax.random.uniform(k1, (5, 2), dtype, -2, 2)),
        (eqgp.Partial([1]), jax.random.uniform(k2, (3, 2), dtype, -2, 2)),
        (eqgp.ValueAndGradient(), jax.random.uniform(k3, (4, 2), dtype, -2, 2)),
        (eqgp.Gradient(), jnp.zeros((0, 2), dtype)),  # an empty group
    )


@pytest.mark.parametrize(
    "kernel",
    [kernels.RBF([0.7, 1.3], variance=1.4), kernels.Matern52(0.9) * kernels.Periodic(1.1, 2.0), kernels.Linear()],
)
def test_symmetric_gram_pullback_equals_generic(kernel):
    groups = _mixed_groups(jax.random.key(4))
    K = eqgp.operator_gram(kernel, list(groups), list(groups))
    assert_close(_symmetric_gram((kernel, groups)), K, rtol=1e-14)
    W = jax.random.normal(jax.random.key(5), K.shape, jnp.float64)  # not symmetric on purpose

    def generic(diff):
        return jnp.sum(W * eqgp.operator_gram(diff[0], list(diff[1]), list(diff[1])))

    def symmetric(diff):
        return jnp.sum(W * _symmetric_gram(diff))

    g1 = eqx.filter_jit(eqx.filter_grad(generic))((kernel, groups))
    g2 = eqx.filter_jit(eqx.filter_grad(symmetric))((kernel, groups))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):  # kernel and point gradients
        assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_lml_gradient_wrt_points_and_kernel_through_symmetric_path():
    groups = _mixed_groups(jax.random.key(6))[:3]
    targets = [jax.random.normal(jax.random.key(i), (X.shape[0], op.size(2))) for i, (op, X) in enumerate(groups)]

    def lml(model, Xs, symmetric):
        obs = eqgp.Observations(*[eqgp.ObservationGroup(op, X, t) for (op, _), X, t in zip(groups, Xs, targets)])
        if symmetric:
            return model.log_marginal_likelihood(obs)
        K, r = model._prior(obs)
        return jax.scipy.stats.multivariate_normal.logpdf(r, jnp.zeros_like(r), K)

    gp = eqgp.GaussianProcess(kernels.RBF([0.7, 1.3]), mean=0.3, noise=[0.1, 0.2, 0.05])
    Xs = [X for _, X in groups]
    g1 = eqx.filter_jit(eqx.filter_grad(functools.partial(lml, symmetric=True)))(gp, Xs)
    g2 = eqx.filter_jit(eqx.filter_grad(functools.partial(lml, symmetric=False)))(gp, Xs)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(a, b, rtol=1e-8, atol=1e-10)
    gx1 = eqx.filter_jit(jax.grad(lml, argnums=1))(gp, Xs, True)
    gx2 = eqx.filter_jit(jax.grad(lml, argnums=1))(gp, Xs, False)
    for a, b in zip(gx1, gx2):
        assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_compiler_options_and_entry_points_inside_and_outside_jit():
    opts = eqgp.compiler_options()
    assert isinstance(opts, dict)
    if opts:  # they compile
        jax.jit(lambda x: x * 2, compiler_options=opts)(jnp.ones(3))
    X = jnp.linspace(0.0, 1.0, 4)[:, None]
    k = kernels.RBF(0.5)
    top = eqgp.gradient_gram(k, X, X)
    inner = jax.jit(lambda X: eqgp.gradient_gram(k, X, X))(X)
    closed = jax.jit(lambda: eqgp.gradient_gram(k, X, X))()  # inside a trace, no traced argument
    assert_close(top, inner, rtol=1e-14)
    assert_close(top, closed, rtol=1e-14)
    np.testing.assert_equal(np.asarray(top).shape, (8, 8))
