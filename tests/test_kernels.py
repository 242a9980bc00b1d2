import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ALL_KERNELS, D, assert_close, jit_roundtrip, points as _points

import eqgp
from eqgp import kernels


class UserRBF(kernels.AbstractKernel):
    scale: jax.Array

    def __call__(self, x1, x2):
        return jnp.exp(-self.scale * jnp.sum((x1 - x2) ** 2))


@pytest.fixture(params=sorted(ALL_KERNELS))
def kernel(request):
    return ALL_KERNELS[request.param]()


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
    with pytest.raises(ValueError, match="ARD `lengthscale`"):
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


@pytest.mark.parametrize(
    "name, smoothness",
    [("rbf", np.inf), ("m12", 0), ("m32", 1), ("m52", 2), ("sum", 2), ("product", np.inf), ("warped", 2)],
)
def test_smoothness_declared_and_composed(name, smoothness):
    assert ALL_KERNELS[name]().smoothness == smoothness


def test_smoothness_of_composites_and_warps():
    assert (kernels.RBF() + kernels.Matern12()).smoothness == 0
    assert (kernels.Matern32() * kernels.RBF()).smoothness == 1
    relu = eqx.nn.MLP(D, D, 4, 1, activation=jax.nn.relu, key=jax.random.key(0))
    assert kernels.Warped(kernels.RBF(), relu).smoothness == 0
    assert kernels.Warped(kernels.RBF(), eqgp.nn.SumCumProd()).smoothness == np.inf

    class Once(kernels.AbstractKernel):
        smoothness = 1

        def __call__(self, x1, x2):
            return jnp.exp(-jnp.sqrt(jnp.sum((x1 - x2) ** 2) + 1.0))

    assert Once().smoothness == 1
    with pytest.raises(ValueError, match="Hessian observations take 2 derivative.*Once is only 1"):
        eqgp.operator_gram(Once(), ((eqgp.Hessian(), _points(2)),), ((eqgp.Value(), _points(2)),))


@pytest.mark.parametrize(
    "kernel, op",
    [
        (kernels.Matern12(1.0), eqgp.Gradient()),
        (kernels.Matern12(1.0), eqgp.Partial(0)),
        (kernels.Matern12(1.0), eqgp.ValueAndGradient()),
        (kernels.Matern32(1.0), eqgp.Hessian()),
        (kernels.Matern32(1.0) + kernels.RBF(), eqgp.Hessian(diagonal=True)),
    ],
)
def test_operator_needing_more_derivatives_is_refused(kernel, op):
    X = _points(3)
    name = type(kernel).__name__
    with pytest.raises(ValueError, match=f"{type(op).__name__} observations take .* kernel {name} is only"):
        eqgp.operator_gram(kernel, ((op, X),), ((op, X),))
    with pytest.raises(ValueError, match=f"kernel {name} is only"):
        eqgp.operator_diag(kernel, op, X)
    obs = eqgp.Observations((op, X, jnp.zeros((X.shape[0], op.size(D)))))
    for solver in (eqgp.Cholesky(), eqgp.ConjugateGradient()):
        gp = eqgp.GaussianProcess(kernel, noise=0.1, solver=solver)
        with pytest.raises(ValueError, match=f"kernel {name} is only"):
            gp.log_marginal_likelihood(obs)
    # What the process does have is still allowed.
    eqgp.operator_gram(kernel, ((eqgp.Value(), X),), ((eqgp.Value(), X),))


def test_constants_add_as_constant_kernels():
    k = kernels.RBF(0.7)
    X = _points(4)
    for s in (k + 1.5, 1.5 + k):
        assert isinstance(s, kernels.Sum)
        assert_close(eqgp.gram(s, X, X), eqgp.gram(k, X, X) + 1.5, rtol=1e-14)
    assert k + 0 is k and 0.0 + k is k
    with pytest.raises(ValueError, match="variance"):
        k + (-1.0)


def test_python_number_fields_warn_at_construction():
    class Scaled(kernels.AbstractKernel):
        scale: float

        def __call__(self, x1, x2):
            return self.scale * jnp.exp(-jnp.sum((x1 - x2) ** 2))

    with pytest.warns(UserWarning, match=r"'scale' hold Python numbers.*jnp.asarray.*static=True"):
        Scaled(2.0)

    class Frozen(kernels.AbstractKernel):
        scale: float = eqx.field(static=True)

        def __call__(self, x1, x2):
            return self.scale * jnp.exp(-jnp.sum((x1 - x2) ** 2))

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Frozen(2.0)
        UserRBF(jnp.asarray(0.5))
        kernels.Polynomial(2)


def test_kernel_returning_a_vector_is_refused():
    class Vector(kernels.AbstractKernel):
        def __call__(self, x1, x2):
            return jnp.exp(-((x1 - x2) ** 2))

    X = _points(3)
    for fn in (
        lambda: eqgp.gram(Vector(), X, X),
        lambda: eqgp.gradient_gram(Vector(), X, X),
        lambda: eqgp.GaussianProcess(Vector(), noise=0.1, solver=eqgp.ConjugateGradient()).log_marginal_likelihood(
            eqgp.Observations.values(X, jnp.zeros(3))
        ),
    ):
        with pytest.raises(TypeError, match=r"Vector.__call__ must return a scalar .* got shape \(3,\)"):
            fn()


def test_noise_vector_is_one_per_operator_output():
    with pytest.raises(ValueError, match="one per operator output"):
        eqgp.GaussianProcess(kernels.RBF(), noise=np.full((2, 2), 0.1))


def test_active_dims_sees_only_its_dimensions():
    X = _points(4)
    k = kernels.ActiveDims(kernels.RBF([0.7, 1.3]), [2, 0])
    assert_close(eqgp.gram(k, X, X), eqgp.gram(kernels.RBF([0.7, 1.3]), X[:, [2, 0]], X[:, [2, 0]]), rtol=1e-14)
    G = eqgp.gradient_gram(k, X, X)  # blocked: [value, d/dx0, d/dx1, d/dx2]
    blocks = np.asarray(G).reshape(D + 1, 4, D + 1, 4)
    assert np.all(blocks[2] == 0) and np.all(blocks[:, :, 2] == 0)  # dimension 1 unused: exact zeros
    ref = eqgp.gradient_gram(kernels.RBF([1.3, 1e9, 0.7]), X, X)  # dimension 1 switched off by a huge lengthscale
    assert_close(G, ref, rtol=1e-8, atol=1e-12)
    # With gradient observations of every dimension, the model still factorises (noise) and predicts.
    f = lambda x: jnp.sin(x[0]) + x[2] ** 2  # noqa: E731
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    post = eqgp.GaussianProcess(k, noise=1e-4).condition(obs)
    assert bool(jnp.all(jnp.isfinite(post.mean(X + 0.1, eqgp.Gradient()))))
    with pytest.raises(ValueError, match="asks for dimension 5"):
        eqgp.gram(kernels.ActiveDims(kernels.RBF(), [5]), X, X)
    with pytest.raises(ValueError, match="distinct"):
        kernels.ActiveDims(kernels.RBF(), [0, 0])
