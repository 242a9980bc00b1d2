"""eqgp's force fields against sGDML on the same configurations and splits.

Ethanol (9 atoms) along a 500 K Langevin run with GFN2-xTB (`examples/force_field.py`'s
generator; needs `pip install ase tblite sgdml`). Four models, each trained on forces only
(the energy offset from the training energies), tested on 1 000 configurations:

- GDML and sGDML (`use_sym=True`, its permutations found by its own matching): sGDML's
  analytic solver, its lengthscale chosen by its default validation grid 10..90 (9 models) on
  100 validation configurations;
- eqgp plain and symmetric (`kernels.Invariant` over `eqgp.molecular_permutations`): a
  Matérn-5/2 on inverse distances, dense Cholesky, its lengthscale chosen by eqgp itself:
  closed-form leave-one-out force error (`eqgp.select_lengthscales`; no validation data): on a
  factor-2 grid 0.625..40, a descent from 5 to the better neighbour, then the two lengthscales
  a factor sqrt(2) either side of the best (5-6 models, `force_field.select`).

Each model runs in its own process; printed per size: force MAE (kcal/mol/Å), energy MAE
(kcal/mol), train time (the whole selection, eqgp's including compilation), time to predict
energies and forces of the 1 000 test configurations, and the process's peak resident memory
(its own and its worker processes', imports included), and that peak less the resident
memory after the model's imports (the work's own memory: sGDML imports torch, eqgp JAX).
RESULT lines: the largest ratio over the sizes of eqgp's symmetric force MAE to sGDML's, and
of their train + predict times, work memories and peak memories (<= 1: eqgp at least as
good).

`selection_study` (run by `benchmarks/hyperparameters.py --part force-field`) compares eqgp's
own selections (leave-one-out, profile likelihood) with the validation grid on the same grid.

Run: `python benchmarks/force_field.py` (sizes 100 200; `--sizes 100 200 500`; `--data DIR`
reuses the `split{n}.npz` files of an earlier run instead of simulating; `--models` runs a
subset of the four). At 1 000 configurations sGDML's analytic solver takes about 23 GB.
"""

import argparse
import json
import logging
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
MODELS = ("GDML", "sGDML", "eqgp plain", "eqgp symmetric")


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, workers) / 1024


def _rss_mb() -> float:
    """The process's resident memory now (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def _child(name: str, n: int, path: str, criterion: str = "loo") -> dict:
    sys.path.insert(0, str(EXAMPLES))
    import force_field as ff

    if not name.startswith("eqgp"):  # eqgp (and JAX) came with force_field
        import sgdml.predict  # noqa: F401 - sGDML's own imports (torch among them)
        import sgdml.train  # noqa: F401
    imports_mb = _rss_mb()

    d = np.load(path)
    Z, train = d["Z"], (d["R"][:n], d["E"][:n], d["F"][:n])
    valid, test = (d["Rv"], d["Ev"], d["Fv"]), (d["Rt"], d["Et"], d["Ft"])
    if name.startswith("eqgp"):
        import jax.numpy as jnp

        start = time.perf_counter()
        post, ell = ff.select(Z, train, name.endswith("symmetric"), criterion, valid)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        parts = [  # 250 configurations at a time: the cross-covariance of 1 000 is ~1-3 GB
            (np.asarray(post.mean(ff.flat(R))), -np.asarray(post.mean(ff.flat(R), ff.eqgp.Gradient())))
            for R in np.array_split(test[0], 4)
        ]
        E_pred, F_pred = (np.concatenate(p) for p in zip(*parts))
        predict_s = time.perf_counter() - start
        setting = f"lengthscale {ell:.3g} by {criterion}"
        del jnp
    else:
        from sgdml.predict import GDMLPredict
        from sgdml.train import GDMLTrain

        logging.getLogger().setLevel(logging.ERROR)
        start = time.perf_counter()
        best = None
        trainer = GDMLTrain(max_processes=os.cpu_count())
        for sig in range(10, 100, 10):
            ds = lambda R, E, F, tag: dict(  # noqa: E731
                type="d", name=np.array(tag), theory=np.array("GFN2-xTB"), z=Z, R=R, E=E, F=F,
                r_unit=np.array("Ang"), e_unit=np.array("kcal/mol"),
            )  # fmt: skip
            task = trainer.create_task(
                ds(*train, "train"), n, ds(*valid, "valid"), len(valid[0]), sig=sig, use_sym=name == "sGDML"
            )
            model = trainer.train(task)
            _, f = GDMLPredict(model, max_processes=os.cpu_count()).predict(valid[0].reshape(len(valid[0]), -1))
            err = np.mean(np.abs(f - valid[2].reshape(len(valid[0]), -1)))
            if best is None or err < best[0]:
                best = (err, model, sig)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        E_pred, F_pred = GDMLPredict(best[1], max_processes=os.cpu_count()).predict(test[0].reshape(len(test[0]), -1))
        predict_s = time.perf_counter() - start
        setting = f"sigma {best[2]}, {best[1]['perms'].shape[0]} perms"
    peak_mb = _peak_mb()
    return {
        "force_mae": float(np.mean(np.abs(F_pred.reshape(len(test[0]), -1) - test[2].reshape(len(test[0]), -1)))),
        "energy_mae": float(np.mean(np.abs(E_pred.reshape(-1) - test[1]))),
        "train_s": train_s,
        "predict_s": predict_s,
        "peak_mb": peak_mb,
        "work_mb": peak_mb - imports_mb,  # the peak less the resident memory after the imports
        "setting": setting,
    }


def _splits(sizes, data_dir, n_valid: int, n_test: int) -> dict:
    """`{n: path}` of the splits: from `data_dir` (`split{n}.npz`, as written here) when given,
    else simulated now and written to a temporary directory."""
    if data_dir is not None:
        return {n: os.path.join(data_dir, f"split{n}.npz") for n in sizes}
    sys.path.insert(0, str(EXAMPLES))
    import force_field as ff

    start = time.perf_counter()
    Z, R, E, F = ff.simulate(max(sizes) + n_valid + n_test)
    print(f"data: {len(R)} configurations of ethanol in {time.perf_counter() - start:.0f} s; "
          f"forces vs finite differences: {ff.check_forces(Z, R[0], F[0]):.1e} kcal/mol/Å")  # fmt: skip
    trains, valid, test = ff.splits((R, E, F), sizes, n_valid, n_test)
    tmp = tempfile.mkdtemp()
    paths = {}
    for n in sizes:
        paths[n] = os.path.join(tmp, f"split{n}.npz")
        np.savez(paths[n], Z=Z, R=trains[n][0], E=trains[n][1], F=trains[n][2], Rv=valid[0], Ev=valid[1],
                 Fv=valid[2], Rt=test[0], Et=test[1], Ft=test[2])  # fmt: skip
    return paths


def run(name: str, n: int, path: str, criterion: str = "loo") -> dict | None:
    """One model in its own process (its peak memory its own); `None` if it failed."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, str(n), path, criterion], capture_output=True, text=True
    )
    if out.returncode != 0:  # reported, and left out of the ratios
        last = (out.stderr.strip().splitlines() or [""])[-1][:200]
        print(f"n={n:5d} {name:15s} failed (exit code {out.returncode}): {last}", flush=True)
        return None
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"n={n:5d} {name:15s} force MAE {r['force_mae']:6.3f}  energy MAE {r['energy_mae']:6.3f}  "
        f"train {r['train_s']:7.1f} s  predict {r['predict_s']:6.2f} s  peak {r['peak_mb']:6.0f} MB "
        f"({r['work_mb']:5.0f} MB above its imports)  ({r['setting']})",
        flush=True,
    )
    return r


def main(sizes, data_dir=None, n_valid: int = 100, n_test: int = 1000, models=MODELS):
    paths = _splits(sizes, data_dir, n_valid, n_test)
    results = {}
    for n in sizes:
        for name in models:
            r = run(name, n, paths[n])
            if r is not None:
                results[name, n] = r
    pairs = [n for n in sizes if ("eqgp symmetric", n) in results and ("sGDML", n) in results]
    plains = [n for n in sizes if ("eqgp plain", n) in results and ("GDML", n) in results]
    if plains:
        plain = max(results["eqgp plain", n]["force_mae"] / results["GDML", n]["force_mae"] for n in plains)
        print(f"RESULT force_field_plain_vs_gdml_force_mae_ratio {plain:.3f}")
    if not pairs:  # sGDML or eqgp's symmetric model not run (or failed): no other ratio
        return
    ratio = lambda key: max(results["eqgp symmetric", n][key] / results["sGDML", n][key] for n in pairs)  # noqa: E731
    both = lambda r: r["train_s"] + r["predict_s"]  # noqa: E731
    time_ratio = max(both(results["eqgp symmetric", n]) / both(results["sGDML", n]) for n in pairs)
    print(f"RESULT force_field_time_ratio {time_ratio:.3f}")
    # The work's own memory: each process's peak less its resident memory after its imports
    # (eqgp's: JAX and the example; sGDML's: the same plus its own, torch among them).
    print(f"RESULT force_field_work_memory_ratio {ratio('work_mb'):.3f}")
    print(f"RESULT force_field_peak_memory_ratio {ratio('peak_mb'):.3f}")
    print(f"RESULT force_field_symmetric_force_mae_ratio {ratio('force_mae'):.3f}")


def selection_study(
    sizes,
    data_dir=None,
    models=("eqgp symmetric",),
    n_valid: int = 100,
    n_test: int = 1000,
    criteria=("loo", "profile", "orbit-profile"),
):
    """eqgp's own selections (closed-form leave-one-out and the profile likelihood over one
    common lengthscale on the validation grid's grid; the profile likelihood over one
    lengthscale per orbit of atom pairs by L-BFGS, `force_field.fit_orbit_lengthscales`)
    against the validation grid: the test force MAE of each, and its ratio to the
    validation-selected model's. Returns `{criterion: worst ratio over sizes and models}`."""
    paths = _splits(sizes, data_dir, n_valid, n_test)
    worst = {}
    for n in sizes:
        for name in models:
            by = {c: run(name, n, paths[n], c) for c in ("validation",) + criteria}
            if by["validation"] is None:
                continue
            for c in criteria:
                if by[c] is not None:
                    r = by[c]["force_mae"] / by["validation"]["force_mae"]
                    print(f"n={n:5d} {name:15s} {c} / validation test force MAE: {r:.3f}", flush=True)
                    worst[c] = max(worst.get(c, 0.0), r)
    return worst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--data", help="a directory of split{n}.npz files written by an earlier run")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="a subset of the four")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "N", "DATA", "CRITERION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.child[2], args.child[3])))
    else:
        main(args.sizes, args.data, models=tuple(args.models))
