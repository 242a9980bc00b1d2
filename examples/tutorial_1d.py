"""1-D tutorial: posterior mean +- 2 sigma of f and of f', with and without gradient
observations. Writes tutorial_1d.png."""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from _figures import save  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402


def f(x):
    return jnp.sin(3 * x[0]) + 0.3 * x[0] ** 2


def main():
    X = jnp.array([[-2.0], [-0.8], [0.3], [1.1], [2.2]])
    y, G = jax.vmap(jax.value_and_grad(f))(X)
    gp = eqgp.GaussianProcess(kernels.Matern52(0.8, variance=2.0), noise=1e-6)
    posts = {
        "values only": gp.condition(eqgp.Observations.values(X, y)),
        "values + gradients": gp.condition(eqgp.Observations.values_and_gradients(X, y, G)),
    }
    xs = jnp.linspace(-3, 3, 300)[:, None]
    truth, dtruth = jax.vmap(jax.value_and_grad(f))(xs)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True, sharey="row", constrained_layout=True)
    for col, (name, post) in enumerate(posts.items()):
        for row, (op, true, label) in enumerate([(eqgp.Value(), truth, "f"), (eqgp.Gradient(), dtruth[:, 0], "f'")]):
            m = post.mean(xs, op).reshape(-1)
            s = jnp.sqrt(post.variance(xs, op)).reshape(-1)
            err = float(jnp.sqrt(jnp.mean((m - true) ** 2)))
            ax = axes[row, col]
            ax.fill_between(xs[:, 0], m - 2 * s, m + 2 * s, alpha=0.3, label="mean +- 2 sd")
            ax.plot(xs[:, 0], m, label="posterior mean")
            ax.plot(xs[:, 0], true, "k--", label="truth")
            ax.plot(X[:, 0], (y if row == 0 else G[:, 0]), "ko", label="observed" if col == 1 or row == 0 else None)
            unused = " (dots: true f', not given)" if (row, col) == (1, 0) else ""
            ax.set_title(f"{label} from {name}: RMSE {err:.3f}{unused}")
            ax.set_ylabel(f"{label}(x)")
            print(f"{name:20s} {label:2s}: RMSE {err:.4f}, mean sd {float(jnp.mean(s)):.4f}")
    for ax in axes[1]:
        ax.set_xlabel("x")
    axes[0, 0].legend(loc="lower right")
    fig.suptitle(f"Matern-5/2 GP on {X.shape[0]} points: values only (left) vs values + gradients (right)")
    save(fig, __file__, "tutorial_1d.png")


if __name__ == "__main__":
    main()
