"""Gradient-enhanced Bayesian optimisation against value-only BO and random search.

The d-KG suite (Wu et al. 2017): Branin, Rosenbrock-2, Hartmann-3, Hartmann-6 and Ackley-5,
each minimised on a box, at equal numbers of function evaluations. Every method starts from
the same random design of D + 1 points per seed; the two GP methods refit their
hyper-parameters at every iteration (`eqgp.fit`, warm-started from the last fit) and pick the
next point by maximising log expected improvement (`eqgp.maximize_acquisition`). The only
difference between them: the gradient-enhanced GP also conditions on the gradient of every
evaluation (what an adjoint solver gives for free).

Prints, per function, the evaluations each method needed to reach regret 1e-3 (median over
seeds) and the median regret at 20 and 50 evaluations; a modelling table (test RMSE on
Hartmann-6 of value-only GPs with n and 7n points and a gradient GP with n); and writes
bayesian_optimisation.png (best-so-far regret, median and quartiles over seeds) and
bayesian_optimisation_slice.png (the final models of one Hartmann-6 run on a 2-D slice).

    python examples/bayesian_optimisation.py                  # the full study (10 seeds)
    python examples/bayesian_optimisation.py --quick          # 2 seeds, short budgets
    python examples/bayesian_optimisation.py --high-dim-cost  # one iteration's cost at D = 100
"""

import argparse
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402


# --- the test functions, each on its own box; minima from the literature ---------------------
def branin(x):
    a, b = x[0], x[1]
    return (b - 5.1 / (4 * jnp.pi**2) * a**2 + 5 / jnp.pi * a - 6) ** 2 + 10 * (1 - 1 / (8 * jnp.pi)) * jnp.cos(a) + 10


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


_H3_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
_H3_P = 1e-4 * np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]])
_H6_A = np.array(
    [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
)
_H6_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
_H_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def _hartmann(A, P):
    def f(x):
        return -jnp.sum(_H_ALPHA * jnp.exp(-jnp.sum(A * (x[None] - P) ** 2, axis=1)))

    return f


def ackley(x):
    d = x.shape[0]
    return (
        -20.0 * jnp.exp(-0.2 * jnp.sqrt(jnp.sum(x**2) / d + 1e-300))
        - jnp.exp(jnp.sum(jnp.cos(2 * jnp.pi * x)) / d)
        + 20.0
        + jnp.e
    )


def levy(x):
    w = 1.0 + (x - 1.0) / 4.0
    return (
        jnp.sin(jnp.pi * w[0]) ** 2
        + jnp.sum((w[:-1] - 1.0) ** 2 * (1.0 + 10.0 * jnp.sin(jnp.pi * w[:-1] + 1.0) ** 2))
        + (w[-1] - 1.0) ** 2 * (1.0 + jnp.sin(2 * jnp.pi * w[-1]) ** 2)
    )


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    f: Callable
    lower: tuple
    upper: tuple
    minimum: float
    budget: int  # evaluations, the initial design included

    @property
    def dim(self) -> int:
        return len(self.lower)

    def on_unit_box(self, u):  # the GP and the acquisition work on [0, 1]^D
        lo, hi = jnp.asarray(self.lower), jnp.asarray(self.upper)
        return self.f(lo + u * (hi - lo))


PROBLEMS = (
    Problem("Branin", branin, (-5.0, 0.0), (10.0, 15.0), 0.397887, 50),
    Problem("Rosenbrock-2", rosenbrock, (-2.0, -2.0), (2.0, 2.0), 0.0, 50),
    Problem("Hartmann-3", _hartmann(_H3_A, _H3_P), (0.0,) * 3, (1.0,) * 3, -3.86278, 50),
    Problem("Hartmann-6", _hartmann(_H6_A, _H6_P), (0.0,) * 6, (1.0,) * 6, -3.32237, 80),
    Problem("Ackley-5", ackley, (-2.0,) * 5, (2.0,) * 5, 0.0, 80),
)
METHODS = ("gradient BO", "value BO", "random")


# --- one BO run -------------------------------------------------------------------------------
def _nll(gp, obs):
    return -gp.log_marginal_likelihood(obs)


# One loss and one optimizer object for every refit, so that `eqgp.fit` compiles its step once
# per shape and reuses it across iterations, seeds and problems of the same size.
_OPTIMIZER = optax.adam(5e-2)
_PAD_NOISE = 1e10  # known noise of a padding row (in standardised units): it carries no information


@functools.partial(jax.jit, static_argnames="gradients")
def _observations(X, y, G, n, gradients: bool):
    """The first `n` evaluations in standardised units, padded to the arrays' full length with
    uninformative rows (huge known noise), so that every iteration has the same shapes and
    runs the same compiled programs. Also returns the incumbent (the best standardised value)
    and the standardisation (mean, sd)."""
    real = jnp.arange(y.shape[0]) < n
    mu = jnp.sum(jnp.where(real, y, 0.0)) / n
    sd = jnp.sqrt(jnp.sum(jnp.where(real, (y - mu) ** 2, 0.0)) / n) + 1e-12
    X = jnp.where(real[:, None], X, X[0])
    y = jnp.where(real, (y - mu) / sd, 0.0)
    best = jnp.min(jnp.where(real, y, jnp.inf))
    pad = jnp.where(real, 0.0, _PAD_NOISE)
    if gradients:
        G = jnp.where(real[:, None], G / sd, 0.0)
        noise = jnp.broadcast_to(pad[:, None], G.shape[:1] + (G.shape[1] + 1,))
        return eqgp.Observations.values_and_gradients(X, y, G, noise=noise), best, (mu, sd)
    return eqgp.Observations.values(X, y, noise=pad), best, (mu, sd)


@eqx.filter_jit
def _propose(gp, obs, best, x_best, key):
    """Condition on `obs` and maximise log EI over the unit box: the next point (unit
    coordinates). 16 uniform starts and 8 near the incumbent `x_best` (local refinement)."""
    post = gp.condition(obs)
    dim = obs.dim
    key_starts, key_local = jax.random.split(key)
    local = x_best[None] + 0.02 * jax.random.normal(key_local, (8, dim), x_best.dtype)
    x, _ = eqgp.maximize_acquisition(
        lambda X: eqgp.log_expected_improvement(post, X, best, maximize=False),
        jnp.zeros(dim),
        jnp.ones(dim),
        key_starts,
        num_starts=16,
        steps=60,
        learning_rate=0.05,
        initial=local,
    )
    return x


def _new_gp(dim: int):
    # Matérn-5/2 with one lengthscale per input (BoTorch's default), a trainable constant mean;
    # the noise floor keeps the factorisation well conditioned when evaluations cluster.
    return eqgp.GaussianProcess(kernels.Matern52([0.3] * dim, variance=1.0), mean=0.0, noise=1e-4, noise_floor=1e-6)


def run(problem: Problem, method: str, seed: int, budget: int, refit_steps: int = 20, bar=None):
    """Minimise `problem` with `method` from the seed's initial design. Returns the best value
    so far after each evaluation, shape (budget,), and (gp, X, y, G) at the end (gp None for
    random search); X is in unit coordinates."""
    dim = problem.dim
    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(problem.on_unit_box)))
    key_init, key_loop = jax.random.split(jax.random.key(seed))
    n0 = dim + 1  # the initial design, shared by the three methods
    X = jax.random.uniform(key_init, (budget, dim), jnp.float64)  # rows past n: overwritten
    y, G = value_and_grad(X)
    gp = None
    if method == "random":  # the remaining rows are uniform random points already
        if bar is not None:
            bar.update(budget - n0)
        return np.minimum.accumulate(np.asarray(y)), (None, X, y, G)
    gradients = method == "gradient BO"
    gp = _new_gp(dim)
    steps = 5 * refit_steps  # the first fit from the initial guess, later ones warm-started
    for n in range(n0, budget):
        obs, best, _ = _observations(X, y, G, n, gradients)
        try:
            gp, _ = eqgp.fit(gp, _nll, _OPTIMIZER, steps, obs, progress=False)
        except eqgp.FitError as e:  # keep what trained before the failing step
            gp = e.model
        steps = refit_steps
        x_best = X[jnp.argmin(jnp.where(jnp.arange(budget) < n, y, jnp.inf))]
        x = _propose(gp, obs, best, x_best, jax.random.fold_in(key_loop, n))
        y_new, g_new = value_and_grad(x[None])
        X, y, G = X.at[n].set(x), y.at[n].set(y_new[0]), G.at[n].set(g_new[0])
        if bar is not None:
            bar.update(1)
    return np.minimum.accumulate(np.asarray(y)), (gp, X, y, G)


# --- the study ---------------------------------------------------------------------------------
def _polished_minimum(problem: Problem, x_star) -> float:
    """The literature's minimum, or a lower one found by polishing its minimiser (Newton steps
    in float64), so that regret never goes negative from the rounding of published digits."""
    x = jnp.asarray(x_star, jnp.float64)
    for _ in range(8):
        x = x - jnp.linalg.solve(jax.hessian(problem.f)(x), jax.grad(problem.f)(x))
    return min(problem.minimum, float(problem.f(x)))


_MINIMISERS = {
    "Branin": (-jnp.pi, 12.275),
    "Hartmann-3": (0.114614, 0.555649, 0.852547),
    "Hartmann-6": (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573),
}


def study(problems=PROBLEMS, seeds: int = 10, budget_cap: int | None = None):
    """Every method on every problem for `seeds` seeds. Returns {problem name: {method: regret
    array (seeds, budget)}} and the last seed's final gradient and value models per problem."""
    budgets = {p.name: min(p.budget, budget_cap or p.budget) for p in problems}
    total = sum(seeds * len(METHODS) * (budgets[p.name] - p.dim - 1) for p in problems)
    regrets, finals = {}, {}
    mininterval = 0.5 if sys.stderr.isatty() else 30.0  # a line every 30 s into a log
    with tqdm(total=total, desc="BO study", unit="eval", mininterval=mininterval) as bar:
        for problem in problems:
            f_min = (
                _polished_minimum(problem, _MINIMISERS[problem.name])
                if problem.name in _MINIMISERS
                else problem.minimum
            )
            regrets[problem.name] = {}
            for method in METHODS:
                bar.set_postfix_str(f"{problem.name}: {method}")
                runs = []
                for seed in range(seeds):
                    best, final = run(problem, method, seed, budgets[problem.name], bar=bar)
                    runs.append(np.maximum(best - f_min, 0.0))
                    finals[problem.name, method] = final
                regrets[problem.name][method] = np.stack(runs)
    return regrets, finals


def evaluations_to_reach(regret: np.ndarray, target: float) -> float:
    """The median over seeds of the first evaluation (1-based) with regret <= target (inf where
    a seed never gets there)."""
    hit = regret <= target
    first = np.where(hit.any(1), hit.argmax(1) + 1.0, np.inf)
    return float(np.median(first))


def report(regrets) -> str:
    lines = [
        "evaluations to reach regret 1e-3 (median over seeds; '-': the median seed did not get there)",
        "and the median best-so-far regret after 20 and 50 evaluations and at the end",
        f"{'function':14s} {'method':12s} {'to 1e-3':>8s} {'@20':>9s} {'@50':>9s} {'end':>13s}",
    ]
    for name, per in regrets.items():
        for m in METHODS:
            r = per[m]
            reach = evaluations_to_reach(r, 1e-3)
            at = [f"{np.median(r[:, k - 1]):.1e}" if r.shape[1] >= k else "n/a" for k in (20, 50)]
            end = f"{np.median(r[:, -1]):.1e} @{r.shape[1]}"
            reach = "-" if math.isinf(reach) else str(int(reach))
            lines.append(f"{name:14s} {m:12s} {reach:>8s} {at[0]:>9s} {at[1]:>9s} {end:>13s}")
    return "\n".join(lines)


def plot_regret(regrets, out: str = "bayesian_optimisation.png"):
    import matplotlib.pyplot as plt
    from _figures import save

    fig, axes = plt.subplots(1, len(regrets), figsize=(4.2 * len(regrets), 3.8), constrained_layout=True)
    axes = np.atleast_1d(axes)
    colours = {"gradient BO": "C0", "value BO": "C1", "random": "0.5"}
    for ax, (name, per) in zip(axes, regrets.items()):
        for m in METHODS:
            r = np.maximum(per[m], 1e-8)  # regret 0 (found to rounding) drawn at the floor
            t = np.arange(1, r.shape[1] + 1)
            q1, med, q3 = np.percentile(r, [25, 50, 75], axis=0)
            ax.plot(t, med, color=colours[m], label=m)
            ax.fill_between(t, q1, q3, color=colours[m], alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.axhline(1e-3, color="k", lw=0.6, ls=":")
        ax.set_title(name)
        ax.set_xlabel("function evaluations")
    axes[0].set_ylabel("best-so-far regret")
    axes[0].legend()
    n_seeds = next(iter(next(iter(regrets.values())).values())).shape[0]
    fig.suptitle(f"Bayesian optimisation: median and quartiles over {n_seeds} seeds (dotted: regret 1e-3)")
    save(fig, __file__, out)


def plot_slice(problem: Problem, finals, dims=(0, 3), out: str = "bayesian_optimisation_slice.png"):
    """Truth and both final models of the last seed on the 2-D slice of `dims` through the
    minimiser (other inputs fixed there), in the problem's units."""
    from _figures import maps, save

    x_star = jnp.asarray(_MINIMISERS[problem.name])
    lo, hi = np.asarray(problem.lower), np.asarray(problem.upper)
    u_star = (x_star - lo) / (hi - lo)
    g = jnp.linspace(0, 1, 50)
    A, B = jnp.meshgrid(g, g)
    U = jnp.broadcast_to(u_star, (A.size, problem.dim)).at[:, dims[0]].set(A.ravel()).at[:, dims[1]].set(B.ravel())
    panels = [(f"{problem.name} (truth)", jax.vmap(problem.on_unit_box)(U).reshape(50, 50))]
    points = []
    for m in ("gradient BO", "value BO"):
        gp, X, y, G = finals[problem.name, m]
        obs, _, (mu, sd) = _observations(X, y, G, len(y), m == "gradient BO")
        post = gp.condition(obs)
        err = float(jnp.sqrt(jnp.mean((post.mean(U) * sd + mu - panels[0][1].ravel()) ** 2)))
        panels.append((f"{m} model: RMSE on the slice {err:.2f}", (post.mean(U) * sd + mu).reshape(50, 50)))
        points.append(X)
    fig, axes = maps(
        g,
        panels,
        f"{problem.name}, last seed's final models after {len(y)} evaluations: inputs {dims[0] + 1} and "
        f"{dims[1] + 1}, the others at the minimiser (star); dots: the evaluations, projected",
        xlabel=f"$u_{dims[0] + 1}$",
        ylabel=f"$u_{dims[1] + 1}$",
    )
    for ax, X in zip(axes[1:], points):
        ax.plot(X[:, dims[0]], X[:, dims[1]], "k.", ms=4, alpha=0.6)
        ax.plot(u_star[dims[0]], u_star[dims[1]], "r*", ms=10)
    save(fig, __file__, out)


def rmse_table(ns=(20, 40), seeds: int = 5, steps: int = 300):
    """Test RMSE on Hartmann-6 of a value-only GP with n points, a gradient GP with n points and
    a value-only GP with 7n points (as many scalar observations as the gradient GP): median over seeds."""
    problem = PROBLEMS[3]
    f = jax.vmap(problem.on_unit_box)
    value_and_grad = jax.vmap(jax.value_and_grad(problem.on_unit_box))
    Xt = jax.random.uniform(jax.random.key(10_000), (2000, 6), jnp.float64)
    yt = f(Xt)
    rows = {}
    for n in ns:
        out = {"value GP, n": [], "gradient GP, n": [], "value GP, 7n": []}
        for seed in range(seeds):
            key = jax.random.key(20_000 + seed)
            for label, m, grads in (
                ("value GP, n", n, False),
                ("gradient GP, n", n, True),
                ("value GP, 7n", 7 * n, False),
            ):
                X = jax.random.uniform(key, (m, 6), jnp.float64)
                y, G = value_and_grad(X)
                obs, _, (mu, sd) = _observations(X, y, G, m, grads)
                gp, _ = eqgp.fit(_new_gp(6), _nll, _OPTIMIZER, steps, obs, progress=False)
                post = gp.condition(obs)
                out[label].append(float(jnp.sqrt(jnp.mean((post.mean(Xt) * sd + mu - yt) ** 2))))
        rows[n] = {k: float(np.median(v)) for k, v in out.items()}
    lines = [f"Hartmann-6 test RMSE (2 000 uniform test points, median over {seeds} seeds; f ranges over [-3.32, 0])"]
    lines.append(f"{'n':>4s}" + "".join(f"{k:>17s}" for k in rows[ns[0]]))
    for n, r in rows.items():
        lines.append(f"{n:>4d}" + "".join(f"{v:>17.4f}" for v in r.values()))
    return rows, "\n".join(lines)


def high_dim_cost(dim: int = 100, n: int = 150, candidates: int = 24):
    """What one iteration of gradient-enhanced BO costs at high D with the matrix-free solver:
    Ackley-100 and Levy-100 at n = 150 evaluations (n (D + 1) = 15 150 rows; the dense
    covariance would be 1.8 GB and its factorisation ~1e12 flops). Times one NLML + gradient
    (a refit step) and one `condition` (CG solve + a LOVE cache of 100 Lanczos steps) + predictive
    mean and variance at `candidates` points (one acquisition step, from the cache)."""
    rows = []
    for name, f, lo, hi in (("Ackley", ackley, -2.0, 2.0), ("Levy", levy, -10.0, 10.0)):
        problem = Problem(f"{name}-{dim}", f, (lo,) * dim, (hi,) * dim, 0.0, n)
        X = jax.random.uniform(jax.random.key(0), (n, dim), jnp.float64)
        y, G = jax.vmap(jax.value_and_grad(problem.on_unit_box))(X)
        obs, _, _ = _observations(X, y, G, n, True)
        solver = eqgp.ConjugateGradient(
            rtol=1e-6, num_probes=8, num_lanczos=30, preconditioner_rank=100, variance_rank=100, on_failure="warn"
        )
        gp = eqgp.GaussianProcess(
            kernels.Matern52([0.3 * math.sqrt(dim)] * dim), mean=0.0, noise=1e-4, noise_floor=1e-6, solver=solver
        )
        step = eqx.filter_jit(eqx.filter_value_and_grad(_nll))
        predict = eqx.filter_jit(lambda gp, obs, Xc: (lambda p: (p.mean(Xc), p.variance(Xc)))(gp.condition(obs)))
        Xc = jax.random.uniform(jax.random.key(1), (candidates, dim), jnp.float64)
        times = []
        for fn, args in ((step, (gp, obs)), (predict, (gp, obs, Xc))):
            jax.block_until_ready(fn(*args))  # compile
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t0)
        rows.append((problem.name, obs.size, *times))
    lines = [f"high dimension, matrix-free (ConjugateGradient), n = {n} evaluations with gradients:"]
    for name, size, t_fit, t_pred in rows:
        lines.append(
            f"  {name}: {size} rows; NLML + gradient {t_fit:.1f} s; condition + mean/variance at "
            f"{candidates} candidates {t_pred:.1f} s"
        )
    return rows, "\n".join(lines)


def main(
    seeds: int = 10,
    problems=PROBLEMS,
    budget_cap: int | None = None,
    rmse_ns=(20, 40),
    rmse_seeds: int = 5,
    figures: bool = True,
):
    t0 = time.perf_counter()
    regrets, finals = study(problems, seeds, budget_cap)
    print(report(regrets))
    rows, table = rmse_table(rmse_ns, rmse_seeds)
    print(table)
    if figures:
        plot_regret(regrets)
        hartmann6 = [p for p in problems if p.name == "Hartmann-6"]
        if hartmann6:
            plot_slice(hartmann6[0], finals)
    print(f"study time {time.perf_counter() - t0:.0f} s")
    return regrets, rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, Branin and Hartmann-3, 12 evaluations")
    parser.add_argument(
        "--high-dim-cost", action="store_true", help="only time one iteration's pieces at D = 100, n = 150"
    )
    args = parser.parse_args()
    if args.high_dim_cost:
        print(high_dim_cost()[1])
    elif args.quick:
        main(seeds=2, problems=PROBLEMS[:1] + PROBLEMS[2:3], budget_cap=12, rmse_ns=(10,), rmse_seeds=1, figures=False)
    else:
        main()
