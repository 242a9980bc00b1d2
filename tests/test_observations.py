"""Observation groups and sets: shapes, layouts, noise, validation (also under jit)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels
from eqgp._prior import prior


def test_constructors_and_component_major_targets():
    X = jnp.arange(6.0).reshape(3, 2)
    y, G = jnp.array([1.0, 2.0, 3.0]), jnp.array([[10.0, 20.0], [11.0, 21.0], [12.0, 22.0]])
    obs = eqgp.Observations.values_and_gradients(X, y, G, noise=jnp.array([0.1, 0.2, 0.3]))
    (g,) = obs.groups
    assert isinstance(g.operator, eqgp.ValueAndGradient) and g.targets.shape == (3, 3)
    # All points' values, then every point's d/dx0, then d/dx1: the gram's row order.
    assert_close(g.flat_targets(), [1, 2, 3, 10, 11, 12, 20, 21, 22], rtol=0)
    assert obs.size == 9 and obs.dim == 2
    assert_close(g.noise, [0.1, 0.2, 0.3], rtol=0)
    mixed = eqgp.Observations((eqgp.Value(), X, y), eqgp.ObservationGroup(eqgp.Gradient(), X[:1], G[:1]))
    assert [type(g.operator) for g in mixed.groups] == [eqgp.Value, eqgp.Gradient]
    assert eqgp.Observations.gradients(X, G).groups[0].targets.shape == (3, 2)


def test_validation_names_the_argument():
    X = jnp.ones((4, 2))
    with pytest.raises(
        ValueError, match=r"`targets` for Gradient at 4 points in 2 dimensions must have shape \(4, 2\)"
    ):
        eqgp.ObservationGroup(eqgp.Gradient(), X, jnp.ones((4, 3)))
    with pytest.raises(TypeError, match="`targets` must be floating-point"):
        eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(4, jnp.int32))
    with pytest.raises(ValueError, match=r"`noise` must be a scalar, shape \(1,\) .* or \(4, 1\) .*; or \(4,\)"):
        eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(4), noise=jnp.ones(2))
    with pytest.raises(ValueError, match=r"\(2,\) \(one per output\) or \(4, 2\) \(one per target\); got \(4,\)"):
        eqgp.ObservationGroup(eqgp.Gradient(), X, jnp.ones((4, 2)), noise=jnp.ones(4))
    with pytest.raises(ValueError, match="`noise` must be non-negative and finite"):
        eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(4), noise=-1.0)
    with pytest.raises(ValueError, match="`noise` must be non-negative and finite"):
        eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(4), noise=jnp.array([0.0, 1.0, jnp.inf, 0.0]))
    with pytest.raises(TypeError, match="group 1 must be an ObservationGroup"):
        eqgp.Observations((eqgp.Value(), X, jnp.ones(4)), "gradients")
    with pytest.raises(ValueError, match="needs at least one group"):
        eqgp.Observations()
    with pytest.raises(ValueError, match=r"`group 1 X` has 3 input dimensions"):
        eqgp.Observations((eqgp.Value(), X, jnp.ones(4)), (eqgp.Value(), jnp.ones((2, 3)), jnp.ones(2)))
    with pytest.raises(
        TypeError, match="`X` has dtype float16; eqgp's Gaussian processes compute in float32 or float64"
    ):
        eqgp.Observations.values(X.astype(jnp.float16), jnp.ones(4, jnp.float16))


def test_negative_noise_is_caught_under_jit():
    X = jnp.ones((3, 1))

    @eqx.filter_jit
    def build(n):
        return eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(3), noise=n).noise

    assert float(build(jnp.asarray(0.5))) == 0.5
    with pytest.raises(Exception, match="`noise` of an observation group must be non-negative"):
        jax.block_until_ready(build(jnp.asarray(-0.5)))


def test_observation_validation():
    X = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="targets"):
        eqgp.ObservationGroup(eqgp.Gradient(), X, jnp.ones((4, 3)))
    with pytest.raises(ValueError, match="targets"):
        eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(5))
    with pytest.raises(ValueError, match="noise entries"):
        gp = eqgp.GaussianProcess(kernels.RBF(), noise=[1e-2, 1e-2])
        gp.log_marginal_likelihood(eqgp.Observations.values(X, jnp.ones(4)))


def test_per_target_noise_enters_the_diagonal_in_component_major_order():
    X = jax.random.uniform(jax.random.key(0), (4, 2), jnp.float64)
    noise = jnp.arange(12.0).reshape(4, 3) * 1e-3  # one per target: point i, output p
    obs = eqgp.Observations.values_and_gradients(X, jnp.ones(4), jnp.ones((4, 2)), noise=noise)
    gp = eqgp.GaussianProcess(kernels.RBF([0.5, 0.7]), noise=[jnp.array([1e-2, 2e-2, 3e-2])])
    cov, _ = prior(gp.kernel, gp.mean, gp._noise_for(obs), obs)
    dense = eqgp.operator_gram(gp.kernel, obs, obs)
    expected = (jnp.array([1e-2, 2e-2, 3e-2])[None] + gp._floor(X.dtype) + noise).T.reshape(-1)
    assert_close(jnp.diag(cov.as_matrix() - dense), expected, rtol=1e-12)
    # (N,) for a one-output operator is one noise per point.
    g = eqgp.ObservationGroup(eqgp.Value(), X, jnp.ones(4), noise=jnp.array([0.0, 1.0, 2.0, 3.0]))
    assert g.noise.shape == (4, 1)
