"""The permutations of identical atoms that map a molecule's bond graph onto itself (the
group for `kernels.Invariant`), as sGDML finds its `perms`."""

import numpy as np

# Covalent radii in Å (Cordero et al. 2008) for the common elements of small molecules.
_COVALENT_RADIUS = {
    1: 0.31,
    5: 0.84,
    6: 0.76,
    7: 0.71,
    8: 0.66,
    9: 0.57,
    14: 1.11,
    15: 1.07,
    16: 1.05,
    17: 1.02,
    35: 1.20,
    53: 1.39,
}


def bond_graph(numbers, positions, tolerance: float = 1.2) -> np.ndarray:
    """`(n, n)` bool adjacency: atoms `i != j` bonded where their distance is below
    `tolerance` times the sum of their covalent radii (`positions` in Å; several
    geometries `(m, n, 3)` are averaged over distances first)."""
    Z = np.asarray(numbers)
    R = np.asarray(positions, dtype=float)
    if Z.ndim != 1 or not np.issubdtype(Z.dtype, np.integer):
        raise ValueError(f"`numbers` must be a (n,) array of atomic numbers; got shape {Z.shape} of {Z.dtype}.")
    if R.ndim == 2:
        R = R[None]
    if R.ndim != 3 or R.shape[1:] != (Z.shape[0], 3):
        raise ValueError(
            f"`positions` must be (n, 3) or (m, n, 3) with n = {Z.shape[0]} atoms; got {np.shape(positions)}."
        )
    missing = sorted({int(z) for z in Z} - set(_COVALENT_RADIUS))
    if missing:
        raise ValueError(f"no covalent radius for atomic numbers {missing}; known: {sorted(_COVALENT_RADIUS)}.")
    if not (isinstance(tolerance, (int, float)) and tolerance > 0):
        raise ValueError(f"`tolerance` must be a number > 0; got {tolerance!r}.")
    if not np.isfinite(R).all():
        raise ValueError("`positions` must be finite; got NaN or inf.")
    dist = np.mean(np.linalg.norm(R[:, :, None] - R[:, None], axis=-1), axis=0)
    close = np.argwhere(np.triu(dist < 0.1, 1))
    if close.size:
        i, j = close[0]
        raise ValueError(
            f"`positions`: atoms {i} and {j} are {dist[i, j]:.3g} Å apart (coincident atoms; positions in Å?)."
        )
    radii = np.array([_COVALENT_RADIUS[int(z)] for z in Z])
    bonded = dist < tolerance * (radii[:, None] + radii[None])
    np.fill_diagonal(bonded, False)
    return bonded


def molecular_permutations(numbers, positions, *, tolerance: float = 1.2, coordinates: bool = True) -> np.ndarray:
    """Every permutation of identical atoms that maps the molecule's bond graph onto itself
    (its automorphisms that keep each atom's element): the group of `kernels.Invariant` for
    a force field on Cartesian coordinates.

    sGDML finds its `perms` by matching the training geometries to each other (an
    assignment problem on the distance matrices, then the closure under composition);
    this searches the bond graph's automorphisms directly (backtracking, pruned by element
    and bond degree), so it includes every symmetry of the bonding (e.g. the rotations of
    a methyl group), whether the training data visit it or not.

    **Arguments:**

    - `numbers`: `(n,)` atomic numbers; `positions`: `(n, 3)` (or `(m, n, 3)`: several
      geometries, distances averaged) in Å.
    - `tolerance`: a bond where the distance is below `tolerance` times the sum of the
      covalent radii.
    - `coordinates`: `True` returns `(G, 3 n)` permutations of the flattened coordinates
      (`x = positions.reshape(-1)`; `(g x)[3 i + c] = x[3 p[i] + c]`), ready for
      `kernels.Invariant`; `False` returns the `(G, n)` atom permutations `p`.

    The identity comes first.
    """
    Z = np.asarray(numbers)
    A = bond_graph(Z, positions, tolerance)
    n = Z.shape[0]
    degree = A.sum(axis=1)
    # Assign atoms in an order where each (after the first of a component) has an assigned neighbour.
    order, seen = [], np.zeros(n, bool)
    for start in np.argsort(-degree, kind="stable"):
        if seen[start]:
            continue
        stack = [start]
        seen[start] = True
        while stack:
            i = stack.pop(0)
            order.append(int(i))
            for j in np.flatnonzero(A[i]):
                if not seen[j]:
                    seen[j] = True
                    stack.append(int(j))
    found = []
    image = -np.ones(n, int)
    used = np.zeros(n, bool)

    def extend(k):
        if k == n:
            found.append(image.copy())
            return
        i = order[k]
        for j in range(n):
            if used[j] or Z[j] != Z[i] or degree[j] != degree[i]:
                continue
            # Bonds to already-assigned atoms must map to bonds, non-bonds to non-bonds.
            if any(A[i, a] != A[j, image[a]] for a in order[:k]):
                continue
            image[i], used[j] = j, True
            extend(k + 1)
            image[i], used[j] = -1, False

    extend(0)
    # `image` maps atom i to atom image[i]; Invariant's convention is (g x)[i] = x[p[i]]: p = image.
    perms = np.unique(np.asarray(found), axis=0)
    ident = np.arange(n)
    perms = np.concatenate([ident[None], perms[~np.all(perms == ident, axis=1)]])
    if not coordinates:
        return perms
    return (3 * perms[:, :, None] + np.arange(3)).reshape(perms.shape[0], 3 * n)


def pair_orbits(permutations) -> np.ndarray:
    """The orbit of every atom pair under a group of atom permutations: which inverse
    distances (or any per-pair descriptor) a symmetry exchanges.

    A kernel on a per-pair descriptor with one lengthscale per pair (ARD) stays invariant
    under the group (`kernels.Invariant` then averages a kernel that the group maps onto
    itself) when the lengthscales of pairs in one orbit are equal: `lengthscale[orbits]`
    from one lengthscale per orbit. For ethanol's 12 permutations the 36 pairs fall into 17
    orbits (e.g. the three methyl C-H bonds are one).

    **Arguments:** `permutations`: `(G, n)` atom permutations, as
    `eqgp.molecular_permutations(..., coordinates=False)` returns (the group closure is
    taken: pairs linked by any chain of the given permutations share an orbit).

    **Returns:** `(n (n - 1) / 2,)` ints from 0 to the number of orbits minus one, one per
    pair `(i, j)`, `i < j`, in `np.triu_indices(n, k=1)` order, numbered by first
    appearance.
    """
    P = np.asarray(permutations)
    if P.ndim != 2 or not np.issubdtype(P.dtype, np.integer):
        raise ValueError(
            f"`permutations` must be a (G, n) int array of atom permutations; got shape {P.shape} of {P.dtype}."
        )
    n = P.shape[1]
    if not np.all(np.sort(P, axis=1) == np.arange(n)):
        raise ValueError(
            "`permutations`: every row must be a permutation of 0..n-1 (atom permutations, not coordinates)."
        )
    i, j = np.triu_indices(n, k=1)
    index = np.zeros((n, n), int)
    index[i, j] = index[j, i] = np.arange(i.size)
    parent = np.arange(i.size)

    def root(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for p in P:
        for a, b in zip(np.arange(i.size), index[p[i], p[j]]):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([root(a) for a in range(i.size)], dtype=int)
    return np.unique(roots, return_inverse=True)[1].astype(int)
