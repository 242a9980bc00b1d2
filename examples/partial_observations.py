"""Partial observations: values at some points, only d/dx_0 at others, a directional
derivative elsewhere, all in one GP (each group with its own noise). Writes
partial_observations.png."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from _figures import maps, save  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402


def f(x):
    return jnp.sin(2 * x[0]) * jnp.cos(1.5 * x[1]) + 0.2 * x[1]


def main(steps: int = 200):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 4)
    Xv = jax.random.uniform(k1, (10, 2), jnp.float64, -2, 2)
    Xp = jax.random.uniform(k2, (25, 2), jnp.float64, -2, 2)
    Xd = jax.random.uniform(k3, (10, 2), jnp.float64, -2, 2)
    v = jnp.array([1.0, 1.0]) / jnp.sqrt(2.0)
    grad = jax.vmap(jax.grad(f))
    obs = eqgp.Observations(
        (eqgp.Value(), Xv, jax.vmap(f)(Xv)),
        (eqgp.Partial([0]), Xp, grad(Xp)[:, :1]),
        (eqgp.Directional(v), Xd, grad(Xd) @ v),
    )
    gp = eqgp.GaussianProcess(kernels.RBF([1.0, 1.0]), noise=[1e-4, 1e-3, 1e-3])
    only_values = eqgp.Observations((eqgp.Value(), Xv, jax.vmap(f)(Xv)))
    Xt = jax.random.uniform(k4, (1000, 2), jnp.float64, -2, 2)
    yt = jax.vmap(f)(Xt)
    results, rmses = {}, {}
    for name, o in (("values only", only_values), ("values + partial + directional", obs)):
        noise = [1e-4] if len(o.groups) == 1 else [1e-4, 1e-3, 1e-3]
        m = eqgp.GaussianProcess(gp.kernel, noise=noise)
        m, _ = eqgp.fit(m, lambda m, o: -m.log_marginal_likelihood(o), optax.adam(3e-2), steps, o)
        post = m.condition(o)
        rmse = float(jnp.sqrt(jnp.mean((post.mean(Xt) - yt) ** 2)))
        results[name], rmses[name] = post, rmse
        print(f"{name:32s}: test RMSE {rmse:.4f}, noise {[float(n) for n in m.noise]}")
    g = jnp.linspace(-2, 2, 50)
    XX = jnp.stack(jnp.meshgrid(g, g), -1).reshape(-1, 2)
    panels = [("truth", jax.vmap(f)(XX).reshape(50, 50))]
    panels += [(f"{n}: test RMSE {rmses[n]:.3f}", p.mean(XX).reshape(50, 50)) for n, p in results.items()]
    fig, axes = maps(g, panels, "One GP from values, partial derivatives and directional derivatives")
    for ax in axes:
        ax.plot(Xv[:, 0], Xv[:, 1], "o", color="black", mec="white", label="value")
        ax.plot(Xp[:, 0], Xp[:, 1], "^", color="white", mec="black", label="d/dx0 only")
        ax.plot(Xd[:, 0], Xd[:, 1], "s", color="red", mec="black", label="directional (1, 1)/sqrt 2")
    axes[0].legend(loc="lower left", facecolor="0.85", framealpha=1.0)
    save(fig, __file__, "partial_observations.png")


if __name__ == "__main__":
    main()
