"""Gradient-enhanced kriging on the Branin function.

Fits a value-only GP and a value+gradient GP on the same n points (RBF, ARD), trains
both by maximising the marginal likelihood with optax, prints the test RMSE of each and
writes branin.png with both posteriors.
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from _figures import maps, save  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

LO, HI = jnp.array([-5.0, 0.0]), jnp.array([10.0, 15.0])


def branin(u):
    a, b, c, r, s, t = 1.0, 5.1 / (4 * jnp.pi**2), 5 / jnp.pi, 6.0, 10.0, 1 / (8 * jnp.pi)
    return a * (u[1] - b * u[0] ** 2 + c * u[0] - r) ** 2 + s * (1 - t) * jnp.cos(u[0]) + s


def f_unit(x):  # Branin on the unit square
    return branin(LO + x * (HI - LO))


def main(n: int = 12, steps: int = 300):
    key_train, key_test = jax.random.split(jax.random.key(0))
    X = jax.random.uniform(key_train, (n, 2), jnp.float64)
    y, G = jax.vmap(jax.value_and_grad(f_unit))(X)  # gradients from "the adjoint solver"
    mu, sd = jnp.mean(y), jnp.std(y)
    y, G = (y - mu) / sd, G / sd

    def loss(gp, obs):
        return -gp.log_marginal_likelihood(obs)

    def train(obs):
        gp = eqgp.GaussianProcess(kernels.RBF([0.3, 0.3], variance=1.0), mean=0.0, noise=1e-4)
        gp, losses = eqgp.fit(gp, loss, optax.adam(3e-2), steps, obs)
        return gp, gp.condition(obs), losses

    obs_v = eqgp.Observations.values(X, y)
    obs_vg = eqgp.Observations.values_and_gradients(X, y, G)
    gp_v, post_v, _ = train(obs_v)
    gp_vg, post_vg, _ = train(obs_vg)

    Xt = jax.random.uniform(key_test, (2000, 2), jnp.float64)
    yt = jax.vmap(f_unit)(Xt)

    def rmse(post):
        return float(jnp.sqrt(jnp.mean((post.mean(Xt) * sd + mu - yt) ** 2)))

    rmse_v, rmse_vg = rmse(post_v), rmse(post_vg)
    print(f"n = {n} training points, {len(yt)} test points")
    print(f"value-only GP:        test RMSE {rmse_v:8.3f}  (lengthscales {gp_v.kernel.lengthscale})")
    print(f"value+gradient GP:    test RMSE {rmse_vg:8.3f}  (lengthscales {gp_vg.kernel.lengthscale})")
    print(f"RMSE ratio (value+gradient / value-only): {rmse_vg / rmse_v:.3f}")

    g = jnp.linspace(0, 1, 60)
    XX = jnp.stack(jnp.meshgrid(g, g), -1).reshape(-1, 2)
    truth = jax.vmap(f_unit)(XX).reshape(60, 60)
    panels = [
        ("Branin (truth)", truth),
        (f"value-only GP: test RMSE {rmse_v:.2f}", post_v.mean(XX).reshape(60, 60) * sd + mu),
        (f"value+gradient GP: test RMSE {rmse_vg:.2f}", post_vg.mean(XX).reshape(60, 60) * sd + mu),
    ]
    fig, axes = maps(
        g, panels, f"Branin from {n} evaluations (black dots): gradients cut the error {rmse_v / rmse_vg:.1f}x"
    )
    for ax in axes:
        ax.plot(X[:, 0], X[:, 1], "k.", ms=8)
    save(fig, __file__, "branin.png")
    return rmse_v, rmse_vg


if __name__ == "__main__":
    sys.exit(main() and None)
