"""Acquisition functions against closed forms and Monte Carlo, their stability far from the
incumbent, and the multi-start maximiser on functions with known maxima."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

import eqgp
from eqgp import kernels


@pytest.fixture(scope="module")
def post():
    f = lambda x: jnp.sin(3 * x[0]) * jnp.cos(2 * x[1])  # noqa: E731
    X = jax.random.uniform(jax.random.key(0), (12, 2), jnp.float64, -1, 1)
    y, G = jax.vmap(jax.value_and_grad(f))(X)
    gp = eqgp.GaussianProcess(kernels.RBF([0.6, 0.6]), noise=1e-6)
    return gp.condition(eqgp.Observations.values_and_gradients(X, y, G)), float(jnp.max(y)), float(jnp.min(y))


@pytest.mark.parametrize("maximize", [True, False])
def test_expected_improvement_matches_monte_carlo(post, maximize):
    p, ymax, ymin = post
    best = ymax if maximize else ymin
    X = jax.random.uniform(jax.random.key(1), (6, 2), jnp.float64, -1, 1)
    ei = eqgp.expected_improvement(p, X, best, maximize=maximize)
    m, s = p.mean(X), jnp.sqrt(p.variance(X))
    draws = m[None] + s[None] * jax.random.normal(jax.random.key(2), (400_000, 6), jnp.float64)
    mc = jnp.mean(jnp.maximum(draws - best if maximize else best - draws, 0.0), axis=0)
    assert ei.shape == (6,) and bool(jnp.all(ei >= 0))
    assert_close(ei, mc, rtol=2e-2, atol=3e-3 * float(jnp.max(s)))
    assert_close(jnp.exp(eqgp.log_expected_improvement(p, X, best, maximize=maximize)), ei, rtol=1e-9, atol=1e-300)


def test_log_ei_is_finite_with_gradients_far_from_the_incumbent(post):
    p, ymax, _ = post
    X = jnp.array([[0.1, 0.2], [0.5, -0.5], [2.5, 2.5]])  # the last far outside the data: sd ~ 1
    for best in (ymax + 1.0, ymax + 40.0, ymax + 1e4):
        ei = eqgp.expected_improvement(p, X, best)
        log_ei = eqgp.log_expected_improvement(p, X, best)
        assert bool(jnp.all(jnp.isfinite(log_ei))), (best, log_ei)
        g = jax.grad(lambda X, b: jnp.sum(eqgp.log_expected_improvement(p, X, b)))(X, best)
        assert bool(jnp.all(jnp.isfinite(g))) and bool(jnp.any(g != 0))
        representable = ei > 1e-280
        assert_close(log_ei[representable], jnp.log(ei[representable]), rtol=1e-8)
    # Far in the tail log EI follows its asymptote log(sd phi(z) / z^2) (relative error ~ 3/z^2).
    z = jnp.array([-50.0, -1e3, -1e5, -1e7])
    h = eqgp._acquisition._log_h(z)
    asym = -0.5 * z**2 - 0.5 * np.log(2 * np.pi) - 2 * jnp.log(-z)
    assert_close(h, asym, rtol=1e-6)
    # And matches the direct formula where that is accurate.
    z = jnp.linspace(-8.0, 5.0, 27)
    direct = jnp.log(jax.scipy.stats.norm.pdf(z) + z * jax.scipy.stats.norm.cdf(z))
    assert_close(eqgp._acquisition._log_h(z), direct, rtol=1e-7)


def test_upper_confidence_bound(post):
    p, _, _ = post
    X = jnp.array([[0.1, 0.2], [0.9, -0.3]])
    m, s = p.mean(X), jnp.sqrt(p.variance(X))
    assert_close(eqgp.upper_confidence_bound(p, X, beta=4.0), m + 2 * s, rtol=1e-12)
    assert_close(eqgp.upper_confidence_bound(p, X, beta=4.0, maximize=False), -(m - 2 * s), rtol=1e-12)


def test_maximiser_finds_known_maxima_inside_the_box():
    c = jnp.array([0.3, -1.2, 2.0])
    acq = lambda X: -jnp.sum((X - c[None]) ** 2, axis=-1)  # noqa: E731
    x, v = eqgp.maximize_acquisition(
        acq, -jnp.ones(3) * 2, jnp.ones(3) * 3, jax.random.key(0), steps=300, learning_rate=0.05
    )
    assert_close(x, c, atol=1e-3)
    # A maximum outside the box: the best point is on the boundary, never outside.
    lo, hi = jnp.zeros(3), jnp.ones(3)
    x, v = eqgp.maximize_acquisition(acq, lo, hi, jax.random.key(1), steps=300, learning_rate=0.05)
    assert bool(jnp.all((x >= lo) & (x <= hi)))
    assert_close(x, jnp.clip(c, lo, hi), atol=1e-3)
    assert_close(v, acq(x[None])[0], rtol=1e-12)


def test_maximiser_initial_starts_and_settling():
    # A narrow peak that one uniform start does not see (its gradient vanishes there): the
    # `initial` start near it finds it, and the decaying rate settles on it precisely.
    c = jnp.array([0.61, 0.27])
    acq = lambda X: jnp.exp(-jnp.sum((X - c[None]) ** 2, axis=-1) / 0.02**2)  # noqa: E731
    lo, hi = jnp.zeros(2), jnp.ones(2)
    x, v = eqgp.maximize_acquisition(acq, lo, hi, jax.random.key(0), num_starts=1, steps=200)
    assert float(v) < 1e-3
    x, v = eqgp.maximize_acquisition(acq, lo, hi, jax.random.key(0), num_starts=1, steps=200, initial=(c + 0.02)[None])
    assert_close(x, c, atol=1e-5)
    # jaxtyping's hook (on in the tests) or the function's own check names the argument.
    with pytest.raises(Exception, match="initial"):
        eqgp.maximize_acquisition(acq, lo, hi, jax.random.key(0), initial=jnp.zeros(2))


def test_maximiser_on_expected_improvement_under_jit(post):
    p, ymax, _ = post
    lo, hi = -jnp.ones(2), jnp.ones(2)

    @jax.jit
    def propose(key):
        return eqgp.maximize_acquisition(lambda X: eqgp.log_expected_improvement(p, X, ymax), lo, hi, key, steps=60)

    x, v = propose(jax.random.key(3))
    grid = jnp.stack(jnp.meshgrid(*[jnp.linspace(-1, 1, 41)] * 2), -1).reshape(-1, 2)
    best_on_grid = float(jnp.max(eqgp.log_expected_improvement(p, grid, ymax)))
    assert x.shape == (2,) and bool(jnp.all(jnp.abs(x) <= 1.0))
    assert float(v) >= best_on_grid - 0.05 * abs(best_on_grid)


def test_errors_name_the_argument(post):
    p, ymax, _ = post
    with pytest.raises(ValueError, match="`best_f` must be a scalar"):
        eqgp.expected_improvement(p, jnp.zeros((2, 2)), jnp.zeros(2))
    acq = lambda X: -jnp.sum(X**2, axis=-1)  # noqa: E731
    with pytest.raises(ValueError, match="`lower` and `upper` must have the same shape"):
        eqgp.maximize_acquisition(acq, jnp.zeros(2), jnp.ones(3), jax.random.key(0))
    with pytest.raises(ValueError, match="`lower` must be below `upper`"):
        eqgp.maximize_acquisition(acq, jnp.ones(2), jnp.ones(2), jax.random.key(0))
    with pytest.raises(ValueError, match="`num_starts`"):
        eqgp.maximize_acquisition(acq, jnp.zeros(2), jnp.ones(2), jax.random.key(0), num_starts=0)
