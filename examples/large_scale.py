"""Gradient-enhanced GP past the dense wall: N (D + 1) rows with the matrix-free solver.

Default: N = 100 points in D = 999 with values and gradients, 100 000 rows (the dense matrix
would need 80 GB): the shape of an adjoint-based design study, where each expensive solve
gives a value and a 1 000-long gradient. A few Adam steps on the hyper-parameters, then predictions with variances
along a line through the domain; writes `large_scale.png`. `--points` and `--dim` shrink it.
`--solver structured` uses the exact `eqgp.StructuredGradients` (few points, many dimensions)
instead of the matrix-free `eqgp.ConjugateGradient`.
"""

import argparse
import resource
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import optax
from tqdm.auto import tqdm

import eqgp
from eqgp import kernels

jax.config.update("jax_enable_x64", True)


def f(x):
    return jnp.sum(jnp.sin(x)) / jnp.sqrt(x.shape[0]) + 0.1 * jnp.sum(x * x) / x.shape[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--dim", type=int, default=999)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--solver", choices=("cg", "structured"), default="cg")
    args = parser.parse_args()
    N, D = args.points, args.dim
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -2, 2)
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    if args.solver == "cg":
        solver = eqgp.ConjugateGradient(rtol=1e-4, num_probes=8, preconditioner_rank=64, max_steps=500)
    else:
        solver = eqgp.StructuredGradients()
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.sqrt(D / 2.0)), noise=1e-2, solver=solver)
    print(f"{obs.size} rows (a dense covariance would be {obs.size**2 * 8 / 1e9:.0f} GB)")

    opt = optax.adam(5e-2)
    state = opt.init(eqx.filter(gp, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(gp, state, key, obs):
        loss, grads = eqx.filter_value_and_grad(lambda m: -m.log_marginal_likelihood(obs, key=key) / obs.size)(gp)
        updates, state = opt.update(grads, state, eqx.filter(gp, eqx.is_inexact_array))
        return eqx.apply_updates(gp, updates), state, loss

    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="hyper-parameter steps")
    for i in bar:
        gp, state, loss = step(gp, state, jax.random.key(i), obs)
        bar.set_postfix(loss=f"{float(loss):.4f}", lengthscale=f"{float(gp.kernel.lengthscale):.3f}")
    train = time.perf_counter() - t0

    t0 = time.perf_counter()
    post = gp.condition(obs)
    t = jnp.linspace(-2.0, 2.0, 40)
    Xs = t[:, None] * jnp.ones((1, D)) / jnp.sqrt(D) * 1.5
    mean, var = post.mean(Xs), post.variance(Xs)
    jax.block_until_ready(var)
    predict = time.perf_counter() - t0
    truth = jax.vmap(f)(Xs)
    rmse = float(jnp.sqrt(jnp.mean((mean - truth) ** 2)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"training {train:.0f} s, conditioning + 40 predictions {predict:.0f} s")
    print(f"peak memory {peak:.2f} GB, RMSE {rmse:.3g}")

    fig, ax = plt.subplots(figsize=(7, 4))
    sd = jnp.sqrt(var)
    ax.fill_between(t, mean - 2 * sd, mean + 2 * sd, alpha=0.3, label="posterior mean ± 2 sd")
    ax.plot(t, mean, label="posterior mean")
    ax.plot(t, truth, "k--", label="truth", zorder=5)
    ax.set_xlabel("position along the diagonal direction")
    ax.set_ylabel("f")
    name = "Matrix-free" if args.solver == "cg" else "Structured exact"
    ax.set_title(f"{name} GP, {obs.size} rows (N={N}, D={D}): RMSE {rmse:.3g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig("large_scale.png", dpi=120)


if __name__ == "__main__":
    main()
