"""The free `log_marginal_likelihood(cov, residual, solver)` and the solvers' own likelihoods:
values against the dense Gaussian log-density, derivatives against autodiff through a dense
Cholesky (every solver, with respect to the kernel, the points, the noise and the residual)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels


def _problem(D=3, N=5):
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -1, 1)
    groups = ((eqgp.Gradient(), X), (eqgp.Value(), X[:3] + 0.1))
    R = N * D + 3
    noise = jnp.concatenate([jnp.full(N * D, 1e-2), jnp.full(3, 2e-2)])  # one per gradient component
    cov = eqgp.Covariance(kernels.RBF([0.9, 1.1, 0.8], variance=1.3), groups, noise)
    r = jax.random.normal(jax.random.key(1), (R,), jnp.float64)
    return cov, r


def _dense(cov, r):
    return jax.scipy.stats.multivariate_normal.logpdf(r, jnp.zeros_like(r), cov.as_matrix())


@pytest.mark.parametrize(
    "solver, rtol",
    [
        (eqgp.Cholesky(), 1e-10),
        (eqgp.StructuredGradients(), 1e-8),
        (eqgp.ConjugateGradient(rtol=1e-12, preconditioner_rank=18, num_probes=64), 5e-3),
    ],
)
def test_value_and_gradient_match_the_dense_density(solver, rtol):
    cov, r = _problem()
    f = eqx.filter_jit(eqx.filter_value_and_grad(lambda args: eqgp.log_marginal_likelihood(*args, solver)))
    ref = eqx.filter_jit(eqx.filter_value_and_grad(lambda args: _dense(*args)))
    (v, g), (v_ref, g_ref) = f((cov, r)), ref((cov, r))
    assert_close(v, v_ref, rtol=rtol)

    # The noise is shared per gradient component (StructuredGradients requires it, and reads one
    # entry per component): compare its cotangent summed per component and over the values.
    def per_component(c):
        noise = c[0].noise
        return eqx.tree_at(
            lambda c: c[0].noise, c, jnp.concatenate([noise[:15].reshape(3, 5).sum(1), noise[15:].sum()[None]])
        )

    leaves, ref_leaves = jax.tree.leaves(per_component(g)), jax.tree.leaves(per_component(g_ref))
    assert len(leaves) == len(ref_leaves) == 6  # lengthscale, variance, two point sets, noise, residual
    for a, b in zip(leaves, ref_leaves):
        scale = float(jnp.max(jnp.abs(b)))
        assert_close(a / scale, b / scale, rtol=0, atol=rtol * 10)


def test_the_residual_cotangent_is_minus_alpha():
    # d/dr log N(r | 0, K) = -K^{-1} r: the custom VJP's second output.
    cov, r = _problem()
    g = eqx.filter_jit(jax.grad(lambda r, cov: eqgp.log_marginal_likelihood(cov, r, eqgp.Cholesky())))(r, cov)
    assert_close(g, -jnp.linalg.solve(cov.as_matrix(), r), rtol=1e-10)


def test_the_residual_shape_is_checked():
    # (A wrong type of `cov` or `solver` is in the catalogue of tests/invalid_cases.py.)
    cov, r = _problem()
    with pytest.raises(ValueError, match=r"`residual` must have shape \(18,\)"):
        eqgp.log_marginal_likelihood(cov, r[:3], eqgp.Cholesky())
