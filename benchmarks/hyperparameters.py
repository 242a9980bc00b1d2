"""eqgp's default hyper-parameter recipe against SMT's gradient-enhanced kriging (GEKPLS).

On SMT's own test problems with derivatives (D = 2-10), n = 5D and 10D training points from a
Latin hypercube, three seeds: SMT's `GEKPLS(n_comp=D, extra_points=1)` (the configuration of its
documentation) trained by its own multi-start COBYLA, and eqgp's `fit_hyperparameters` (the
documented default: data-driven initialisation, profile likelihood, 8 starts screened, L-BFGS from the best) on an
RBF-ARD kernel with a constant mean, both given the same values and gradients (eqgp's inputs
scaled to the unit box and its gradients by the box widths, as SMT scales inputs internally:
WaterFlow's inputs span 0.05 to 1e5, and unscaled its derivative rows lie 12 orders of
magnitude apart). Printed per row:
the test RMSE over 1 000 held-out points relative to the test values' standard deviation, and
the wall time of training (eqgp's includes compilation on a problem's first seed; the seeds
after it reuse the compiled code, as a user repeating a workload would). The RESULT line is the
largest ratio eqgp RMSE / SMT RMSE over every row (<= 1: eqgp at least as accurate on every row),
and a second one the median wall-time ratio at the larger n.

Run: `pip install smt && python benchmarks/hyperparameters.py` (`--quick` for the two small
problems and one seed).

`--part force-field` (needs the `chem` extra): the force-field half. Ethanol's symmetric
model (benchmarks/force_field.py) with its lengthscale chosen by eqgp itself, by closed-form
leave-one-out and by the profile likelihood over one common lengthscale, and by the profile
likelihood over one lengthscale per orbit of atom pairs (L-BFGS, fitted on at most 200
configurations), against the best common lengthscale of a validation grid (100 held-out
configurations), at 100, 200 and 500 training configurations: RESULT lines are the worst
ratio of test force MAEs over the sizes (<= 1.1: within 10 % of the validation grid's choice).
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqgp
from eqgp import kernels

jax.config.update("jax_enable_x64", True)


def problems():
    from smt.problems import Branin, NdimRosenbrock, WaterFlow, WeldedBeam, WingWeight

    return {
        "Branin": Branin(ndim=2),
        "WeldedBeam": WeldedBeam(ndim=3),
        "Rosenbrock": NdimRosenbrock(ndim=4),
        "WaterFlow": WaterFlow(ndim=8),
        "WingWeight": WingWeight(ndim=10),
    }


def data(problem, n, seed):
    from smt.sampling_methods import LHS

    D = problem.xlimits.shape[0]
    x = LHS(xlimits=problem.xlimits, criterion="m", seed=seed)(n)
    y = problem(x)[:, 0]
    g = np.stack([problem(x, kx=i)[:, 0] for i in range(D)], axis=1)
    return x, y, g


def smt_fit(problem, x, y, g):
    from smt.surrogate_models import GEKPLS

    D = x.shape[1]
    model = GEKPLS(theta0=[1e-2] * D, xlimits=problem.xlimits, n_comp=D, extra_points=1, print_global=False)
    model.set_training_values(x, y)
    for i in range(D):
        model.set_training_derivatives(x, g[:, i], i)
    t0 = time.perf_counter()
    model.train()
    return model, time.perf_counter() - t0


def to_unit_box(problem, x, g=None):
    """Inputs scaled to the unit box, gradients by the box widths (SMT's kriging scales its
    inputs internally; eqgp's kernels see the inputs as given)."""
    lo, hi = problem.xlimits[:, 0], problem.xlimits[:, 1]
    return (x - lo) / (hi - lo), None if g is None else g * (hi - lo)


def eqgp_fit(x, y, g, starts=8, runs=1):
    D = x.shape[1]
    obs = eqgp.Observations.values_and_gradients(jnp.asarray(x), jnp.asarray(y), jnp.asarray(g))
    template = eqgp.GaussianProcess(kernels.RBF(jnp.ones(D)), mean=eqgp.ConstantMean(0.0), noise=1e-6)
    t0 = time.perf_counter()
    gp, report = eqgp.fit_hyperparameters(template, obs, starts=starts, runs=runs)
    post = gp.condition(obs)
    jax.block_until_ready(post)
    return post, report, time.perf_counter() - t0


def force_field(sizes, data_dir):
    """The force-field half: ethanol's symmetric model (benchmarks/force_field.py), its
    lengthscales chosen by closed-form leave-one-out, by the profile likelihood, and by the
    profile likelihood per orbit of atom pairs, against the validation grid (the best on 100
    held-out configurations); test force MAE ratios, the worst over the sizes."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import force_field as bench

    worst = bench.selection_study(sizes, data_dir)
    for criterion, ratio in worst.items():
        print(f"RESULT hyperparameters_force_field_{criterion.replace('-', '_')}_vs_validation {ratio:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two small problems, one seed")
    parser.add_argument("--starts", type=int, default=8, help="eqgp starts screened (8: default)")
    parser.add_argument("--runs", type=int, default=1, help="eqgp starts trained (1: default)")
    parser.add_argument("--part", choices=("smt", "force-field"), default="smt")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 500], help="force-field sizes")
    parser.add_argument("--data", help="force-field: a directory of split{n}.npz (benchmarks/force_field.py)")
    args = parser.parse_args()
    if args.part == "force-field":
        force_field(args.sizes, args.data)
        return
    probs = problems()
    seeds = (0, 1, 2)
    if args.quick:
        probs = {k: probs[k] for k in ("Branin", "WeldedBeam")}
        seeds = (0,)
    print(
        f"backend: {jax.default_backend()}; eqgp: fit_hyperparameters defaults; SMT: GEKPLS(n_comp=D, extra_points=1)"
    )
    print(
        f"{'problem':>11} {'D':>2} {'n':>4} {'seed':>4} | {'eqgp rmse':>9} {'SMT rmse':>9} {'ratio':>6} | "
        f"{'eqgp s':>7} {'SMT s':>7} | eqgp steps, stop"
    )
    ratios, time_ratios_large = [], []
    for name, problem in probs.items():
        D = problem.xlimits.shape[0]
        xtest, ytest, _ = data(problem, 1000, 1234)
        scale = float(np.std(ytest))
        for n in (5 * D, 10 * D):
            for seed in seeds:
                x, y, g = data(problem, n, seed)
                smt_model, smt_s = smt_fit(problem, x, y, g)
                smt_rmse = float(np.sqrt(np.mean((smt_model.predict_values(xtest)[:, 0] - ytest) ** 2))) / scale
                xs, gs = to_unit_box(problem, x, g)
                post, report, eqgp_s = eqgp_fit(xs, y, gs, args.starts, args.runs)
                pred = np.asarray(post.mean(jnp.asarray(to_unit_box(problem, xtest)[0])))
                eqgp_rmse = float(np.sqrt(np.mean((pred - ytest) ** 2))) / scale
                ratio = eqgp_rmse / smt_rmse
                ratios.append(ratio)
                if n == 10 * D:
                    time_ratios_large.append(eqgp_s / smt_s)
                print(
                    f"{name:>11} {D:>2} {n:>4} {seed:>4} | {eqgp_rmse:9.2e} {smt_rmse:9.2e} {ratio:6.2f} | "
                    f"{eqgp_s:7.1f} {smt_s:7.1f} | {report.steps}, {report.reason}",
                    flush=True,
                )
    worse = sum(r > 1 for r in ratios)
    print(f"eqgp worse than SMT on {worse} of {len(ratios)} rows; median RMSE ratio {statistics.median(ratios):.3f}")
    suffix = "" if (args.starts, args.runs) == (8, 1) else f"_starts{args.starts}_runs{args.runs}"
    print(f"RESULT hyperparameters_smt_time_ratio_large_n{suffix} {statistics.median(time_ratios_large):.3f}")
    print(f"RESULT hyperparameters_smt_worst_rmse_ratio{suffix} {max(ratios):.3f}")


if __name__ == "__main__":
    main()
