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
