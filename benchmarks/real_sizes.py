"""Real sizes (issue 31): time to first result, and the iterative path's accuracy.

Part `compile` (default): time to first result against the steady state (item 4).

A force-field-shaped problem: N points in D = 27 dimensions with values and gradients
(N (D + 1) rows; N = 200: 5 600), RBF-ARD. For each workload a user repeats, the first call
(tracing + compilation + running) against the median of the calls after it, in one process:

- `fit` (one Adam step of the negative log marginal likelihood, data as arguments),
- `condition`,
- `mean` + `variance` of values at 1 000 new points.

Target: first <= 3x steady + 3 s. With JAX's persistent compilation cache enabled (a
separate, named line: the environment, not the library) a second process skips the
compilation: `JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache python benchmarks/real_sizes.py`.

Part `cg-gradient` (item 2): `ConjugateGradient()`'s likelihood gradient with its defaults
against `Cholesky`'s, relative error in the 2-norm over all hyper-parameters, per key and
averaged over keys: 150 and 500 points in 3-D with values and gradients (600 and 2 000 rows),
RBF-ARD, noise 1e-3. Target <= 0.05.

Part `cg-noise` (item 3): `ConjugateGradient()` at relative noise 1e-8 on N = 500 points in
D = 27 with values and gradients (14 000 rows, RBF-ARD; `dense_memory.py`'s configurations): CG
steps, residual and time of the solve (`condition`), and the posterior mean at 100 points
against `Cholesky`'s.

Peak memory of the dense path: `benchmarks/dense_memory.py`.

Run: `python benchmarks/real_sizes.py [--part compile|cg-gradient|cg-noise|all] [--points N]`.
"""

import argparse
import os
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqgp
from eqgp import kernels

jax.config.update("jax_enable_x64", True)


def timed(fn, repeats=3):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    steady = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        steady.append(time.perf_counter() - t0)
    return first, statistics.median(steady)


def nll(model, obs):
    return -model.log_marginal_likelihood(obs)


def compile_wall(N):
    D = 27
    key = jax.random.split(jax.random.key(0), 3)
    X = jax.random.normal(key[0], (N, D))

    def f(x):
        return jnp.sum(jnp.sin(x)) + 0.1 * jnp.sum(x) ** 2

    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.full(D, 3.0)), mean=0.0, noise=1e-4)
    Xs = jax.random.normal(key[1], (1000, D))
    optimizer = optax.adam(1e-2)
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    print(f"backend {jax.default_backend()}; N={N}, D={D}: {N * (D + 1)} rows; persistent cache: {cache or 'off'}")
    posterior = {}

    def condition():
        posterior["post"] = gp.condition(obs)
        return posterior["post"].alpha

    rows = {
        "fit_step": lambda: eqgp.fit(gp, nll, optimizer, 1, obs, progress=False)[1],
        "condition": condition,  # first: nothing compiled for it yet
        "mean_variance": lambda: (posterior["post"].mean(Xs), posterior["post"].variance(Xs)),
    }
    worst = 0.0
    for name, fn in rows.items():
        first, steady = timed(fn)
        budget = 3 * steady + 3.0
        worst = max(worst, first / budget)
        print(
            f"{name:>14}: first {first:7.2f} s, steady {steady:7.2f} s, first / (3 steady + 3 s) = {first / budget:.2f}"
        )
    name = "real_sizes_first_call_budget_ratio" + ("_persistent_cache" if cache else "")
    print(f"RESULT {name} {worst:.3f}")


def cg_gradient(keys=4):
    worst = 0.0
    for N in (150, 500):
        X = jax.random.uniform(jax.random.key(0), (N, 3), jnp.float64, -2, 2)

        def f(x):
            return jnp.sin(2 * x[0]) * jnp.cos(x[1]) + 0.3 * x[1] * x[2]

        obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
        k = kernels.RBF([1.0, 1.3, 0.8], variance=1.5)

        def flat_grad(solver, key, k=k, obs=obs):
            gp = eqgp.GaussianProcess(k, mean=0.1, noise=1e-3, solver=solver)
            g = eqx.filter_jit(eqx.filter_grad(lambda m, o, key: m.log_marginal_likelihood(o, key=key)))(gp, obs, key)
            return jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree.leaves(g)])

        exact = flat_grad(eqgp.Cholesky(), None)
        t0 = time.perf_counter()
        estimates = jnp.stack([flat_grad(eqgp.ConjugateGradient(), jax.random.key(i)) for i in range(keys)])
        seconds = (time.perf_counter() - t0) / keys
        errors = [float(e) for e in jnp.linalg.norm(estimates - exact, axis=1) / jnp.linalg.norm(exact)]
        mean = float(jnp.linalg.norm(estimates.mean(0) - exact) / jnp.linalg.norm(exact))
        rank = eqgp.ConjugateGradient()._rank(obs.size)
        print(
            f"CG gradient, {obs.size} rows (rank {rank}): error per key "
            + ", ".join(f"{e:.4f}" for e in errors)
            + f"; of the mean over {keys} keys {mean:.4f}; {seconds:.1f} s per key (compile included)"
        )
        worst = max(worst, max(errors))
    print(f"RESULT real_sizes_cg_gradient_error_per_key {worst:.4f}")


def cg_noise(N=500, relative_noise=1e-8):
    # benchmarks/dense_memory.py's problem: 9 atoms on a grid, each configuration displaced by
    # 0.1 (a molecular-dynamics-like cloud; smooth at lengthscale 3), values and gradients.
    D = 27
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(*[np.arange(3.0)] * 2, indexing="ij"), -1).reshape(9, 2)
    base = np.concatenate([1.5 * grid, np.zeros((9, 1))], axis=1).reshape(-1)
    X = jnp.asarray(base + 0.1 * rng.normal(size=(N, D)))
    Xs = jnp.asarray(base + 0.1 * rng.normal(size=(100, D)))

    def f(x):
        return jnp.sum(jnp.sin(x)) + 0.1 * jnp.sum(x) ** 2

    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    kernel = kernels.RBF(jnp.full(D, 3.0))  # variance 1: the noise is relative
    groups = tuple((g.operator, g.X) for g in obs.groups)
    cov = eqgp.Covariance(kernel, groups, jnp.full(obs.size, relative_noise))
    solver = eqgp.ConjugateGradient(max_steps=20_000)
    solve = eqx.filter_jit(lambda cov, y: solver._solve(solver.init(cov), y))
    y = obs.flat_targets()
    jax.block_until_ready(solve(cov, y))  # compile
    t0 = time.perf_counter()
    _, steps, rel = jax.block_until_ready(solve(cov, y))
    seconds = time.perf_counter() - t0
    print(
        f"CG at relative noise {relative_noise:g}, {obs.size} rows, rank {solver._rank(obs.size)}: "
        f"{int(steps)} steps, relative residual {float(rel):.2e}, {seconds:.1f} s (preconditioner included)"
    )
    means = {}
    for name, s in (("Cholesky", eqgp.Cholesky()), ("CG", solver)):
        gp = eqgp.GaussianProcess(kernel, noise=relative_noise, noise_floor=0.0, solver=s)
        run = eqx.filter_jit(lambda g, o, x: g.condition(o).mean(x))
        jax.block_until_ready(run(gp, obs, Xs))
        t0 = time.perf_counter()
        means[name] = jax.block_until_ready(run(gp, obs, Xs))
        print(f"  {name}: condition + mean at 100 points {time.perf_counter() - t0:.1f} s")
    err = float(jnp.max(jnp.abs(means["CG"] - means["Cholesky"])) / jnp.max(jnp.abs(means["Cholesky"])))
    print(f"  posterior mean, CG vs Cholesky: max error / max |mean| = {err:.2e}")
    print(f"RESULT real_sizes_cg_interpolation_steps {int(steps)}")
    print(f"RESULT real_sizes_cg_interpolation_relative_residual {float(rel):.3e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("compile", "cg-gradient", "cg-noise", "all"), default="compile")
    parser.add_argument("--points", type=int, default=200, help="N for the compile part")
    args = parser.parse_args()
    if args.part in ("compile", "all"):
        compile_wall(args.points)
    if args.part in ("cg-gradient", "all"):
        cg_gradient()
    if args.part in ("cg-noise", "all"):
        cg_noise()


if __name__ == "__main__":
    main()
