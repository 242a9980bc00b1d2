import jax.numpy as jnp
import numpy as np
import pytest

import eqgp
from eqgp import kernels

ETHANOL_Z = [6, 6, 8, 1, 1, 1, 1, 1, 1]
ETHANOL_R = [
    [1.1879, -0.3829, 0.0000],  # C (methyl)
    [0.0000, 0.5526, 0.0000],  # C (CH2)
    [-1.1867, -0.2472, 0.0000],  # O
    [-1.9237, 0.3850, 0.0000],  # H (hydroxyl)
    [2.0985, 0.2306, 0.0000],  # H (methyl)
    [1.1184, -1.0093, 0.8869],  # H (methyl)
    [1.1184, -1.0093, -0.8869],  # H (methyl)
    [0.0227, 1.1812, 0.8852],  # H (CH2)
    [0.0227, 1.1812, -0.8852],  # H (CH2)
]


def _benzene():
    a = np.deg2rad(60 * np.arange(6))
    ring = np.stack([np.cos(a), np.sin(a), np.zeros(6)], axis=1)
    return [6] * 6 + [1] * 6, np.concatenate([1.39 * ring, 2.47 * ring])


def _as_set(P):
    return {tuple(row) for row in np.asarray(P).tolist()}


def test_ethanol_methyl_and_methylene_hydrogens():
    P = eqgp.molecular_permutations(ETHANOL_Z, ETHANOL_R, coordinates=False)
    assert P.shape == (12, 9) and np.array_equal(P[0], np.arange(9))  # 3! methyl x 2 methylene
    for p in P:
        assert list(p[:4]) == [0, 1, 2, 3]  # heavy atoms and the hydroxyl H stay
        assert set(p[4:7]) == {4, 5, 6} and set(p[7:]) == {7, 8}
    assert _as_set(kernels.Invariant.closure(P)) == _as_set(P)  # a group


def test_benzene_has_the_hexagons_twelve_symmetries():
    Z, R = _benzene()
    P = eqgp.molecular_permutations(Z, R, coordinates=False)
    assert P.shape == (12, 12)
    assert _as_set(kernels.Invariant.closure(P)) == _as_set(P)
    for p in P:  # carbons map to carbons, and each H follows its carbon
        assert set(p[:6]) == set(range(6)) and np.array_equal(p[6:], p[:6] + 6)


def test_coordinate_permutations_feed_an_invariant_kernel():
    P = eqgp.molecular_permutations(ETHANOL_Z, np.asarray(ETHANOL_R))
    assert P.shape == (12, 27)
    atoms = eqgp.molecular_permutations(ETHANOL_Z, ETHANOL_R, coordinates=False)
    assert np.array_equal(P[:, 0::3] // 3, atoms) and np.array_equal(P % 3, np.tile(np.arange(3), (12, 9)))
    k = kernels.Invariant(kernels.RBF(2.0), P)
    x = jnp.asarray(ETHANOL_R).reshape(-1)
    y = x + 0.05 * jnp.asarray(np.random.default_rng(0).normal(size=27))
    assert abs(float(k(x[P[5]], y)) - float(k(x, y))) < 1e-12


@pytest.mark.parametrize(
    "args, match",
    [
        (([6, 1], np.zeros((3, 3))), "`positions`"),
        (([6.0, 1.0], np.zeros((2, 3))), "`numbers`"),
        (([6, 92], np.zeros((2, 3))), "no covalent radius"),
    ],
)
def test_molecular_permutations_names_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        eqgp.molecular_permutations(*args)


def _pair_index(n):
    i, j = np.triu_indices(n, k=1)
    index = np.zeros((n, n), int)
    index[i, j] = index[j, i] = np.arange(i.size)
    return i, j, index


@pytest.mark.parametrize("molecule, count", [("ethanol", 17), ("benzene", 10)])
def test_pair_orbits_are_the_groups_orbits(molecule, count):
    Z, R = (ETHANOL_Z, ETHANOL_R) if molecule == "ethanol" else _benzene()
    P = eqgp.molecular_permutations(Z, R, coordinates=False)
    orbits = eqgp.pair_orbits(P)
    n = len(Z)
    i, j, index = _pair_index(n)
    assert orbits.shape == (n * (n - 1) // 2,) and orbits.max() + 1 == count and orbits[0] == 0
    # Ethanol: heavy atoms and the hydroxyl H pairwise (6), each of them to the methyl Hs (4) and
    # to the CH2 Hs (4), methyl-methyl, CH2-CH2, methyl-CH2 (3). Benzene: C-C, H-H, C-H by ring distance.
    # Brute force: the orbit of each pair is the set of its images under the (closed) group.
    for a in range(i.size):
        images = {int(index[p[i[a]], p[j[a]]]) for p in P}
        assert images == set(np.flatnonzero(orbits == orbits[a]).tolist())
    # Lengthscales tied by orbit keep a pair-descriptor kernel invariant under the group.
    ell = jnp.asarray(0.5 + 0.1 * np.arange(count))[orbits]

    def inverse_distances(x):
        r = x.reshape(n, 3)
        return 1.0 / jnp.linalg.norm(r[i] - r[j], axis=-1)

    k = kernels.Warped(kernels.Matern52(ell), inverse_distances)
    x = jnp.asarray(R, jnp.float64).reshape(-1)
    y = x + 0.05 * jnp.asarray(np.random.default_rng(1).normal(size=3 * n))
    coords = eqgp.molecular_permutations(Z, R)
    for g in coords:
        assert abs(float(k(x[g], y[g])) - float(k(x, y))) < 1e-12
    untied = kernels.Warped(kernels.Matern52(jnp.asarray(0.5 + 0.01 * np.arange(i.size))), k.warp)
    assert max(abs(float(untied(x[g], y[g])) - float(untied(x, y))) for g in coords) > 1e-6


def test_pair_orbits_names_bad_input():
    with pytest.raises(ValueError, match="`permutations`"):
        eqgp.pair_orbits(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="permutation of 0..n-1"):
        eqgp.pair_orbits(np.array([[0, 1, 2], [3, 4, 5]]))
