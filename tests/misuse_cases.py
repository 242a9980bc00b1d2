# ruff: noqa: E501 -- the catalogue reads best one case per line
"""A catalogue of misuse that must not be silent: calls a new user makes that run (they are
well-typed, often well-shaped) but whose result would be wrong or meaningless. Each must
raise an error or emit a warning; which one, and its wording, is not pinned here (the
invalid-input catalogue, tests/invalid_cases.py, pins eqgp's messages). Grouped by the kinds
of issue 30: silent results, unclear errors, generic errors, and what a round-3 user tried."""

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqgp
from eqgp import kernels


def _problem():
    X = np.random.default_rng(0).uniform(-1, 1, (4, 2))
    y, G = np.sin(X[:, 0]), np.cos(X)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    gp = eqgp.GaussianProcess(kernels.RBF(), noise=1e-2)
    return X, y, G, obs, gp, gp.condition(obs)


def _saved(model):
    path = os.path.join(tempfile.mkdtemp(), "model.eqgp")
    eqgp.save(path, model)
    return path


def _truncated(model):
    path = _saved(model)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    return path


def misuse_cases():
    X, y, G, obs, gp, post = _problem()
    key = jax.random.key(0)
    lo, hi = np.zeros(2), np.ones(2)
    ei = lambda Z: eqgp.log_expected_improvement(post, Z, 0.0)  # noqa: E731
    nlml = lambda m, o: -m.log_marginal_likelihood(o)  # noqa: E731
    cases = [
        # Silent in round 2 (the list).
        ("maximize: an infinite bound", lambda: eqgp.maximize_acquisition(ei, lo, np.array([1.0, np.inf]), key)),
        ("maximize: a negative learning rate", lambda: eqgp.maximize_acquisition(ei, lo, hi, key, learning_rate=-0.1)),
        ("maximize: a NaN learning rate", lambda: eqgp.maximize_acquisition(ei, lo, hi, key, learning_rate=np.nan)),
        (
            "maximize: an acquisition NaN everywhere",
            lambda: eqgp.maximize_acquisition(lambda Z: jnp.full(Z.shape[0], jnp.nan), lo, hi, key, steps=2),
        ),
        ("expected_improvement: best_f = nan", lambda: eqgp.expected_improvement(post, X, np.nan)),
        ("log_expected_improvement: best_f = nan", lambda: eqgp.log_expected_improvement(post, X, np.nan)),
        ("upper_confidence_bound: a negative beta", lambda: eqgp.upper_confidence_bound(post, X, -1.0)),
        ("upper_confidence_bound: a NaN beta", lambda: eqgp.upper_confidence_bound(post, X, np.nan)),
        (
            "expected_improvement: maximize='min' (a truthy string)",
            lambda: eqgp.expected_improvement(post, X, 0.0, maximize="min"),
        ),
        ("ConjugateGradient(rtol=2.0)", lambda: eqgp.ConjugateGradient(rtol=2.0)),
        (
            "ConjugateGradient: no preconditioner and a small LOVE rank",
            lambda: eqgp.ConjugateGradient(preconditioner_rank=0, variance_rank=10),
        ),
        (
            "load: an RBF model into a Matern52 template",
            lambda: eqgp.load(_saved(gp), eqgp.GaussianProcess(kernels.Matern52(), noise=1e-2)),
        ),
        ("Directional: a zero direction", lambda: eqgp.Directional(np.array([[1.0, 0.0], [0.0, 0.0]]))),
        # Unclear in round 2.
        (
            "solver=eqgp.Cholesky (the class)",
            lambda: eqgp.GaussianProcess(kernels.RBF(), noise=1e-2, solver=eqgp.Cholesky),
        ),
        ("solver='cg' (a string)", lambda: eqgp.GaussianProcess(kernels.RBF(), noise=1e-2, solver="cg")),
        ("ConjugateGradient(rtol='1e-6')", lambda: eqgp.ConjugateGradient(rtol="1e-6")),
        (
            "maximize: an acquisition returning a scalar",
            lambda: eqgp.maximize_acquisition(lambda Z: jnp.sum(Z), lo, hi, key, steps=2),
        ),
        ("expected_improvement on a GaussianProcess", lambda: eqgp.expected_improvement(gp, X, 0.0)),
        ("fit with optax.adam (the factory)", lambda: eqgp.fit(gp, nlml, optax.adam, 2, obs, progress=False)),
        ("fit under jax.jit", lambda: jax.jit(lambda m: eqgp.fit(m, lambda m: 0.0, optax.adam(1e-2), 1)[1])(gp)),
        # Generic in round 2.
        (
            "StructuredGradients with a Matern12 kernel",
            lambda: eqgp.GaussianProcess(
                kernels.Matern12(), noise=1e-2, solver=eqgp.StructuredGradients()
            ).log_marginal_likelihood(eqgp.Observations.gradients(X, G)),
        ),
        (
            "a kernel that is not positive semi-definite",
            lambda: eqgp.GaussianProcess(_NotPSD(), noise=1e-2).condition(eqgp.Observations.values(X, y)).mean(X),
        ),
        # Round 3: tried against the landed library as a new user.
        (
            "maximize: an acquisition +inf at some points",
            lambda: eqgp.maximize_acquisition(
                lambda Z: jnp.where(Z[:, 0] > 0.5, jnp.inf, Z[:, 1]), lo, hi, key, steps=2
            ),
        ),
        ("mean at NaN points", lambda: post.mean(np.full((2, 2), np.nan))),
        ("variance at inf points", lambda: post.variance(np.full((2, 2), np.inf))),
        ("expected_improvement at NaN points", lambda: eqgp.expected_improvement(post, np.full((2, 2), np.nan), 0.0)),
        ("fit with a negative learning rate", lambda: eqgp.fit(gp, nlml, optax.adam(-1e-2), 12, obs, progress=False)),
        (
            "fit with a loss that closes over another model",
            lambda: eqgp.fit(gp, lambda m, o: nlml(gp, o), optax.adam(1e-2), 3, obs, progress=False),
        ),
        (
            "fit from a model whose loss is NaN",
            lambda: eqgp.fit(gp, lambda m: jnp.nan * m.kernel.lengthscale, optax.adam(1e-2), 2, progress=False),
        ),
        (
            "fit of a model with no arrays",
            lambda: eqgp.fit(object(), lambda m: 0.0, optax.adam(1e-2), 2, progress=False),
        ),
        ("fit with a string for the loss", lambda: eqgp.fit(gp, "nlml", optax.adam(1e-2), 2, progress=False)),
        (
            "fit_hyperparameters with a NaN target",
            lambda: eqgp.fit_hyperparameters(gp, eqgp.Observations.values(X, np.r_[np.nan, y[1:]]), starts=1),
        ),
        ("fit_hyperparameters on a Posterior", lambda: eqgp.fit_hyperparameters(post, obs, starts=1)),
        ("minimize with a loss of a vector", lambda: eqgp.minimize(gp, lambda m: jnp.ones(2) * m.kernel.lengthscale)),
        ("load a file cut short", lambda: eqgp.load(_truncated(gp), gp)),
        ("load a Posterior into a GaussianProcess", lambda: eqgp.load(_saved(post), gp)),
        (
            "load a model with one noise into two",
            lambda: eqgp.load(_saved(gp), eqgp.GaussianProcess(kernels.RBF(), noise=[1e-2, 1e-2])),
        ),
        (
            "molecular_permutations of coincident atoms",
            lambda: eqgp.molecular_permutations([1, 1, 8], np.zeros((3, 3))),
        ),
        (
            "Hessian observations with a Matern32 kernel",
            lambda: eqgp.GaussianProcess(kernels.Matern32(), noise=1e-2).condition(
                eqgp.Observations((eqgp.Hessian(), X, np.ones((4, 3))))
            ),
        ),
        (
            "ConjugateGradient that cannot converge in max_steps",
            lambda: (
                eqgp.GaussianProcess(
                    kernels.RBF(), noise=1e-6, solver=eqgp.ConjugateGradient(max_steps=2, preconditioner_rank=0)
                )
                .condition(obs)
                .mean(X)
            ),
        ),
        ("condition with a NaN hyper-parameter under jit", lambda: _nan_lengthscale(gp, obs, X)),
        ("condition on NaN targets", lambda: gp.condition(eqgp.Observations.values(X, np.r_[np.nan, y[1:]])).mean(X)),
    ]
    return cases


class _NotPSD(kernels.AbstractKernel):
    def __call__(self, x1, x2):
        return -jnp.sum((x1 - x2) ** 2)


def _nan_lengthscale(gp, obs, X):
    import equinox as eqx

    bad = eqx.tree_at(lambda m: m.kernel.raw_lengthscale, gp, jnp.asarray(np.nan))
    return eqx.filter_jit(lambda m: m.condition(obs).mean(X))(bad)
