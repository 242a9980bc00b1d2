import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels

# Three "atoms" in 2-D (D = 6); atoms 1 and 2 identical: the group swaps them.
SWAP = [0, 1, 4, 5, 2, 3]
GROUP = [list(range(6)), SWAP]


def _points(n, seed=0):
    return jax.random.normal(jax.random.key(seed), (n, 6), jnp.float64)


@pytest.mark.parametrize("one_sided", [True, False])
def test_invariant_kernel_is_invariant_in_each_argument(one_sided):
    base = kernels.Matern52(1.3) if one_sided else kernels.RBF(jnp.linspace(0.7, 1.6, 6))
    k = kernels.Invariant(base, GROUP, one_sided=one_sided)
    X = _points(5)
    for x1 in X:
        for x2 in X[:3]:
            v = k(x1, x2)
            assert_close(k(x1[jnp.asarray(SWAP)], x2), v, rtol=1e-13, atol=0)
            assert_close(k(x1, x2[jnp.asarray(SWAP)]), v, rtol=1e-13, atol=0)
            assert_close(k(x2, x1), v, rtol=1e-13, atol=0)
    K = eqgp.gradient_gram(k, X, X)
    assert float(jnp.min(jnp.linalg.eigvalsh(0.5 * (K + K.T)))) > -1e-10


def test_invariant_kernel_equals_the_explicit_mean_and_its_forces_match_finite_differences():
    base = kernels.Matern52(1.1, variance=2.0)
    k = kernels.Invariant(base, GROUP)
    X = _points(3, seed=1)
    Xs = X[:, jnp.asarray(SWAP)]
    explicit = 0.5 * (eqgp.gram(base, X, X) + eqgp.gram(base, X, Xs))
    assert_close(eqgp.gram(k, X, X), explicit, rtol=1e-13, atol=1e-15)
    # d^2 k / dx1 dx2 by central differences of k itself, at distinct and coincident points.
    h = 1e-4
    for a, b in [(X[0], X[1]), (X[2], X[2])]:
        fd = np.zeros((6, 6))
        for i in range(6):
            for j in range(6):
                ei, ej = h * jnp.eye(6)[i], h * jnp.eye(6)[j]
                fd[i, j] = (k(a + ei, b + ej) - k(a + ei, b - ej) - k(a - ei, b + ej) + k(a - ei, b - ej)) / (4 * h * h)
        K = eqgp.operator_gram(k, (eqgp.Gradient(), a[None]), (eqgp.Gradient(), b[None]))
        assert_close(K, fd, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_invariant_gp_predicts_the_same_at_permuted_points():
    def energy(x):  # symmetric in atoms 1 and 2
        r = x.reshape(3, 2)
        return jnp.sum(jnp.exp(-jnp.sum((r[1:] - r[:1]) ** 2, axis=1)))

    X = _points(6, seed=2)
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(energy)(X), jax.vmap(jax.grad(energy))(X))
    gp = eqgp.GaussianProcess(kernels.Invariant(kernels.RBF(1.5), GROUP), noise=1e-6)
    post = gp.condition(obs)
    Xt = _points(4, seed=3)
    assert_close(post.mean(Xt[:, jnp.asarray(SWAP)]), post.mean(Xt), rtol=1e-10, atol=1e-12)
    # Forces transform with the permutation: the gradient at g x is the gradient at x permuted.
    G, Gs = post.mean(Xt, eqgp.Gradient()), post.mean(Xt[:, jnp.asarray(SWAP)], eqgp.Gradient())
    assert_close(Gs, G[:, jnp.asarray(SWAP)], rtol=1e-9, atol=1e-11)


def test_linear_maps_and_closure():
    P = np.eye(6)[SWAP]  # the swap as a matrix: (P x)[i] = x[SWAP[i]]
    k1 = kernels.Invariant(kernels.RBF(1.0), GROUP)
    k2 = kernels.Invariant(kernels.RBF(1.0), maps=np.stack([np.eye(6), P]))
    X = _points(4, seed=4)
    assert_close(eqgp.gradient_gram(k1, X, X), eqgp.gradient_gram(k2, X, X), rtol=1e-12, atol=1e-14)
    cyc = [1, 2, 0]
    assert sorted(map(tuple, kernels.Invariant.closure([cyc]).tolist())) == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(permutations=[[0, 1, 1]]), "permutation of range"),
        (dict(permutations=[[1, 2, 0]]), "identity"),
        (dict(permutations=[[0, 1, 2], [1, 2, 0]]), "closed under composition"),
        (dict(permutations=[[0, 1, 2], [0, 1, 2]]), "repeated"),
        (dict(permutations=[[0.0, 1.0]]), "integers"),
        (dict(), "exactly one"),
        (dict(permutations=[[0, 1]], maps=np.eye(2)[None]), "exactly one"),
        (dict(maps=np.eye(2)), r"\(G, D, D\)"),
    ],
)
def test_invariant_names_a_bad_group(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernels.Invariant(kernels.RBF(), **kwargs)


def test_invariant_refuses_points_of_another_dimension():
    k = kernels.Invariant(kernels.RBF(), [[0, 1, 2]])
    with pytest.raises(ValueError, match="acts on 3 dimensions"):
        eqgp.gram(k, np.ones((2, 4)), np.ones((2, 4)))


@pytest.mark.slow  # CI's slow stage (keeps the main suite under ~5 min on 2 cores)
def test_forces_only_reproduce_the_energy_up_to_a_constant():
    # A Morse potential of three atoms in 2-D. Forces are -dE/dx: observed as gradients -F.
    def energy(x):
        r = x.reshape(3, 2)
        d = jnp.sqrt(jnp.sum((r[:, None] - r[None]) ** 2, axis=-1) + jnp.eye(3))
        pair = (1 - jnp.exp(-1.5 * (d - 1.0))) ** 2
        return 0.5 * jnp.sum(pair * (1 - jnp.eye(3))) + 7.0  # the offset forces cannot see

    eq = jnp.array([[0.0, 0.0, 1.0, 0.0, 0.5, 0.87]], jnp.float64)
    X = eq + 0.1 * jax.random.normal(jax.random.key(5), (40, 6), jnp.float64)
    F = -jax.vmap(jax.grad(energy))(X)
    obs = eqgp.Observations((eqgp.Gradient(), X, -F))  # forces only
    gp = eqgp.GaussianProcess(kernels.RBF(0.6, variance=0.5), mean=0.0, noise=1e-8)
    post = gp.condition(obs)
    Xt = eq + 0.1 * jax.random.normal(jax.random.key(6), (20, 6), jnp.float64)
    E, Et = post.mean(Xt), jax.vmap(energy)(Xt)
    spread = float(jnp.std(Et))
    rms = float(jnp.sqrt(jnp.mean(((E - E.mean()) - (Et - Et.mean())) ** 2)))
    assert rms < 0.1 * spread  # measured: 0.048 (one test configuration lies far out)
    dF = post.mean(Xt, eqgp.Gradient()) - jax.vmap(jax.grad(energy))(Xt)
    assert float(jnp.sqrt(jnp.mean(dF**2))) < 0.25 * float(jnp.std(F))  # measured: 0.16
