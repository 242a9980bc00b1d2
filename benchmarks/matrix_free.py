"""The matrix-free covariance product and the ConjugateGradient solver, against the dense path.

(a) one product K @ v at N = 2 000, D = 10 (gradient observations) vs forming `gradient_gram`
    (target <= 0.25x);
(b) time per product vs D at N = 1 000 (target: about linear in D);
(c) NLML + gradient with N (D + 1) >= 100 000 rows and the process's peak memory (`--large`; slow
    on 2 cores);
(d) high D: N gradient observations at D = 1 000 (and 10 000 with `--large`), NLML + gradient
    by ConjugateGradient; and by the exact `StructuredGradients` at D = 100, 1 000 and 10 000
    (N = 100: a million rows; target <= 60 s); exactness against Cholesky where the dense one fits;
(e) 1 vs 4 simulated CPU devices (a subprocess each), the same product;
(f) predictive variances at 50 test points, N = 500, D = 2 with gradients (1 500 rows): one CG
    solve per point vs the LOVE cache (`variance_rank=100`), each including `condition`, and
    the cache's error against Cholesky.

Default environment, medians of repeated runs; the last line is `RESULT matrix_free <ratio (a)>`.
"""

import argparse
import os
import resource
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time  # noqa: E402


def _cov(N, D, noise=1e-2, op=None, seed=0):
    X = jax.random.uniform(jax.random.key(seed), (N, D), jnp.float64, -2, 2)
    op = eqgp.ValueAndGradient() if op is None else op
    k = kernels.RBF(jnp.linspace(0.5, 2.0, D) * jnp.sqrt(D / 2.0))
    return k, X, eqgp.Covariance(k, ((op, X),), jnp.full(N * op.size(D), noise))


_mv = eqx.filter_jit(lambda c, v: c.mv(v))


def product_vs_dense(N=2000, D=10):
    k, X, cov = _cov(N, D)
    v = jnp.ones(cov.size)
    dense = eqx.filter_jit(lambda k, X: eqgp.gradient_gram(k, X, X))
    t_mv = median_time(_mv, cov, v, repeats=5)
    t_dense = median_time(dense, k, X, repeats=3, warmup=1)
    print(f"(a) N={N} D={D} rows={cov.size}: product {t_mv * 1e3:.1f} ms, form gradient_gram {t_dense * 1e3:.1f} ms")
    print(f"RESULT matrix_free_product_vs_dense {t_mv / t_dense:.3f}")
    return t_mv / t_dense


def product_vs_D(N=1000, Ds=(2, 5, 10, 20, 50)):
    base = None
    for D in Ds:
        _, _, cov = _cov(N, D)
        t = median_time(_mv, cov, jnp.ones(cov.size), repeats=3)
        base = base or t / Ds[0]
        print(
            f"(b) N={N} D={D:3d}: product {t * 1e3:8.1f} ms, per pair {t / N**2 * 1e9:7.1f} ns, "
            f"time / (D x time at D={Ds[0]} / {Ds[0]}) = {t / (D * base):.2f}"
        )
    print(f"RESULT matrix_free_time_per_D_growth {t / (Ds[-1] * base):.3f}")


def likelihood(N, D, solver, op=None, noise=1e-2):
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -2, 2)
    f = lambda x: jnp.sum(jnp.sin(x)) + 0.05 * jnp.sum(x * x)  # noqa: E731
    op = eqgp.ValueAndGradient() if op is None else op
    targets = jax.vmap(lambda x: op.apply(f, x))(X)
    obs = eqgp.Observations((op, X, targets))
    gp = eqgp.GaussianProcess(kernels.RBF(jnp.sqrt(D / 2.0)), noise=noise, solver=solver)
    # The data are arguments, not constants folded into the program.
    fn = eqx.filter_jit(eqx.filter_value_and_grad(lambda m, o: m.log_marginal_likelihood(o)))
    t0 = time.perf_counter()
    v, g = jax.block_until_ready(fn(gp, obs))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    v, g = jax.block_until_ready(fn(gp, obs))
    return float(v), jax.tree.leaves(g), first, time.perf_counter() - t0


def _peak_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def large(N, D):
    solver = eqgp.ConjugateGradient(rtol=1e-4, num_probes=8, preconditioner_rank=64)
    v, g, first, t = likelihood(N, D, solver)
    print(
        f"(c) N={N} D={D} rows={N * (D + 1)}: NLML+grad {t:.1f} s (first call incl. compile {first:.1f} s), "
        f"peak RSS {_peak_gb():.2f} GB, value {v:.6g}"
    )
    print(f"RESULT matrix_free_large_peak_gb {_peak_gb():.3f}")


def high_d(N, D, check_exact: bool, solver=None):
    """(d): NLML + gradient of N gradient observations in D dimensions, by `solver` (default a
    tight ConjugateGradient), against Cholesky where the dense one fits."""
    if solver is None:
        solver = eqgp.ConjugateGradient(rtol=1e-10, num_probes=8, preconditioner_rank=min(N * D, 100))
    v, g, first, t = likelihood(N, D, solver, op=eqgp.Gradient(), noise=1e-3)
    line = f"(d) {type(solver).__name__} N={N} D={D} rows={N * D}: NLML+grad {t:.2f} s (first call {first:.1f} s)"
    rel = None
    if check_exact:
        ve, ge, _, te = likelihood(N, D, eqgp.Cholesky(), op=eqgp.Gradient(), noise=1e-3)
        rel = abs(v - ve) / abs(ve)
        grad = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(g, ge))
        line += f", Cholesky {te:.2f} s, relative NLML error {rel:.2e}, gradient {grad:.2e}"
    print(line + f", peak RSS {_peak_gb():.2f} GB")
    return t, rel


def devices(n):
    code = (
        f"import os; os.environ['XLA_FLAGS']='--xla_force_host_platform_device_count={n}'\n"
        "import sys; sys.argv=['x']; sys.path.insert(0, {path!r})\n"
        "import matrix_free as m, jax\n"
        "_, _, cov = m._cov(1000, 10)\n"
        "print(m.median_time(m._mv, cov, jax.numpy.ones(cov.size), repeats=3))\n"
    ).replace("{path!r}", repr(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def love(N=500, D=2, M=50):
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -2, 2)
    f = lambda x: jnp.sin(2 * x[0]) * jnp.cos(x[1])  # noqa: E731
    obs = eqgp.Observations.values_and_gradients(X, jax.vmap(f)(X), jax.vmap(jax.grad(f))(X))
    Xs = jax.random.uniform(jax.random.key(1), (M, D), jnp.float64, -2, 2)
    k = kernels.RBF([1.0, 1.3], variance=1.5)
    variance = eqx.filter_jit(lambda gp: gp.condition(obs).variance(Xs))

    def solver(rank):
        return eqgp.ConjugateGradient(rtol=1e-8, preconditioner_rank=50, variance_rank=rank, on_failure="warn")

    gps = {
        name: eqgp.GaussianProcess(k, noise=1e-2, solver=s)
        for name, s in (("cholesky", eqgp.Cholesky()), ("cg", solver(0)), ("love", solver(100)))
    }
    exact = variance(gps["cholesky"])
    err = float(jnp.max(jnp.abs(variance(gps["love"]) - exact) / exact))
    t0 = time.perf_counter()
    jax.block_until_ready(variance(gps["cg"]))  # compiles and runs once
    first_cg = time.perf_counter() - t0
    t_cg = median_time(variance, gps["cg"], repeats=1, warmup=0)
    t_love = median_time(variance, gps["love"], repeats=3, warmup=1)
    print(f"(f) first call of the CG-per-point variances (compile + run): {first_cg:.1f} s")
    print(
        f"(f) variances at {M} points, {obs.size} rows: CG per point {t_cg * 1e3:.0f} ms, LOVE cache "
        f"{t_love * 1e3:.0f} ms (both incl. condition); LOVE vs Cholesky max relative error {err:.1e}"
    )
    print(f"RESULT matrix_free_love_speedup {t_cg / t_love:.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--large", action="store_true", help="run (c) at 100 000+ rows and (d) at D = 10 000")
    args = parser.parse_args()
    ratio = product_vs_dense()
    product_vs_D()
    high_d(30, 100, check_exact=True)
    high_d(100, 1000, check_exact=False)
    structured = eqgp.StructuredGradients()  # exact, O(N^2 D + N^6)
    _, rel = high_d(30, 100, check_exact=True, solver=structured)
    high_d(100, 1000, check_exact=False, solver=structured)
    t10k, _ = high_d(100, 10_000, check_exact=False, solver=structured)
    print(f"RESULT matrix_free_high_d_exact_rel_error {rel:.2e}")
    print(f"RESULT matrix_free_high_d_D10000_vs_60s {t10k / 60:.3f}")
    if args.large:
        high_d(100, 10_000, check_exact=False)
        large(100, 999)
    love()
    t1, t4 = devices(1), devices(4)
    print(
        f"(e) product N=1000 D=10: 1 device {t1 * 1e3:.1f} ms, 4 simulated devices {t4 * 1e3:.1f} ms "
        f"(same 2 cores: this checks the sharded path runs, not a speed-up)"
    )
    print(f"RESULT matrix_free {ratio:.3f}")


if __name__ == "__main__":
    main()
