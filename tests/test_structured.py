"""eqgp.StructuredGradients (Kronecker + rank-N^2 Woodbury) against the dense Cholesky path."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels
from eqgp._prior import prior
from eqgp._solvers._structured import _apply_C

KERNELS = {
    "rbf_ard": lambda D: kernels.RBF(jnp.linspace(0.8, 1.6, D), variance=1.3),
    "matern52": lambda D: kernels.Matern52(1.1, variance=0.7),
    "matern32_ard": lambda D: kernels.Matern32(jnp.linspace(1.2, 2.0, D)),
    "rq_ard": lambda D: kernels.RationalQuadratic(jnp.linspace(0.8, 1.6, D), alpha=0.8),
}


def _obs(N, D, dtype=jnp.float64, seed=1):
    X = jax.random.normal(jax.random.key(seed), (N, D), dtype)
    G = jnp.cos(X) + 0.1 * X  # gradients of sum(sin x) + 0.05 |x|^2
    return eqgp.Observations((eqgp.Gradient(), X, G))


def _value_and_grad(gp, obs):
    return eqx.filter_jit(eqx.filter_value_and_grad(lambda m: m.log_marginal_likelihood(obs)))(gp)


def _both(kernel, obs, **kw):
    exact = eqgp.GaussianProcess(kernel, **kw)
    return exact, eqx.tree_at(lambda g: g.solver, exact, eqgp.StructuredGradients())


def test_structure_rebuilds_the_dense_covariance():
    # The decomposition itself: A + U C U^T, assembled densely, equals operator_gram + noise.
    N, D = 6, 4
    obs = _obs(N, D)
    k = kernels.RBF(jnp.linspace(0.8, 1.6, D), variance=1.3)
    gp = eqgp.GaussianProcess(k, noise=jnp.linspace(1e-3, 1e-2, D))
    cov, _ = prior(gp.kernel, gp.mean, gp._noise_for(obs), obs)
    state = eqgp.StructuredGradients().init(cov).block
    A = jnp.einsum("ai,pi,bi->pab", state.Q, 1.0 / state.E, state.Q)  # (D, N, N) blocks of A
    A = jax.scipy.linalg.block_diag(*A)
    U = jnp.einsum("ae,pc->paec", jnp.eye(N), state.Y).reshape(D * N, N * N)
    C = jax.vmap(lambda z: _apply_C(state.c, z.reshape(N, N, 1)).reshape(-1))(jnp.eye(N * N)).T
    assert_close(C, C.T, atol=1e-14)
    assert_close(A + U @ C @ U.T, cov.as_matrix(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ("rq_ard", "matern32_ard") else n for n in sorted(KERNELS)]
)
def test_likelihood_gradient_and_posterior_match_cholesky(name):
    N, D = 7, 5
    obs = _obs(N, D)
    exact, structured = _both(KERNELS[name](D), obs, noise=jnp.linspace(1e-3, 1e-2, D), mean=0.2)
    (v1, g1), (v2, g2) = _value_and_grad(exact, obs), _value_and_grad(structured, obs)
    assert_close(v2, v1, rtol=1e-12)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(b, a, rtol=1e-9, atol=1e-12)
    Xs = jax.random.normal(jax.random.key(3), (4, D))
    p1, p2 = exact.condition(obs), structured.condition(obs)
    for op in (eqgp.Value(), eqgp.Gradient()):
        assert_close(p2.mean(Xs, op), p1.mean(Xs, op), rtol=1e-10, atol=1e-12)
        assert_close(p2.variance(Xs, op), p1.variance(Xs, op), rtol=1e-8, atol=1e-12)
    assert_close(p2.covariance(Xs), p1.covariance(Xs), rtol=1e-8, atol=1e-12)


@pytest.mark.slow  # ~30s on 2 cores: CI's slow stage
def test_values_and_other_observations_by_schur_complement():
    # Values at the gradient points (ValueAndGradient), values elsewhere before or after the
    # gradient group, and a partial-derivative group: all rows besides the gradient block are
    # eliminated densely; every order of rows must come back in the covariance's order.
    D = 4
    X = jax.random.normal(jax.random.key(1), (6, D))
    X2 = jax.random.normal(jax.random.key(2), (3, D))
    G, y, y2 = jnp.cos(X), jnp.sum(jnp.sin(X), 1), jnp.sum(jnp.sin(X2), 1)
    cases = {
        "value_and_gradient": [(eqgp.ValueAndGradient(), X, jnp.concatenate([y[:, None], G], 1))],
        "values_first": [(eqgp.Value(), X2, y2), (eqgp.Gradient(), X, G)],
        "values_last_and_partials": [(eqgp.Gradient(), X, G), (eqgp.Value(), X2, y2), (eqgp.Partial(1), X2, y2)],
        "no_gradient_points": [(eqgp.Gradient(), X[:0], G[:0]), (eqgp.Value(), X2, y2)],
    }
    for name, groups in cases.items():
        obs = eqgp.Observations(*groups)
        exact, structured = _both(kernels.RBF(jnp.linspace(0.8, 1.6, D)), obs, noise=1e-2, mean=0.1)
        (v1, g1), (v2, g2) = _value_and_grad(exact, obs), _value_and_grad(structured, obs)
        assert_close(v2, v1, rtol=1e-12, err_msg=name)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
            assert_close(b, a, rtol=1e-9, atol=1e-12, err_msg=name)
        Xs = X2 + 0.1
        p1, p2 = exact.condition(obs), structured.condition(obs)
        assert_close(p2.mean(Xs), p1.mean(Xs), rtol=1e-10, atol=1e-12, err_msg=name)
        assert_close(p2.variance(Xs, eqgp.Gradient()), p1.variance(Xs, eqgp.Gradient()), rtol=1e-8, atol=1e-12)


def test_high_dimension_more_dimensions_than_points():
    # D >> N, the case the solver is for (here small enough for the dense reference: 1 200 rows).
    obs = _obs(12, 100)
    exact, structured = _both(kernels.RBF(7.0), obs, noise=1e-3)
    (v1, g1), (v2, g2) = _value_and_grad(exact, obs), _value_and_grad(structured, obs)
    assert_close(v2, v1, rtol=1e-10)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(b, a, rtol=1e-7)


def test_coincident_points_one_point_and_no_points():
    obs = _obs(5, 3)
    X = obs.groups[0].X.at[3].set(obs.groups[0].X[1])  # two observations at one point
    dup = eqgp.Observations((eqgp.Gradient(), X, obs.groups[0].targets))
    for o in (dup, _obs(1, 3), _obs(0, 3)):
        exact, structured = _both(kernels.Matern52([0.9, 1.2, 1.5]), o, noise=1e-2)
        (v1, g1), (v2, g2) = _value_and_grad(exact, o), _value_and_grad(structured, o)
        assert_close(v2, v1, rtol=1e-10, atol=1e-12)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
            assert_close(b, a, rtol=1e-8, atol=1e-10)


def test_float32():
    obs = _obs(6, 8, jnp.float32)
    exact, structured = _both(kernels.RBF(jnp.float32(2.0)), obs, noise=jnp.float32(1e-2))
    (v1, g1), (v2, g2) = _value_and_grad(exact, obs), _value_and_grad(structured, obs)
    assert v2.dtype == jnp.float32
    assert_close(v2, v1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert_close(b, a, rtol=1e-3, atol=1e-4)


def test_unsupported_problems_are_refused():
    obs = _obs(4, 3)
    solver = eqgp.StructuredGradients()
    X = obs.groups[0].X
    for groups in ([(eqgp.Value(), X, jnp.zeros(4))], [(eqgp.Gradient(), X, obs.groups[0].targets)] * 2):
        with pytest.raises(ValueError, match="one group of `eqgp.Gradient`"):
            eqgp.GaussianProcess(kernels.RBF(), solver=solver).log_marginal_likelihood(eqgp.Observations(*groups))
    with pytest.raises(TypeError, match="stationary kernel"):
        eqgp.GaussianProcess(kernels.Periodic(), solver=solver).log_marginal_likelihood(obs)
    per_target = 0.1 + 0.1 * jnp.arange(12.0).reshape(4, 3)
    X, G = obs.groups[0].X, obs.groups[0].targets
    known = eqgp.Observations(eqgp.ObservationGroup(eqgp.Gradient(), X, G, per_target))
    with pytest.raises(Exception, match="same noise for every point"):
        eqgp.GaussianProcess(kernels.RBF(), solver=solver).log_marginal_likelihood(known)
