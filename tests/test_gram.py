import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ALL_KERNELS, assert_close, central_diff, fd_cross_cov, points as _points

import eqgp
from eqgp import kernels

REF = np.load(__file__.rsplit("/", 1)[0] + "/data/gpytorch_reference.npz")
# Kernels whose process is differentiable (Matérn-1/2 is not; White is not continuous).
SMOOTH = sorted(set(ALL_KERNELS) - {"m12", "white"})
# ... and twice differentiable, for Hessian observations (Matérn-3/2 is refused there).
TWICE = [name for name in SMOOTH if ALL_KERNELS[name]().smoothness >= 2]


def _blocked_to_interleaved(A, N, M, D):
    return A.reshape(D + 1, N, D + 1, M).transpose(1, 0, 3, 2).reshape(N * (D + 1), M * (D + 1))


@pytest.mark.parametrize("name", SMOOTH)
def test_gradient_gram_matches_finite_differences(name):
    kernel = ALL_KERNELS[name]()
    X1, X2 = _points(3, seed=2), _points(2, seed=3)
    G = eqgp.gradient_gram(kernel, X1, X2, layout="interleaved")
    G = np.asarray(G).reshape(3, 4, 2, 4)
    for i in range(3):
        for j in range(2):
            assert_close(G[i, :, j, :], fd_cross_cov(kernel, X1[i], X2[j]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", TWICE)
def test_hessian_blocks_match_finite_differences(name):
    kernel = ALL_KERNELS[name]()
    x1, x2 = _points(1, seed=4)[0], _points(1, seed=5)[0]
    # cov(d2f/dx_i dx_j at x1, f at x2) = d2k/dx1_i dx1_j: finite differences of autodiff-free gradients.
    H = eqgp.operator_gram(kernel, (eqgp.Hessian(), x1[None]), (eqgp.Value(), x2[None]))[:, 0]
    fd = central_diff(lambda a: central_diff(lambda b: kernel(b, x2), a, 1e-4), x1, 1e-4)
    iu = np.triu_indices(D := 3)
    assert_close(H, fd[iu], rtol=1e-5, atol=1e-6)
    del D


def test_blocked_layout_and_target_order():
    k = kernels.RBF([0.7, 1.3])
    X1, X2 = _points(4)[:, :2], _points(3, seed=1)[:, :2]
    B = eqgp.gradient_gram(k, X1, X2)
    I = eqgp.gradient_gram(k, X1, X2, layout="interleaved")
    assert B.shape == (12, 9)
    assert_close(_blocked_to_interleaved(B, 4, 3, 2), I, rtol=1e-14)
    # Component-major blocks equal the separately built operator blocks.
    assert_close(B[:4, :3], eqgp.gram(k, X1, X2), rtol=1e-14)
    assert_close(B[4:, 3:], eqgp.operator_gram(k, (eqgp.Gradient(), X1), (eqgp.Gradient(), X2)), rtol=1e-14)
    assert_close(B[4:8, 3:6], eqgp.operator_gram(k, (eqgp.Partial(0), X1), (eqgp.Partial([0]), X2)), rtol=1e-14)


@pytest.mark.parametrize("key", ["rbf_grad_interleaved", "matern52_grad_interleaved"])
def test_matches_gpytorch(key):
    kern = {"rbf": kernels.RBF, "matern52": kernels.Matern52}[key.split("_")[0]](REF["lengthscale"])
    G = eqgp.gradient_gram(kern, jnp.asarray(REF["X1"]), jnp.asarray(REF["X2"]), layout="interleaved")
    assert_close(G, REF[key], rtol=1e-10, atol=1e-12)


def test_matches_gpytorch_self_and_gradgrad():
    X1 = jnp.asarray(REF["X1"])
    k = kernels.Matern52(REF["lengthscale"])
    assert_close(
        eqgp.gradient_gram(k, X1, X1, layout="interleaved"),
        REF["matern52_grad_self_interleaved"],
        rtol=1e-10,
        atol=1e-12,
    )
    # GPyTorch's GradGrad: per point [f, df/dx_i, d2f/dx_i^2], reordered from our operator groups.
    k = kernels.RBF(REF["lengthscale"])
    ops = [(eqgp.Value(), X1), (eqgp.Gradient(), X1), (eqgp.Hessian(diagonal=True), X1)]
    A = eqgp.operator_gram(k, ops, ops)
    N, D = X1.shape
    perm = np.concatenate([np.r_[i, N + np.arange(D) * N + i, N * (D + 1) + np.arange(D) * N + i] for i in range(N)])
    assert_close(A[np.ix_(perm, perm)], REF["rbf_gradgrad_self_interleaved"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("offset", [0.0, 1e-12])
@pytest.mark.parametrize(
    "kern, d2",
    [
        (kernels.Matern52(0.7), 5 / (3 * 0.7**2)),
        (kernels.Matern32(0.7), 3 / 0.7**2),
        (kernels.RBF(0.7), 1 / 0.7**2),
        (kernels.RationalQuadratic(0.7, alpha=2.0), 1 / 0.7**2),
        (kernels.Periodic(0.7, period=2.0), 4 * np.pi**2 / (2.0**2 * 0.7**2)),
    ],
)
def test_coincident_points_exact_and_finite(kern, d2, dtype, offset):
    x = jnp.array([[0.3, -0.2]], dtype)
    y = x + jnp.asarray(offset, dtype)
    G = eqgp.gradient_gram(kern, x, y)
    assert bool(jnp.all(jnp.isfinite(G)))
    expected = np.zeros((3, 3))
    expected[0, 0] = 1.0
    expected[1, 1] = expected[2, 2] = d2
    rtol = 1e-5 if dtype == jnp.float32 else 1e-9
    assert_close(G, expected, rtol=rtol, atol=rtol * d2)


def test_seed_rbf_1d():
    X = jnp.linspace(0, 10, 50)[:, None]
    G = eqgp.gradient_gram(kernels.RBF(1.0), X, X)
    assert G.shape == (100, 100)
    assert_close(jnp.diag(G[:50, :50]), 1.0)
    assert_close(jnp.diag(G[:50, 50:]), 0.0, atol=1e-15)
    assert_close(jnp.diag(G[50:, :50]), 0.0, atol=1e-15)
    assert_close(jnp.diag(G[50:, 50:]), 1.0)


@pytest.mark.parametrize("name", SMOOTH)
def test_gradient_gram_symmetric_psd(name):
    kernel = ALL_KERNELS[name]()
    X = _points(8, seed=7)
    G = eqgp.gradient_gram(kernel, X, X)
    assert_close(G, G.T, rtol=1e-10, atol=1e-12)
    ev = np.linalg.eigvalsh(np.asarray(G))
    assert ev.min() >= -1e-8 * max(ev.max(), 1.0)


def test_mixed_groups_shape_and_diag():
    k = kernels.Matern52(1.0)
    X, Z = _points(5), _points(3, seed=9)
    obs = [(eqgp.Value(), X), (eqgp.Partial([1]), Z), (eqgp.Hessian(), Z)]
    A = eqgp.operator_gram(k, obs, obs)
    assert A.shape == (5 + 3 + 18, 5 + 3 + 18)
    assert_close(
        eqgp.operator_diag(k, eqgp.Gradient(), X),
        jnp.diag(eqgp.operator_gram(k, (eqgp.Gradient(), X), (eqgp.Gradient(), X))),
        rtol=1e-13,
    )


def test_errors_name_the_argument():
    k = kernels.RBF()
    X = _points(3)
    with pytest.raises((TypeError, ValueError), match="X2"):
        eqgp.gradient_gram(k, X, X[:, :2])
    with pytest.raises((TypeError, ValueError), match="X1"):
        eqgp.gram(k, jnp.ones((3, 2), jnp.int32), jnp.ones((3, 2)))
    with pytest.raises((TypeError, ValueError), match="X1"):
        eqgp.gram(k, jnp.ones(3), jnp.ones((3, 1)))
    with pytest.raises((TypeError, ValueError), match="layout"):
        eqgp.gradient_gram(k, X, X, layout="bogus")
    with pytest.raises((TypeError, ValueError), match="kernel"):
        eqgp.gram(lambda a, b: 1.0, X, X)
    with pytest.raises(ValueError, match="dimension 5"):
        eqgp.operator_gram(k, (eqgp.Partial(5), X), (eqgp.Value(), X))


def test_zero_points():
    k = kernels.RBF()
    X = jnp.zeros((0, 2))
    assert eqgp.gradient_gram(k, X, _points(2)[:, :2]).shape == (0, 6)
    assert eqgp.gram(k, X, X).shape == (0, 0)


def test_gram_jit_and_grad_wrt_hyperparameters():
    X = _points(5)

    def f(k):
        return jnp.sum(eqgp.gradient_gram(k, X, X) ** 2)

    k = kernels.Matern52([0.8, 1.1, 1.3])
    g = jax.jit(jax.grad(f))(k)
    eps = 1e-6
    num = []
    for i in range(3):
        e = jnp.zeros(3).at[i].set(eps)
        kp = kernels.Matern52(k.lengthscale + e)
        km = kernels.Matern52(k.lengthscale - e)
        num.append((f(kp) - f(km)) / (2 * eps))
    # d/d raw = d/d ls * sigmoid(raw)
    assert_close(g.raw_lengthscale, np.asarray(num) * jax.nn.sigmoid(k.raw_lengthscale), rtol=1e-6)


def test_reverse_mode_through_a_gradient_block_keeps_no_per_pair_d_by_d_array():
    # The hyper-parameter gradient of a (Gradient, Value) cross-gram at N = M = 20, D = 300. With
    # the squared distance written as sum(d * d), reverse mode over the row side's `jax.grad`
    # kept a one-hot (N, M, D, D) array: 871 MB of temporaries here (240 GB at N = 100, D = 1 000);
    # as a dot, ~10 MB. A memory bound from XLA's compiled buffer plan, not a timing.
    X = jax.random.normal(jax.random.key(0), (20, 300))
    loss = jax.grad(lambda k: jnp.sum(eqgp.operator_gram(k, [(eqgp.Gradient(), X)], [(eqgp.Value(), X)]) ** 2))
    compiled = jax.jit(loss).lower(kernels.RBF(3.0)).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 100e6


def test_a_large_gram_exports_with_default_checks_and_holds_no_custom_call():
    # eqgp's grams are plain XLA: `jax.export` needs no disabled safety check and no eqgp
    # library where the program is loaded. A (3 300, 3 300) float64 gradient gram: 87 MB.
    k = kernels.RBF(jnp.linspace(0.5, 1.5, 10))
    X = jax.random.uniform(jax.random.key(0), (300, 10), jnp.float64)
    exported = jax.export.export(jax.jit(lambda X: eqgp.gradient_gram(k, X, X)))(X)
    assert exported.out_avals[0].shape == (3300, 3300)
    text = exported.mlir_module()
    assert "stablehlo.custom_call" not in text and "@eqgp_" not in text
    restored = jax.export.deserialize(exported.serialize())
    assert_close(restored.call(X), eqgp.gradient_gram(k, X, X), rtol=1e-12, atol=1e-14)


# Structured grams (eqgp._gram._structured_cross): a warped kernel's first-derivative blocks
# from each point's warp value and Jacobian, an invariant kernel's gram as a scan over the
# group. Checked against the pair-by-pair autodiff of the same function, hidden from the
# structured path inside an opaque user kernel.


class _Opaque(kernels.AbstractKernel):
    kernel: kernels.AbstractKernel

    def __call__(self, x1, x2):
        return self.kernel(x1, x2)


class _InverseDistances(eqx.Module):
    n: int = eqx.field(static=True)

    def __call__(self, x):
        r = x.reshape(self.n, 2)
        i, j = np.triu_indices(self.n, k=1)
        return 1.0 / jnp.linalg.norm(r[i] - r[j], axis=-1)


def _structured_kernels():
    warp = eqx.nn.MLP(6, 3, 5, 1, activation=jnp.tanh, key=jax.random.key(3))  # trainable warp
    swap = [[0, 1, 2, 3, 4, 5], [0, 1, 4, 5, 2, 3]]  # atoms 1 and 2 of three in 2-D
    return {
        "warped MLP": kernels.Warped(kernels.RBF(0.9), warp),
        "scaled warped": 2.5 * kernels.Warped(kernels.Matern52(1.4), _InverseDistances(3)),
        "invariant warped": kernels.Invariant(kernels.Warped(kernels.Matern52(0.7), _InverseDistances(3)), swap),
    }


@pytest.mark.parametrize("name", ["warped MLP", "scaled warped", "invariant warped"])
@pytest.mark.parametrize("layout", ["blocked", "interleaved"])
def test_structured_gram_equals_pairwise_autodiff(name, layout):
    k = _structured_kernels()[name]
    X1 = jax.random.normal(jax.random.key(0), (4, 6)) * 1.5
    X2 = jax.random.normal(jax.random.key(1), (3, 6)) * 1.5
    v = jax.random.normal(jax.random.key(2), (6,))
    g1 = [(eqgp.Value(), X1), (eqgp.Gradient(), X1), (eqgp.Partial([0, 4]), X1)]
    g2 = [(eqgp.Gradient(), X2), (eqgp.Directional(v), X2), (eqgp.Value(), X2[:0])]  # zero rows too
    K = eqgp.operator_gram(k, g1, g2, layout=layout)
    K_ref = eqgp.operator_gram(_Opaque(k), g1, g2, layout=layout)
    assert K.shape == K_ref.shape == (4 * 9, 3 * 7)
    assert_close(K, K_ref, rtol=1e-12, atol=1e-13)
    # Second derivatives need the warp's curvature: those blocks keep the pairwise path.
    assert_close(
        eqgp.operator_gram(k, [(eqgp.Hessian(), X1)], g2), eqgp.operator_gram(_Opaque(k), [(eqgp.Hessian(), X1)], g2)
    )


@pytest.mark.parametrize("name", ["warped MLP", "invariant warped"])
def test_structured_likelihood_gradient_equals_pairwise_autodiff(name):
    """The dense pullback takes the structured gram for whole blocks; the gradient with
    respect to every array (kernel, warp weights, noise) matches the pairwise path's."""
    k = _structured_kernels()[name]
    X = jax.random.normal(jax.random.key(4), (5, 6)) * 1.5
    obs = eqgp.Observations((eqgp.Value(), X, jnp.sin(X[:, 0])), (eqgp.Gradient(), X, jnp.cos(X)))
    loss = lambda m: m.log_marginal_likelihood(obs)  # noqa: E731
    gp = eqgp.GaussianProcess(k, noise=[1e-2, 1e-2])
    ref = eqgp.GaussianProcess(_Opaque(k), noise=[1e-2, 1e-2])
    assert_close(loss(gp), loss(ref), rtol=1e-12)
    grads, grads_ref = eqx.filter_grad(loss)(gp), eqx.filter_grad(loss)(ref)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref), strict=True):
        assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_structured_invariant_gram_refuses_points_of_another_dimension():
    k = _structured_kernels()["invariant warped"]
    with pytest.raises(ValueError, match="acts on 6 dimensions; the points have 4"):
        eqgp.gradient_gram(k, np.ones((2, 4)), np.ones((2, 4)))
