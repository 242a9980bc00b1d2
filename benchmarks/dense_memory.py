"""Real sizes, part 2: peak memory and time of the exact (Cholesky) path (issue 31, item 1).

A force-field-shaped problem: N points in D = 27 dimensions (9 atoms) with values and
gradients, R = 28 N rows, for two kernels: a plain RBF-ARD, and a Matérn-5/2 warped through
the 36 inverse interatomic distances (`kernels.Warped`). Each case runs in a process of its
own and reports its peak resident memory (`ru_maxrss`) and the resident memory before the
work (JAX imported, data made), in units of one R x R float64 matrix:

- `condition`: `gp.condition(obs)` and the mean and variance of values and gradients at
  1 000 new points (target: peak <= 1.5 matrices + 0.5 GB);
- `likelihood`: the negative log marginal likelihood and its gradient (target: <= 2.5
  matrices);
- `time`: the steady time of `condition` against `scipy.linalg.cho_factor` + `cho_solve`
  on the same matrix, in one process (target: <= 1.3x).

The largest exact likelihood + gradient: `--grad-points 1200` (33 600 rows, a 8.4 GiB matrix;
~7 minutes on 2 cores) or `1300` (36 400 rows), plain RBF-ARD only with `--plain-only`.

Run: `python benchmarks/dense_memory.py [--points 200 500] [--grad-points 429] [--plain-only]`. The last
lines are `RESULT dense_memory_condition_peak_ratio <worst (peak - 0.5 GB) / matrix>`,
`RESULT dense_memory_likelihood_peak_ratio ...` and `RESULT dense_memory_condition_vs_scipy_time_ratio ...`.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

D = 27  # 9 atoms in 3-D


def _rss_gb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _peak_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _problem(N, kernel_name):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import eqgp
    from eqgp import kernels

    jax.config.update("jax_enable_x64", True)

    class InverseDistances(eqx.Module):
        def __call__(self, x):
            r = x.reshape(9, 3)
            i, j = np.triu_indices(9, k=1)
            return 1.0 / jnp.linalg.norm(r[i] - r[j], axis=-1)

    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(*[np.arange(3.0)] * 2, indexing="ij"), -1).reshape(9, 2)
    base = np.concatenate([1.5 * grid, np.zeros((9, 1))], axis=1).reshape(-1)  # atoms 1.5 apart
    X = jnp.asarray(base + 0.1 * rng.normal(size=(N, D)))
    Xs = jnp.asarray(base + 0.1 * rng.normal(size=(1000, D)))

    def energy(x):
        return jnp.sum(jnp.sin(x)) + 0.1 * jnp.sum(x) ** 2

    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(energy)(X), jax.vmap(jax.grad(energy))(X))
    if kernel_name == "plain":
        kernel = kernels.RBF(jnp.full(D, 3.0))
    else:
        kernel = kernels.Warped(kernels.Matern52(jnp.asarray(2.0)), InverseDistances())
    return eqgp.GaussianProcess(kernel, mean=0.0, noise=1e-4), obs, Xs


def _child(case, N, kernel_name):
    import equinox as eqx
    import jax

    import eqgp

    gp, obs, Xs = _problem(N, kernel_name)
    jax.block_until_ready(obs.groups[0].targets)
    before = _rss_gb()
    out = {"rows": N * (D + 1), "before_gb": before}
    if case == "condition":
        post = gp.condition(obs)
        op = eqgp.ValueAndGradient()
        jax.block_until_ready((post.mean(Xs, op), post.variance(Xs, op)))
    elif case == "likelihood":
        loss = eqx.filter_jit(eqx.filter_value_and_grad(lambda m, o: -m.log_marginal_likelihood(o)))
        jax.block_until_ready(loss(gp, obs))
    else:  # time: eqgp's condition against scipy on the same matrix, steady state
        import scipy.linalg

        condition = eqx.filter_jit(lambda g, o: g.condition(o).alpha)
        jax.block_until_ready(condition(gp, obs))
        from eqgp._gp import covariance  # the model's covariance of its observations

        K = np.asarray(eqx.filter_jit(lambda g, o: covariance(g.kernel, g._noise_for(o), o).as_matrix())(gp, obs))
        r = np.asarray(obs.groups[0].targets).T.reshape(-1)
        ours, theirs = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(condition(gp, obs))
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            scipy.linalg.cho_solve(scipy.linalg.cho_factor(K, lower=True), r)
            theirs.append(time.perf_counter() - t0)
        out["eqgp_s"], out["scipy_s"] = statistics.median(ours), statistics.median(theirs)
    out["peak_gb"] = _peak_gb()
    print(json.dumps(out))


def _run(case, N, kernel_name):
    cmd = [sys.executable, __file__, "--child", case, str(N), kernel_name]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        return {"error": (res.stderr.strip().splitlines() or ["killed"])[-1][:200], "rows": N * (D + 1)}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, nargs="+", default=[200, 500])
    parser.add_argument("--grad-points", type=int, nargs="+", default=[429])
    parser.add_argument("--time-points", type=int, default=200)
    parser.add_argument("--plain-only", action="store_true", help="skip the warped kernel")
    args = parser.parse_args()
    worst = {"condition": 0.0, "likelihood": 0.0}
    for case, sizes in (("condition", args.points), ("likelihood", args.grad_points)):
        for N in sizes:
            for kernel_name in ("plain",) if args.plain_only else ("plain", "warped"):
                out = _run(case, N, kernel_name)
                matrix = out["rows"] ** 2 * 8 / 2**30
                if "error" in out:
                    print(f"{case:>10} {kernel_name:>6} R={out['rows']:6d}: failed: {out['error']}")
                    worst[case] = float("inf")
                    continue
                ratio = (out["peak_gb"] - 0.5) / matrix
                worst[case] = max(worst[case], ratio)
                print(
                    f"{case:>10} {kernel_name:>6} R={out['rows']:6d}: matrix {matrix:5.2f} GB, before "
                    f"{out['before_gb']:5.2f} GB, peak {out['peak_gb']:6.2f} GB = {out['peak_gb'] / matrix:4.2f} "
                    f"matrices, (peak - 0.5 GB) / matrix = {ratio:4.2f}",
                    flush=True,
                )
    timing = _run("time", args.time_points, "plain")
    ratio = timing["eqgp_s"] / timing["scipy_s"] if "error" not in timing else float("inf")
    if "error" not in timing:
        print(
            f"time R={timing['rows']}: eqgp condition {timing['eqgp_s']:.2f} s, scipy cho_factor + cho_solve "
            f"{timing['scipy_s']:.2f} s"
        )
    print(f"RESULT dense_memory_condition_peak_ratio {worst['condition']:.3f}")
    print(f"RESULT dense_memory_likelihood_peak_ratio {worst['likelihood']:.3f}")
    print(f"RESULT dense_memory_condition_vs_scipy_time_ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
