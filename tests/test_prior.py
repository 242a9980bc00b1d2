"""The prior of some observations: noise per group, the mean of each operator, and the value
checks under `jit` that name what is wrong."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels
from eqgp._prior import covariance, group_mean, group_noise, noise_per_group, prior


def _obs():
    X = jnp.array([[0.0, 1.0], [0.5, -0.5], [1.0, 0.2]])
    return eqgp.Observations(
        (eqgp.ValueAndGradient(), X, jnp.arange(9.0).reshape(3, 3), jnp.array([0.1, 0.2, 0.3])),
        (eqgp.Value(), X[:2], jnp.array([1.0, 2.0]), jnp.array([5.0, 6.0])),  # known noise per target
    )


def test_group_noise_is_component_major_model_plus_known():
    obs = _obs()
    g0, g1 = obs.groups
    # Model noise one per output (value, d/dx0, d/dx1), known noise one per output.
    assert_close(group_noise(jnp.array([1.0, 2.0, 3.0]), g0), jnp.repeat(jnp.array([1.1, 2.2, 3.3]), 3), rtol=1e-15)
    assert_close(group_noise(jnp.asarray(1.0), g1), jnp.array([6.0, 7.0]), rtol=1e-15)
    # Known noise one per target (N, P): its rows follow the targets' component-major order.
    X = jnp.array([[0.0, 1.0], [0.5, -0.5]])
    known = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    (g2,) = eqgp.Observations((eqgp.ValueAndGradient(), X, jnp.zeros((2, 3)), known)).groups
    want = jnp.array([1.1, 1.4, 2.2, 2.5, 3.3, 3.6])  # value noise of both points, then d/dx0's, d/dx1's
    assert_close(group_noise(jnp.array([1.0, 2.0, 3.0]), g2), want, rtol=1e-15)


def test_noise_per_group_shares_one_entry_and_checks_shapes():
    obs = _obs()
    one = (jnp.asarray(0.5),)
    assert noise_per_group(one, obs) == one * 2
    with pytest.raises(ValueError, match="the model has 3 noise entries but the observations have 2 groups"):
        noise_per_group((jnp.asarray(0.5),) * 3, obs)
    with pytest.raises(ValueError, match=r"noise entry 1 has shape \(3,\), which does not fit group 1"):
        noise_per_group((jnp.asarray(0.5), jnp.ones(3)), obs)


def test_prior_residual_and_diagonal():
    obs = _obs()
    mean = eqgp.ConstantMean(2.0)
    noise = noise_per_group((jnp.asarray(0.5),), obs)
    cov, r = prior(kernels.RBF(1.0), mean, noise, obs)
    # The constant mean shifts values only: its derivatives are zero.
    y = obs.flat_targets()
    m = jnp.concatenate([jnp.full(3, 2.0), jnp.zeros(6), jnp.full(2, 2.0)])
    assert_close(r, y - m, rtol=1e-15)
    assert_close(group_mean(mean, eqgp.Gradient(), obs.groups[0].X), jnp.zeros(6), rtol=0)
    K = eqgp.operator_gram(kernels.RBF(1.0), obs, obs)
    assert_close(cov.as_matrix(), K + jnp.diag(cov.noise), rtol=1e-14)
    assert_close(cov.noise, covariance(kernels.RBF(1.0), noise, obs).noise, rtol=0)
    # The kernel diagonal is computed directly, not as diag(K) - noise (exact beside a huge noise).
    assert_close(cov.kernel_diagonal(), jnp.diagonal(K), rtol=1e-14)


def test_padding_rows_keep_an_exact_kernel_diagonal():
    X = jnp.array([[0.1], [0.2]])
    obs = eqgp.Observations.values(X, jnp.zeros(2), noise=jnp.array([0.0, 1e20]))
    cov, _ = prior(kernels.RBF(1.0, variance=1e-3), eqgp.ZeroMean(), (jnp.asarray(0.0),), obs)
    assert_close(cov.kernel_diagonal(), jnp.full(2, 1e-3), rtol=1e-15)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda gp: eqx.tree_at(lambda m: m.kernel.kernel2.raw_lengthscale, gp, jnp.asarray(jnp.nan)),
         "kernel hyper-parameter `kernel2.raw_lengthscale` is NaN or inf"),
        (lambda gp: eqx.tree_at(lambda m: m.kernel.kernel1.raw_variance, gp, jnp.asarray(jnp.inf)),
         "kernel hyper-parameter `kernel1.raw_variance` is NaN or inf"),
        (lambda gp: eqx.tree_at(lambda m: m.mean.constant, gp, jnp.asarray(jnp.nan)),
         "mean-function parameter `constant` is NaN or inf"),
        (lambda gp: eqx.tree_at(lambda m: m.raw_noise, gp, (jnp.asarray(jnp.nan),)), "the noise variance is NaN"),
    ],
)  # fmt: skip
def test_value_checks_under_jit_name_the_parameter(mutate, message):
    obs = _obs()
    gp = eqgp.GaussianProcess(kernels.Matern52(1.0) * kernels.RBF([1.0, 2.0]), mean=0.3, noise=1e-2)
    lml = eqx.filter_jit(lambda m: m.log_marginal_likelihood(obs))
    assert jnp.isfinite(lml(gp))
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(lml(mutate(gp)))
