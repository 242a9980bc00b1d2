import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels

REF = np.load(__file__.rsplit("/", 1)[0] + "/data/gpytorch_reference.npz")


def _f(X):
    return jnp.sin(X[:, 0]) * jnp.cos(X[:, 1])


def _grad_f(X):
    return jnp.stack([jnp.cos(X[:, 0]) * jnp.cos(X[:, 1]), -jnp.sin(X[:, 0]) * jnp.sin(X[:, 1])], 1)


def _data(n=12, seed=0):
    X = jax.random.uniform(jax.random.key(seed), (n, 2), jnp.float64, -2, 2)
    return X, _f(X), _grad_f(X)


def _gpytorch_model():
    h = REF["nlml_hypers"]
    # The reference noise values are the variances used: no floor on top.
    gp = eqgp.GaussianProcess(kernels.RBF(h[2:4], variance=h[1]), mean=float(h[0]), noise=[h[4:7]], noise_floor=0.0)
    Y = REF["nlml_Y_interleaved"]
    obs = eqgp.Observations.values_and_gradients(jnp.asarray(REF["nlml_X"]), Y[:, 0], Y[:, 1:])
    return gp, obs


def test_nlml_matches_gpytorch():
    gp, obs = _gpytorch_model()
    assert_close(-gp.log_marginal_likelihood(obs), REF["nlml_total"], rtol=1e-11)


def test_posterior_matches_gpytorch():
    gp, obs = _gpytorch_model()
    post = gp.condition(obs)
    Xs = jnp.asarray(REF["post_Xs"])
    assert_close(post.mean(Xs, eqgp.ValueAndGradient()), REF["post_mean_interleaved"], rtol=1e-7, atol=1e-8)
    assert_close(post.variance(Xs, eqgp.ValueAndGradient()), REF["post_var_interleaved"], rtol=1e-6, atol=1e-8)


def _dense_pieces(gp, obs):
    K = eqgp.operator_gram(gp.kernel, obs, obs)
    noise = gp._noise_for(obs)
    diag = jnp.concatenate(
        [
            jnp.repeat(jnp.broadcast_to(n, (g.targets.shape[1],)) + g.noise, g.X.shape[0])
            for g, n in zip(obs.groups, noise)
        ]
    )

    def group_mean(g):
        return jax.vmap(lambda x: g.operator.apply(gp.mean, x), out_axes=1)(g.X).reshape(-1)

    m = jnp.concatenate([group_mean(g) for g in obs.groups])
    return K + jnp.diag(diag), m


def _mixed_obs():
    X, y, G = _data(10)
    Z = jax.random.uniform(jax.random.key(3), (4, 2), jnp.float64, -2, 2)
    return eqgp.Observations(
        (eqgp.Value(), X, y),
        (eqgp.Partial([1]), Z, _grad_f(Z)[:, 1:]),
        (eqgp.Gradient(), Z[:2], _grad_f(Z[:2]), 1e-4),
    )


def test_lml_equals_logpdf_and_grad_equals_autodiff_through_cholesky():
    obs = _mixed_obs()
    gp = eqgp.GaussianProcess(kernels.Matern52([0.9, 1.3], variance=1.2), mean=0.3, noise=[1e-3, 2e-3, 3e-3])

    def dense(gp):
        K, m = _dense_pieces(gp, obs)
        return jax.scipy.stats.multivariate_normal.logpdf(obs.flat_targets(), m, K)

    assert_close(gp.log_marginal_likelihood(obs), eqx.filter_jit(dense)(gp), rtol=1e-11)
    g = eqx.filter_jit(eqx.filter_grad(lambda m: m.log_marginal_likelihood(obs)))(gp)
    g_ref = eqx.filter_jit(eqx.filter_grad(dense))(gp)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_posterior_equals_direct_dense_formula():
    obs = _mixed_obs()
    gp = eqgp.GaussianProcess(kernels.RBF([0.9, 1.3]), mean=0.1, noise=[1e-3, 2e-3, 3e-3])
    post = gp.condition(obs)
    Xs = jax.random.uniform(jax.random.key(9), (6, 2), jnp.float64, -2, 2)
    K, m = _dense_pieces(gp, obs)
    op = eqgp.ValueAndGradient()
    Ks = eqgp.operator_gram(gp.kernel, (op, Xs), obs)
    Kss = eqgp.operator_gram(gp.kernel, (op, Xs), (op, Xs))
    ms = jnp.concatenate([jnp.full(6, 0.1), jnp.zeros(12)])
    mean = ms + Ks @ jnp.linalg.solve(K, obs.flat_targets() - m)
    cov = Kss - Ks @ jnp.linalg.solve(K, Ks.T)
    assert_close(post.mean(Xs, op), mean.reshape(3, 6).T, rtol=1e-9, atol=1e-10)
    assert_close(post.covariance(Xs, op), cov, rtol=1e-7, atol=1e-10)
    assert_close(post.variance(Xs, op), jnp.diag(cov).reshape(3, 6).T, rtol=1e-7, atol=1e-10)
    assert_close(post.variance(Xs), jnp.diag(cov)[:6], rtol=1e-7, atol=1e-10)
    # Noisy predictions add the group's noise.
    assert_close(post.variance(Xs, noise_group=0), jnp.diag(cov)[:6] + 1e-3, rtol=1e-7, atol=1e-10)


def test_gradient_posterior_interpolates_observed_gradients():
    X, y, G = _data(15)
    gp = eqgp.GaussianProcess(kernels.RBF(1.0), noise=1e-8)
    post = gp.condition(eqgp.Observations.values_and_gradients(X, y, G))
    assert_close(post.mean(X, eqgp.Gradient()), G, atol=1e-4)
    assert_close(post.mean(X), y, atol=1e-4)
    assert float(jnp.max(post.variance(X, eqgp.Gradient()))) < 1e-6


def test_gradients_only_and_sampling(getkey):
    X, _, G = _data(10)
    gp = eqgp.GaussianProcess(kernels.Matern52(1.0), noise=1e-6)
    post = gp.condition(eqgp.Observations.gradients(X, G))
    Xs = X[:3]
    s = post.sample(getkey(), Xs, eqgp.Gradient(), num_samples=4000)
    assert s.shape == (4000, 3, 2)
    assert_close(s.mean(0), post.mean(Xs, eqgp.Gradient()), atol=5e-3)
    s1 = post.sample(getkey(), Xs, num_samples=3000)
    assert s1.shape == (3000, 3)
    assert_close(s1.var(0), post.variance(Xs), rtol=0.15, atol=1e-3)


def test_mean_module_enters_derivative_observations():
    class Linear(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return x @ self.w

    X, y, G = _data(5)
    gp = eqgp.GaussianProcess(kernels.RBF(1.0), mean=Linear(jnp.array([2.0, -1.0])), noise=1e-6)
    post = gp.condition(
        eqgp.Observations.values_and_gradients(X, 2 * X[:, 0] - X[:, 1], jnp.tile(jnp.array([2.0, -1.0]), (5, 1)))
    )
    Xs = jax.random.uniform(jax.random.key(4), (3, 2), jnp.float64, -2, 2)
    # Data exactly equal to the mean: the posterior is the mean, values and gradients.
    assert_close(post.mean(Xs), 2 * Xs[:, 0] - Xs[:, 1], atol=1e-10)
    assert_close(post.mean(Xs, eqgp.Gradient()), jnp.tile(jnp.array([2.0, -1.0]), (3, 1)), atol=1e-10)


def test_non_pd_raises_clear_error_under_jit():
    X = jnp.zeros((3, 1))
    gp = eqgp.GaussianProcess(kernels.RBF(1.0), noise=1e-30, noise_floor=0.0)  # duplicate points, no noise
    obs = eqgp.Observations.values(X, jnp.zeros(3))
    with pytest.raises(
        Exception, match="Cholesky factorisation of the observation covariance failed.*Raise the jitter"
    ):
        eqx.filter_jit(lambda m: m.log_marginal_likelihood(obs))(gp).block_until_ready()


def test_nan_targets_raise():
    gp = eqgp.GaussianProcess(kernels.RBF(1.0))
    obs = eqgp.Observations.values(jnp.ones((2, 1)), jnp.array([0.0, jnp.nan]))
    with pytest.raises(Exception, match="NaN"):
        eqx.filter_jit(lambda m: m.log_marginal_likelihood(obs))(gp).block_until_ready()


def test_float32_end_to_end():
    X, y, G = _data(8)
    X, y, G = X.astype(jnp.float32), y.astype(jnp.float32), G.astype(jnp.float32)
    gp = eqgp.GaussianProcess(kernels.RBF(1.0), noise=1e-3)
    gp = jax.tree.map(lambda a: a.astype(jnp.float32) if eqx.is_inexact_array(a) else a, gp)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    lml = gp.log_marginal_likelihood(obs)
    assert lml.dtype == jnp.float32 and bool(jnp.isfinite(lml))
    assert post_ok(gp.condition(obs), X)


def post_ok(post, X):
    m = post.mean(X, eqgp.Gradient())
    return m.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(m)))


@pytest.mark.slow  # ~20s on 2 cores: CI's slow stage
def test_update_equals_a_fresh_condition():
    f = lambda x: jnp.sin(2 * x[0]) * jnp.cos(x[1])  # noqa: E731
    X = jax.random.uniform(jax.random.key(0), (10, 2), jnp.float64, -1, 1)
    Xn = jax.random.uniform(jax.random.key(1), (3, 2), jnp.float64, -1, 1)
    vg = jax.vmap(jax.value_and_grad(f))
    (y, G), (yn, Gn) = vg(X), vg(Xn)
    old = eqgp.Observations.values_and_gradients(X, y, G)
    new = eqgp.Observations(
        (eqgp.ValueAndGradient(), Xn, jnp.concatenate([yn[:, None], Gn], 1)),
        (eqgp.Value(), Xn[:1] + 0.3, jnp.array([0.1])),
    )
    gp = eqgp.GaussianProcess(kernels.Matern52([0.7, 0.9]), mean=0.2, noise=1e-4)
    updated = gp.condition(old).update(new)
    fresh = gp.condition(eqgp.Observations(*old.groups, *new.groups))
    assert_close(updated.state.factor, fresh.state.factor, rtol=1e-9, atol=1e-12)
    assert_close(updated.alpha, fresh.alpha, rtol=1e-8, atol=1e-10)
    Xs = jax.random.uniform(jax.random.key(2), (5, 2), jnp.float64, -1, 1)
    for op in (eqgp.Value(), eqgp.Gradient()):
        assert_close(updated.mean(Xs, op), fresh.mean(Xs, op), rtol=1e-9, atol=1e-11)
        assert_close(updated.variance(Xs, op), fresh.variance(Xs, op), rtol=1e-7, atol=1e-12)
    with pytest.raises(ValueError, match="noise must be one entry shared by all groups"):
        two = eqgp.Observations((eqgp.Value(), X, y), (eqgp.Gradient(), X, G))
        eqgp.GaussianProcess(kernels.RBF(1.0), noise=[1e-4, 1e-3]).condition(two).update(new)
    # Matrix-free: warm-started from the old solution; equal to the exact posterior to CG's tolerance.
    cg = eqx.tree_at(lambda m: m.solver, gp, eqgp.ConjugateGradient(rtol=1e-10, preconditioner_rank=20))
    updated_cg = cg.condition(old).update(new)
    assert_close(updated_cg.alpha, fresh.alpha, rtol=1e-6, atol=1e-8)
    assert_close(updated_cg.mean(Xs), fresh.mean(Xs), rtol=1e-8, atol=1e-10)


def test_padding_with_uninformative_targets_changes_nothing():
    # Rows with a huge known noise are ignored: a data set padded to a fixed size (one
    # compiled program for every size, as in a Bayesian-optimisation loop) trains and
    # predicts as the unpadded one.
    X = jax.random.uniform(jax.random.key(1), (5, 2), jnp.float64)
    y, G = jax.vmap(jax.value_and_grad(lambda x: jnp.sin(3 * x[0]) * x[1]))(X)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    pad = 3
    noise = jnp.concatenate([jnp.zeros((5, 3)), jnp.full((pad, 3), 1e12)])
    padded = eqgp.Observations.values_and_gradients(
        jnp.concatenate([X, jnp.broadcast_to(X[:1], (pad, 2))]),
        jnp.concatenate([y, jnp.zeros(pad)]),
        jnp.concatenate([G, jnp.zeros((pad, 2))]),
        noise=noise,
    )
    gp = eqgp.GaussianProcess(kernels.Matern52([0.5, 0.7], variance=1.3), mean=0.2, noise=1e-4)
    grad = eqx.filter_jit(eqx.filter_grad(lambda m, o: m.log_marginal_likelihood(o)))
    for a, b in zip(jax.tree.leaves(grad(gp, padded)), jax.tree.leaves(grad(gp, obs))):
        assert_close(a, b, rtol=1e-8, atol=1e-9)
    Xs = jax.random.uniform(jax.random.key(2), (7, 2), jnp.float64)
    p1, p2 = gp.condition(padded), gp.condition(obs)
    assert_close(p1.mean(Xs), p2.mean(Xs), rtol=1e-9, atol=1e-10)
    assert_close(p1.variance(Xs), p2.variance(Xs), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("N", [100, 400])
def test_compiled_memory_of_the_dense_path_in_covariance_matrices(N):
    # XLA's buffer assignment (`memory_analysis`), in units of one R x R float64 matrix,
    # temporaries plus outputs, at R = 600 and 2 400 (values and gradients; compiled, not
    # run). The gram is written slab by slab into one buffer that LAPACK factors in place
    # and that becomes the posterior's factor; the likelihood's backward pass overwrites the
    # factor with K^{-1} and pulls back from it in chunks (the cotangent (alpha alpha^T -
    # K^{-1}) / 2 is never formed). Issue 31's targets: 1.3 to condition, 2.3 for the
    # likelihood's gradient.
    D = 5
    X = jax.random.normal(jax.random.key(0), (N, D), jnp.float64)
    f = lambda x: jnp.sum(jnp.sin(x))  # noqa: E731
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    matrix = (N * (D + 1)) ** 2 * 8
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.full(D, 2.0)), mean=0.0, noise=1e-4)

    def used(fn, *args):
        m = jax.jit(fn).lower(*args).compile().memory_analysis()
        return (m.temp_size_in_bytes + m.output_size_in_bytes) / matrix

    Xs = jax.random.normal(jax.random.key(1), (50, D), jnp.float64)
    nll_grad = lambda g, o: eqx.filter_grad(lambda g: -g.log_marginal_likelihood(o))(g)  # noqa: E731
    if N == 100:  # small (<= 16 MiB): built and pulled back in one piece (compile time)
        assert used(lambda g, o: g.condition(o), gp, obs) <= 2.3
        assert used(nll_grad, gp, obs) <= 3.3  # 3.10 (16 MiB at most: compile time first)
        post = gp.condition(obs)
        assert used(lambda p, x: (p.mean(x), p.variance(x)), post, Xs) <= 0.3
    else:
        assert used(lambda g, o: g.condition(o), gp, obs) <= 1.3
        assert used(lambda g, o: g.log_marginal_likelihood(o), gp, obs) <= 1.3
        assert used(nll_grad, gp, obs) <= 1.4  # 1.25: K^{-1} over the factor, the cotangent never formed


def test_constant_mean_accepts_a_scalar_array():
    """A constant mean computed by JAX (e.g. an energy offset) is a number too."""
    X = jnp.linspace(0.0, 1.0, 4)[:, None]
    gp = eqgp.GaussianProcess(kernels.RBF(0.5), mean=jnp.asarray(3.0), noise=1e-4)
    post = gp.condition(eqgp.Observations((eqgp.Value(), X, jnp.full(4, 3.0))))
    assert_close(post.mean(X + 5.0), jnp.full(4, 3.0), atol=1e-6)
