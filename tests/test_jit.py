"""eqgp's entry points run the same at the top level and inside a user's jit, grad and vmap."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
from helpers import assert_close

import eqgp
from eqgp import kernels


def _problem():
    X = jax.random.uniform(jax.random.key(0), (6, 2), jnp.float64, -1, 1)
    f = lambda x: jnp.sin(x[0]) + x[1] ** 2  # noqa: E731
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    return eqgp.GaussianProcess(kernels.RBF([0.8, 1.1]), noise=1e-3), obs, X


def test_top_level_and_inside_user_transformations_agree():
    gp, obs, X = _problem()
    top = gp.log_marginal_likelihood(obs)
    assert_close(eqx.filter_jit(lambda m: m.log_marginal_likelihood(obs))(gp), top, rtol=1e-12)
    # Inside a jit with nothing traced passed in (everything closed over): still works.
    assert_close(jax.jit(lambda: gp.log_marginal_likelihood(obs))(), top, rtol=1e-12)
    g_top = eqx.filter_grad(lambda m: m.log_marginal_likelihood(obs))(gp)
    g_jit = eqx.filter_jit(eqx.filter_grad(lambda m: m.log_marginal_likelihood(obs)))(gp)
    for a, b in zip(jax.tree.leaves(g_top), jax.tree.leaves(g_jit)):
        assert_close(a, b, rtol=1e-10)
    # vmap over models (a batch of lengthscales) against a Python loop.
    raws = jnp.stack([gp.kernel.raw_lengthscale] * 3) + jnp.arange(3.0)[:, None]
    batched = jax.vmap(lambda r: eqx.tree_at(lambda m: m.kernel.raw_lengthscale, gp, r).log_marginal_likelihood(obs))(
        raws
    )
    loop = [eqx.tree_at(lambda m: m.kernel.raw_lengthscale, gp, r).log_marginal_likelihood(obs) for r in raws]
    assert_close(batched, jnp.stack(loop), rtol=1e-10)
    # The gram entry points too.
    assert_close(
        jax.jit(lambda X: eqgp.gradient_gram(gp.kernel, X, X))(X), eqgp.gradient_gram(gp.kernel, X, X), rtol=1e-13
    )


def _dot_precisions(fn, *args):
    text = str(jax.make_jaxpr(fn)(*args))
    starts = [m.end() for m in re.finditer(r"dot_general\[", text)]
    found = [re.search(r"precision=(\S+)", text[i : i + 300]) for i in starts]
    return [m.group(1) if m else "default" for m in found]


def test_float32_products_are_traced_at_full_precision():
    # On GPUs JAX's default lets float32 products run as TF32 (~1e-3 relative error), which an
    # H200 run showed breaking float32 training's Cholesky: every product eqgp traces, in its
    # entry points and in its hand-written backward pass, is bound with HIGHEST precision.
    X = jax.random.uniform(jax.random.key(0), (6, 2), jnp.float32)
    obs = eqgp.Observations.values_and_gradients(X, jnp.sin(X[:, 0]), jnp.cos(X))
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.float32(1.0)), noise=jnp.float32(1e-2))
    loss = lambda m: m.log_marginal_likelihood(obs)  # noqa: E731
    for fn in [
        loss,
        eqx.filter_grad(loss),
        lambda m: m.condition(obs).variance(X, eqgp.ValueAndGradient()),
        lambda m: eqgp.gradient_gram(m.kernel, X, X),
    ]:
        precisions = _dot_precisions(fn, gp)
        assert precisions and all("HIGHEST" in p for p in precisions), precisions
