"""A force field for ethanol learned from energies and forces along a molecular-dynamics run.

The data come from GFN2-xTB (tblite) driven by ASE's Langevin thermostat at 500 K, sampled
every few steps like the MD17 datasets. The GP is a Matérn-5/2 on inverse interatomic
distances (`kernels.Warped`), plain and averaged over the molecule's permutational symmetry
(`kernels.Invariant` with `eqgp.molecular_permutations`), trained on forces only with a
constant mean for the energy offset (sGDML's default) and its lengthscale chosen by
closed-form leave-one-out cross-validation (`eqgp.select_lengthscales`: no held-out data).
`fit_orbit_lengthscales` instead trains one lengthscale per orbit of atom pairs under the
molecule's symmetries (`eqgp.pair_orbits`) by the profile likelihood (the benchmarks'
`"orbit-profile"` criterion).
The script checks the calculator's forces against finite differences of its energy, then
plots the force error against the number of training configurations (a learning curve) for
both kernels, and sGDML's GDML and sGDML models on the same splits when `sgdml` is installed. Writes force_field.png.

Needs the `chem` extra: `pip install ase tblite` (and `sgdml` for its curve).
Units: Å for coordinates, kcal/mol for energies, kcal/mol/Å for forces (MD17's).
"""

import argparse
import functools
import logging
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from _figures import save  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

KCAL_PER_EV = 23.060547830619026  # 1 eV in kcal/mol (ase.units.mol / ase.units.kcal)


def simulate(n_frames: int, *, stride: int = 10, temperature: float = 500.0, seed: int = 0, name="CH3CH2OH"):
    """Energies and forces of `n_frames` configurations of `name` (an `ase.build.molecule`)
    along a Langevin MD run with GFN2-xTB, one frame every `stride` steps of 0.5 fs after
    1 000 steps of equilibration.

    Returns `(Z, R, E, F)`: atomic numbers `(n,)`, positions `(M, n, 3)` in Å, energies
    `(M,)` in kcal/mol and forces `(M, n, 3)` in kcal/mol/Å (`F = -dE/dR`).

    No centre-of-mass constraint: `Langevin(fixcm=True)` and `FixCom` both project the
    forces the calculator returns (they would no longer be `-dE/dR`) and change the sampled
    temperature; the descriptor below does not see the centre of mass drift."""
    from ase import units
    from ase.build import molecule
    from ase.md import velocitydistribution
    from ase.md.langevin import Langevin
    from tblite.ase import TBLite

    atoms = molecule(name)
    atoms.calc = TBLite(method="GFN2-xTB", verbosity=0)
    rng = np.random.default_rng(seed)
    # ASE >= 3.29 names it thermalize_momenta (and deprecates the old name).
    thermalize = getattr(velocitydistribution, "thermalize_momenta", velocitydistribution.MaxwellBoltzmannDistribution)
    thermalize(atoms, temperature_K=temperature, rng=rng)
    dyn = Langevin(atoms, 0.5 * units.fs, temperature_K=temperature, friction=0.02, fixcm=False, rng=rng)
    dyn.run(1000)
    R, E, F = [], [], []
    for _ in range(n_frames):
        dyn.run(stride)
        R.append(atoms.get_positions())
        E.append(atoms.get_potential_energy())
        F.append(atoms.get_forces())
    return atoms.numbers.copy(), np.asarray(R), np.asarray(E) * KCAL_PER_EV, np.asarray(F) * KCAL_PER_EV


def check_forces(Z, R, F, *, h: float = 1e-4) -> float:
    """The largest gap between the calculator's forces on one configuration and central
    finite differences of its energy, `-(E(R + h) - E(R - h)) / 2h` (kcal/mol/Å)."""
    from ase import Atoms
    from tblite.ase import TBLite

    atoms = Atoms(numbers=Z, positions=R)
    atoms.calc = TBLite(method="GFN2-xTB", verbosity=0)
    fd = np.zeros_like(R)
    for i in range(R.shape[0]):
        for k in range(3):
            step = np.zeros_like(R)
            step[i, k] = h
            atoms.set_positions(R + step)
            e_plus = atoms.get_potential_energy()
            atoms.set_positions(R - step)
            e_minus = atoms.get_potential_energy()
            fd[i, k] = -(e_plus - e_minus) / (2 * h) * KCAL_PER_EV
    return float(np.max(np.abs(fd - F)))


class InverseDistances(eqx.Module):
    """The descriptor: the `n (n - 1) / 2` inverse interatomic distances of the flattened
    Cartesian coordinates `(3 n,)` (sGDML's). Unchanged by translations and rotations, so
    the forces the GP predicts carry no net force or torque."""

    n_atoms: int = eqx.field(static=True)

    def __call__(self, x):
        r = x.reshape(self.n_atoms, 3)
        i, j = np.triu_indices(self.n_atoms, k=1)
        return 1.0 / jnp.linalg.norm(r[i] - r[j], axis=-1)


class ScaledInverseDistances(eqx.Module):
    """Inverse distances, each divided by its pair's lengthscale, the lengthscales tied over
    the pairs' orbits under the molecule's symmetries (`eqgp.pair_orbits`): ARD that keeps
    the symmetric kernel invariant (the three methyl C-H bonds share one lengthscale). With
    it, a `Matern52(1.0)` on this descriptor has one lengthscale per orbit (17 for ethanol)."""

    log_lengthscale: jax.Array
    orbits: tuple[int, ...] = eqx.field(static=True)
    n_atoms: int = eqx.field(static=True)

    def __call__(self, x):
        scale = jnp.exp(-self.log_lengthscale)[np.asarray(self.orbits)]
        return scale * InverseDistances(self.n_atoms)(x)


def model(Z, R0, symmetric: bool, lengthscale: float = 20.0, noise: float = 1e-7):
    """A Matérn-5/2 on inverse distances, averaged over the permutations of identical atoms
    that preserve the bond graph of `R0` when `symmetric` (sGDML's kernel), for forces."""
    base = kernels.Warped(kernels.Matern52(lengthscale), InverseDistances(len(Z)))
    kernel = kernels.Invariant(base, eqgp.molecular_permutations(Z, R0)) if symmetric else base
    solver = eqgp.Cholesky(jitter=1e-9)
    return eqgp.GaussianProcess(kernel, mean=0.0, noise=noise, solver=solver)  # the offset: `condition`


def flat(R):
    return jnp.asarray(R.reshape(len(R), -1))


def condition(gp, R, E, F):
    """Condition on the forces only (the gradient is -F) and fix the energy offset, which
    forces cannot see, by the training energies (as sGDML does): the returned posterior's
    constant mean is the mean gap between the energies and the zero-mean model's."""
    forces = eqgp.Observations((eqgp.Gradient(), flat(R), -flat(F)))
    post = gp.condition(forces)
    offset = jnp.mean(jnp.asarray(E) - post.mean(flat(R))) + post.gp.mean.constant
    # A constant mean has zero derivatives: the solve with the forces does not depend on it,
    # so the offset is set on the posterior (no second factorisation, no second compilation).
    return eqx.tree_at(lambda p: p.gp.mean.constant, post, offset)


def errors(post, R, E, F):
    """Mean absolute force error (kcal/mol/Å) and energy error (kcal/mol) on `R`."""
    F_pred = -post.mean(flat(R), eqgp.Gradient())
    return float(jnp.mean(jnp.abs(F_pred - flat(F)))), float(jnp.mean(jnp.abs(post.mean(flat(R)) - E)))


def select(Z, train, symmetric: bool, criterion: str = "loo", valid=None):
    """eqgp's selection of the lengthscale (`eqgp.select_lengthscales`): on a factor-2 grid
    from 0.625 to 40, a descent from 5 to the better neighbour until neither is better, then
    the two lengthscales a factor sqrt(2) either side of the best (5-6 candidates), scored
    by the closed-form leave-one-out force error (`criterion="loo"`: no held-out data
    needed), by the force error on `valid` (`"validation"`: sGDML's selection) or by
    the profile likelihood (`"profile"`); `"orbit-profile"`: the profile likelihood over
    one lengthscale per orbit of atom pairs (`fit_orbit_lengthscales` on the first 200
    configurations at most, then conditioned on all; the lengthscale returned is their
    geometric mean). `train`, `valid`: `(R, E, F)`.
    Returns `(posterior, lengthscale)`, the posterior's energy offset fixed (`condition`)."""
    if criterion == "orbit-profile":  # fitted on at most 200 configurations (each step is O(n^3))
        post, ell, _ = fit_orbit_lengthscales(Z, train, symmetric, subset=200)
        return post, ell
    forces = eqgp.Observations((eqgp.Gradient(), flat(train[0]), -flat(train[2])))
    held = None
    if criterion == "validation":
        held = eqgp.Observations((eqgp.Gradient(), flat(valid[0]), -flat(valid[2])))
    start = model(Z, train[0][0], symmetric, lengthscale=5.0)
    gp, selection = eqgp.select_lengthscales(
        start, forces, criterion=criterion, validation=held, factors=2.0 ** np.arange(-3, 4), refine=1
    )
    return condition(gp, *train), 5.0 * selection.factor


def _profile_nll(log_lengthscale, gp, forces):
    gp = eqx.tree_at(lambda m: _descriptor(m).log_lengthscale, gp, log_lengthscale)
    return -gp.log_marginal_likelihood(forces, profile=True)


def _descriptor(gp):
    kernel = gp.kernel.kernel if isinstance(gp.kernel, kernels.Invariant) else gp.kernel
    return kernel.warp


def fit_orbit_lengthscales(
    Z, train, symmetric: bool, start: float = 5.0, max_steps: int = 100, subset: int | None = None
):
    """eqgp's likelihood selection with a lengthscale per orbit of atom pairs
    (`ScaledInverseDistances`): L-BFGS (`eqgp.minimize`) on the profile likelihood of the
    forces (the signal variance profiled out, the noise fixed at 1e-7 of it, as in `select`)
    over the log-lengthscales, all starting at `start`. With one common lengthscale the
    likelihood prefers a model that predicts forces 1.4x worse; per-orbit ones let it treat
    stiff and soft pairs apart. `subset`: fit on the first `subset` configurations only
    (each likelihood step costs `O(n^3)`), then condition on all of `train`.
    Returns `(posterior, geometric mean lengthscale, report)`."""
    fitted = train if subset is None else tuple(a[:subset] for a in train)
    forces = eqgp.Observations((eqgp.Gradient(), flat(fitted[0]), -flat(fitted[2])))
    orbits = eqgp.pair_orbits(eqgp.molecular_permutations(Z, train[0][0], coordinates=False))
    gp = model(Z, train[0][0], symmetric, lengthscale=1.0)
    descriptor = ScaledInverseDistances(jnp.full(int(orbits.max()) + 1, np.log(start)), tuple(orbits.tolist()), len(Z))
    gp = eqx.tree_at(_descriptor, gp, descriptor)
    log_ell, report = eqgp.minimize(descriptor.log_lengthscale, _profile_nll, gp, forces, max_steps=max_steps)
    gp = eqx.tree_at(lambda m: _descriptor(m).log_lengthscale, gp, log_ell)
    return condition(gp, *train), float(np.exp(np.mean(np.asarray(log_ell)))), report


@functools.cache
def _sgdml_trainer(GDMLTrain):
    return GDMLTrain(max_processes=2)  # sGDML allows one instance per process


def sgdml_errors(Z, train, valid, test, symmetric: bool, grid=range(10, 100, 10)):
    """sGDML (`use_sym=True`) or GDML on the same splits, its lengthscale chosen on `valid`
    from its default grid. Returns `(force MAE, energy MAE, lengthscale)` on `test`."""
    from sgdml.predict import GDMLPredict
    from sgdml.train import GDMLTrain

    def dataset(R, E, F, name):
        return dict(type="d", name=np.array(name), theory=np.array("GFN2-xTB"), z=Z, R=R, E=E, F=F,
                    r_unit=np.array("Ang"), e_unit=np.array("kcal/mol"))  # fmt: skip

    logging.getLogger().setLevel(logging.ERROR)  # sGDML's advice on tiny training sets
    trainer, best = _sgdml_trainer(GDMLTrain), None
    for sig in grid:
        task = trainer.create_task(
            dataset(*train, "train"), len(train[0]), dataset(*valid, "valid"), len(valid[0]), sig=sig, use_sym=symmetric
        )
        fitted = trainer.train(task)
        _, f = GDMLPredict(fitted, max_processes=2).predict(valid[0].reshape(len(valid[0]), -1))
        err = np.mean(np.abs(f - valid[2].reshape(len(valid[0]), -1)))
        if best is None or err < best[0]:
            best = (err, fitted, sig)
    e, f = GDMLPredict(best[1], max_processes=2).predict(test[0].reshape(len(test[0]), -1))
    return float(np.mean(np.abs(f - test[2].reshape(len(test[0]), -1)))), float(np.mean(np.abs(e - test[1]))), best[2]


def splits(data, sizes, n_valid, n_test, seed=0):
    """Disjoint test, validation and nested training sets of the frames `data = (R, E, F)`."""
    order = np.random.default_rng(seed).permutation(len(data[0]))
    take = lambda idx: tuple(a[idx] for a in data)  # noqa: E731
    test, valid = take(order[:n_test]), take(order[n_test : n_test + n_valid])
    pool = order[n_test + n_valid :]
    return {n: take(pool[:n]) for n in sizes}, valid, test


def main(sizes=(10, 20, 40), n_valid: int = 50, n_test: int = 200, reference: bool = True):
    """Learning curves; sGDML's too when `reference` and `sgdml` is installed."""
    Z, R, E, F = simulate(max(sizes) + n_valid + n_test)
    gap = check_forces(Z, R[0], F[0])
    print(f"GFN2-xTB forces vs finite differences of its energy: largest gap {gap:.1e} kcal/mol/Å")
    trains, valid, test = splits((R, E, F), sizes, n_valid, n_test)
    curves = {}
    for symmetric in (False, True):
        name = f"eqgp {'symmetric' if symmetric else 'plain'}"
        for n in sizes:
            start = time.perf_counter()
            post, ell = select(Z, trains[n], symmetric)
            f_err, e_err = errors(post, *test)
            curves.setdefault(name, []).append(f_err)
            print(f"{name:16s} n={n:4d}: force MAE {f_err:.3f} kcal/mol/Å, energy MAE {e_err:.3f} kcal/mol, "
                  f"lengthscale {ell:g}, {time.perf_counter() - start:.1f} s")  # fmt: skip
    try:
        import sgdml  # noqa: F401
    except ImportError:
        print("sgdml is not installed: no sGDML curve (pip install sgdml)")
        reference = False
    if reference:
        for symmetric in (False, True):
            name = "sGDML" if symmetric else "GDML"
            for n in sizes:
                f_err, e_err, sig = sgdml_errors(Z, trains[n], valid, test, symmetric)
                curves.setdefault(name, []).append(f_err)
                print(
                    f"{name:16s} n={n:4d}: force MAE {f_err:.3f} kcal/mol/Å, energy MAE {e_err:.3f} kcal/mol, "
                    f"sigma {sig}"
                )
    fig, ax = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    for name, errs in curves.items():
        ax.loglog(sizes, errs, "o-" if name.startswith("eqgp") else "s--", label=name)
    ax.set_xlabel("training configurations (forces only)")
    ax.set_ylabel("force MAE (kcal/mol/Å)")
    ax.set_title(f"Ethanol, GFN2-xTB at 500 K: learning curves ({n_test} test configurations)")
    ax.legend()
    save(fig, __file__, "force_field.png")
    return gap, curves


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 40])
    main(tuple(parser.parse_args().sizes))
