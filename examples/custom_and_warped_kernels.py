"""A custom kernel in five lines, and a warped kernel whose input warp ends in the native
`eqgp.nn.SumCumProd` layer, both trained end to end on values and gradients (the warp's
parameters and the kernel's together). Writes custom_and_warped_kernels.png."""

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import optax  # noqa: E402
from _figures import save  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402


class CauchyKernel(kernels.AbstractKernel):  # the five lines
    raw_scale: jax.Array

    def __call__(self, x1, x2):
        return 1.0 / (1.0 + jnp.exp(self.raw_scale) * jnp.sum((x1 - x2) ** 2))


def f(x):  # non-stationary: slow on the left, fast on the right
    return jnp.sin(3.0 * jnp.exp(1.2 * x[0]))


def main(steps: int = 300):
    X = jnp.linspace(-1, 1, 9)[:, None]
    y, G = jax.vmap(jax.value_and_grad(f))(X)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    warp = eqx.nn.Sequential(
        [
            eqx.nn.Linear(1, 4, key=jax.random.key(0)),
            eqx.nn.Lambda(jax.nn.sigmoid),
            eqgp.nn.SumCumProd(),  # monotone-ish, smooth features through the native op
        ]
    )
    models = {
        "custom Cauchy": eqgp.GaussianProcess(1.0 * CauchyKernel(jnp.asarray(1.0)), noise=1e-4),
        "warped RBF (SumCumProd)": eqgp.GaussianProcess(kernels.Warped(kernels.RBF(0.1), warp), noise=1e-4),
    }
    xs = jnp.linspace(-1, 1, 400)[:, None]
    truth = jax.vmap(f)(xs)
    fig, (ax, ax_err) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=[2, 1], constrained_layout=True)
    for name, gp in models.items():
        gp, losses = eqgp.fit(gp, lambda m, o: -m.log_marginal_likelihood(o), optax.adam(2e-2), steps, obs)
        post = gp.condition(obs)
        m, sd = post.mean(xs), jnp.sqrt(post.variance(xs))
        rmse = float(jnp.sqrt(jnp.mean((m - truth) ** 2)))
        print(
            f"{name:25s}: -log marginal likelihood {float(losses[0]):9.3f} -> {float(losses[-1]):9.3f}, test RMSE {rmse:.2e}"  # noqa: E501
        )
        (line,) = ax.plot(xs[:, 0], m, lw=2.5, alpha=0.8, label=f"{name}: test RMSE {rmse:.1e}")
        ax.fill_between(xs[:, 0], m - 2 * sd, m + 2 * sd, color=line.get_color(), alpha=0.2)
        ax_err.plot(xs[:, 0], jnp.abs(m - truth), color=line.get_color(), label=name)
        ax_err.plot(xs[:, 0], 2 * sd, ":", color=line.get_color())
    ax.plot(xs[:, 0], truth, "k--", lw=1.2, zorder=5, label="truth (drawn on top)")
    ax.plot(X[:, 0], y, "ko", zorder=6, label="observed values + gradients")
    ax.set_ylabel("f(x)")
    ax.set_title("Non-stationary f from 9 values + gradients: a custom kernel and a warped RBF (bands: +-2 sd)")
    ax.legend(loc="lower left")
    ax_err.set_yscale("log")
    ax_err.set_ylabel("|mean - truth| (dotted: 2 sd)")
    ax_err.set_xlabel("x")
    save(fig, __file__, "custom_and_warped_kernels.png")


if __name__ == "__main__":
    main()
