"""Multi-start L-BFGS with the starts batched (`vmap`) against one after another.

`eqgp.minimize(stacked, loss, obs, starts=8, batched=...)` on the likelihood of a 2-D
function's values and gradients at `--points` points (3 rows each), 8 starts from
`eqgp.initialise`, 60 iterations at most. Both runs are compiled first; the median of
`--repeats` runs of each is timed in this process. The last line is
`RESULT multistart_batched_time_ratio <batched / one after another>` (< 1: batching wins).

On CPU, `batched=None` runs the starts one after another: batching was slower there, and
jaxlib's batched triangular solves deadlocked XLA's 2-thread CPU pool at 80 points (see
`eqgp.minimize`). This benchmark keeps CPU runs at `--points 10` by default, where it does
not. The number it is for is a GPU's: `python benchmarks/multistart.py --points 80`.
"""

import argparse
import statistics
import time
import warnings

import jax
import jax.numpy as jnp

import eqgp
from eqgp import kernels

jax.config.update("jax_enable_x64", True)


def f(x):
    return jnp.sin(2 * x[0]) * jnp.cos(x[1]) + 0.3 * x[1]


def loss(model, obs):
    return -model.log_marginal_likelihood(obs)


def main(points: int, starts: int = 8, repeats: int = 5):
    X = jax.random.uniform(jax.random.key(0), (points, 2), jnp.float64, -2, 2)
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    solver = eqgp.Cholesky(max_tries=4)  # as fit_hyperparameters trains
    template = eqgp.GaussianProcess(kernels.RBF(jnp.ones(2)), mean=0.0, noise=1e-3, solver=solver)
    stacked = eqgp.initialise(template, obs, starts=starts, key=3)

    def run(batched):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the CPU warning, and jitter notes
            return eqgp.minimize(stacked, loss, obs, starts=starts, max_steps=60, batched=batched)

    times, reports = {}, {}
    for batched in (False, True):
        _, reports[batched] = run(batched)  # compiles
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(batched)
            ts.append(time.perf_counter() - t0)
        times[batched] = statistics.median(ts)
    print(f"backend {jax.default_backend()}; {starts} starts, {points} points ({3 * points} rows)")
    for batched in (False, True):
        r = reports[batched]
        print(
            f"{'batched' if batched else 'one after another':>17}: {times[batched]:.3f} s "
            f"(kept start {r.start}, loss {r.loss:.6g}, {r.steps} steps)"
        )
    print(f"RESULT multistart_batched_time_ratio {times[True] / times[False]:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=None, help="default: 80 on an accelerator, 10 on CPU")
    parser.add_argument("--starts", type=int, default=8)
    args = parser.parse_args()
    main(args.points or (10 if jax.default_backend() == "cpu" else 80), args.starts)
