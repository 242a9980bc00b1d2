import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, jit_roundtrip

import eqgp
from eqgp import kernels

D = 3
ALL_KERNELS = {
    "rbf": lambda: kernels.RBF([0.7, 1.1, 1.6], variance=1.3),
    "m12": lambda: kernels.Matern12(0.9),
    "m32": lambda: kernels.Matern32([0.8, 1.2, 1.0]),
    "m52": lambda: kernels.Matern52([0.8, 1.2, 1.0], variance=0.7),
    "rq": lambda: kernels.RationalQuadratic(1.1, alpha=0.8),
    "periodic": lambda: kernels.Periodic(1.2, period=[2.0, 2.5, 3.0]),
    "linear": lambda: kernels.Linear(0.5),
    "poly": lambda: kernels.Polynomial(3, variance=0.4, offset=0.6),
    "constant": lambda: kernels.Constant(2.0),
    "white": lambda: kernels.White(0.3),
    "sum": lambda: kernels.RBF(1.0) + kernels.Matern52(2.0),
    "product": lambda: kernels.RBF(1.0) * kernels.Periodic(1.0, period=2.0),
    "scaled": lambda: 2.5 * kernels.RationalQuadratic(0.9),
    "builtin_sum": lambda: sum([kernels.RBF(0.5), kernels.Linear(0.2), kernels.Constant(0.1)]),
    "warped": lambda: kernels.Warped(
        kernels.Matern52(1.0), eqx.nn.MLP(D, D, 4, 1, activation=jnp.tanh, key=jax.random.key(0))
    ),
}


class UserRBF(kernels.AbstractKernel):
    scale: jax.Array

    def __call__(self, x1, x2):
        return jnp.exp(-self.scale * jnp.sum((x1 - x2) ** 2))


@pytest.fixture(params=sorted(ALL_KERNELS))
def kernel(request):
    return ALL_KERNELS[request.param]()


def _points(n, dtype=jnp.float64, seed=0):
    return jax.random.uniform(jax.random.key(seed), (n, D), dtype, -1.5, 1.5)


def test_pytree_roundtrip_under_jit(kernel):
    X = _points(5)
    k2 = jit_roundtrip(kernel)
    assert_close(eqgp.gram(k2, X, X), eqgp.gram(kernel, X, X), rtol=1e-14)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gram_symmetric_psd(kernel, dtype):
    X = _points(12, dtype)
    # A float32 user keeps the whole model in float32 (the MLP of `warped` too).
    kernel = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, kernel)
    K = eqgp.gram(kernel, X, X)
    assert K.dtype == dtype and K.shape == (12, 12)
    assert_close(K, K.T, rtol=1e-6, atol=1e-6)
    ev = np.linalg.eigvalsh(np.asarray(K, dtype=np.float64))
    assert ev.min() >= -1e-5 * max(ev.max(), 1.0) if dtype == jnp.float32 else ev.min() >= -1e-8 * max(ev.max(), 1.0)


def test_gram_matches_loop(kernel):
    X1, X2 = _points(4), _points(3, seed=1)
    K = eqgp.gram(kernel, X1, X2)
    assert_close(K, [[kernel(a, b) for b in X2] for a in X1], rtol=1e-13)


def test_closed_forms():
    x1, x2 = jnp.array([0.1, 0.2, 0.3]), jnp.array([0.5, -0.1, 0.7])
    r = float(jnp.linalg.norm((x1 - x2) / 1.3))
    assert_close(kernels.RBF(1.3, 2.0)(x1, x2), 2.0 * np.exp(-0.5 * r**2), rtol=1e-14)
    assert_close(kernels.Matern12(1.3)(x1, x2), np.exp(-r), rtol=1e-14)
    assert_close(kernels.Matern32(1.3)(x1, x2), (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r), rtol=1e-14)
    assert_close(
        kernels.Matern52(1.3)(x1, x2), (1 + np.sqrt(5) * r + 5 / 3 * r**2) * np.exp(-np.sqrt(5) * r), rtol=1e-14
    )
    assert_close(kernels.RationalQuadratic(1.3, alpha=0.7)(x1, x2), (1 + r**2 / 1.4) ** -0.7, rtol=1e-14)
    p = np.exp(-2 * np.sum(np.sin(np.pi * np.asarray(x1 - x2) / 2.0) ** 2) / 1.3**2)
    assert_close(kernels.Periodic(1.3, period=2.0)(x1, x2), p, rtol=1e-14)
    assert_close(kernels.Polynomial(2, 0.5, 0.3)(x1, x2), (0.5 * float(x1 @ x2) + 0.3) ** 2, rtol=1e-14)


def test_constrained_storage_and_properties():
    k = kernels.RBF([0.5, 2.0], variance=3.0)
    assert_close(k.lengthscale, [0.5, 2.0], rtol=1e-14)
    assert_close(k.variance, 3.0, rtol=1e-14)
    # Any raw value gives a positive hyper-parameter.
    k = eqx.tree_at(lambda k: k.raw_variance, k, jnp.asarray(-50.0))
    assert float(k.variance) > 0


def test_user_kernel_in_five_lines():
    k = UserRBF(jnp.asarray(0.5))
    X = _points(4)
    assert_close(eqgp.gradient_gram(k, X, X), eqgp.gradient_gram(kernels.RBF(1.0), X, X), rtol=1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_hyperparameters(bad):
    with pytest.raises(ValueError, match="lengthscale"):
        kernels.RBF(bad)


def test_ard_length_mismatch():
    with pytest.raises(ValueError, match="ARD lengthscales"):
        eqgp.gram(kernels.RBF([1.0, 2.0]), _points(2), _points(2))


def test_polynomial_degree_validated():
    with pytest.raises(ValueError, match="degree"):
        kernels.Polynomial(0)


def test_kernel_algebra_types():
    a, b = kernels.RBF(), kernels.Linear()
    assert isinstance(a + b, kernels.Sum)
    assert isinstance(a * b, kernels.Product)
    assert isinstance(2.0 * a, kernels.Product) and isinstance(a * 2.0, kernels.Product)
    assert sum([a, b]) == kernels.Sum(a, b) or isinstance(sum([a, b]), kernels.Sum)
