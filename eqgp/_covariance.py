"""The observation covariance as a linear map: `K(kernel, groups) + diag(noise)`.

("Operator" in eqgp means an observation functional such as `eqgp.Gradient()`; the
covariance is called a linear map.) Dense solvers ask for `as_matrix()`; matrix-free ones
only ever call `mv` (a tiled product that never forms the matrix), `kernel_diagonal` and
`kernel_column`, passing their own tiling settings. The likelihood's backward pass hands its
cotangent to `pullback`, densely or as a sum of rank-1 pieces.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from ._gram import _block, _operator_diag, _operator_gram, _structured_cross, check_smoothness
from ._kernels import AbstractKernel, scalar_call
from ._operators import AbstractOperator

Groups = tuple[tuple[AbstractOperator, Float[Array, "_ _"]], ...]

#: Default memory budget of one tile of a matrix-free product (bytes).
TILE_BYTES = 2**28

# Up to this size (bytes) the dense matrix is built in one piece, and the dense pullback
# visits its pairs in one piece: compile time matters more than memory there.
_SMALL_BYTES = 2**24

# Bytes of intermediate values one row point of a tile keeps per column point, input
# dimension and right-hand side (primal, tangent and the reverse pass's residuals).
_BYTES_PER_ENTRY = 64


def _sizes(groups: Groups) -> list[int]:
    return [op.size(X.shape[1]) * X.shape[0] for op, X in groups]


def _split(V: Array, groups: Groups) -> list[Array]:
    """Rows of `V` `(R, k)` per group, as `(k, M, P)` (the layout the pair contraction maps)."""
    out, start = [], 0
    for (op, X), n in zip(groups, _sizes(groups)):
        P, M = op.size(X.shape[1]), X.shape[0]
        out.append(V[start : start + n].reshape(P, M, V.shape[1]).transpose(2, 1, 0))
        start += n
    return out


def _slab_budget(R: int, itemsize: int) -> int:
    """Default bytes of one slab (or pullback chunk): an eighth of the matrix, 1 to 64 MiB."""
    return int(min(max(R * R * itemsize // 8, 2**20), 2**26))


def _slab_rows(R: int, P: int, N: int, itemsize: int, slab_bytes: int | None) -> int:
    """Points per slab of `P` components against `R` columns."""
    if slab_bytes is None:
        slab_bytes = _slab_budget(R, itemsize)
    return int(min(N, max(1, slab_bytes // max(1, P * R * itemsize))))


def _dense(kernel, groups: Groups, noise: Array, slab_bytes: int | None) -> Array:
    """`K(kernel, groups) + diag(noise)`, slab by slab into one buffer (`as_matrix`)."""
    sizes = _sizes(groups)
    R = int(sum(sizes))
    dtype = noise.dtype
    if slab_bytes is None and R * R * jnp.dtype(dtype).itemsize <= _SMALL_BYTES:
        # Small: one piece (a simpler program to compile; the memory does not matter).
        return _operator_gram(kernel, groups, groups) + jnp.diag(noise)
    K = jnp.zeros((R, R), dtype)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    for g, (op, X) in enumerate(groups):
        N, D = X.shape
        P = op.size(D)
        if N == 0 or P == 0:
            continue
        t = _slab_rows(R, P, N, jnp.dtype(dtype).itemsize, slab_bytes)
        # The last slab starts at N - t (it overlaps the one before rather than running past
        # the group): every slab has one shape, and rows written twice are equal.
        starts = jnp.minimum(jnp.arange(-(-N // t)) * t, N - t)

        def write(K, start, op=op, X=X, g=g, N=N, P=P, t=t):
            Xt = jax.lax.dynamic_slice_in_dim(X, start, t)
            slab = _operator_gram(kernel, ((op, Xt),), groups).reshape(P, t, R)

            def component(p, K):  # component p's rows of these points: contiguous
                first = offsets[g] + p * N + start
                rows = first + jnp.arange(t)  # their diagonal entries get the noise here
                block = slab[p].at[jnp.arange(t), rows].add(noise[rows])
                return jax.lax.dynamic_update_slice(K, block, (first, 0))

            # A loop, not P unrolled copies: with gradients in D = 27 the unrolled writes
            # took ~130 MB more memory to compile than the matrix they build (2 700 rows).
            return jax.lax.fori_loop(0, P, component, K), None

        K, _ = jax.lax.scan(write, K, starts)
    return K


def _row_function(kernel, op1: AbstractOperator, cols: Groups):
    """`(x, vs) -> (P1,)`: row point `x`'s outputs of the product with one right-hand side.

    Each column point's operator is contracted with its slice of the vector by one
    forward-mode product (`contract`), the sum over all column points is a scalar function
    of `x`, and the row operator differentiates that sum (reverse mode for gradients), so a
    pair costs a small multiple of one kernel evaluation whatever the operators are."""

    k = scalar_call(kernel)

    def row(x, vs):
        def summed(a):
            total = jnp.zeros((), x.dtype)
            for (op2, X2), v in zip(cols, vs):
                terms = jax.vmap(lambda xj, vj, op2=op2: op2.contract(lambda b: k(a, b), xj, vj))(X2, v)
                total = total + jnp.sum(terms)
            return total

        return op1.apply(summed, x)

    return row


def _devices(shard: bool):
    devices = jax.devices()
    return devices if shard and len(devices) > 1 else None


def _product(kernel, rows: Groups, cols: Groups, V: Array, tile_bytes: int, shard: bool = False) -> Array:
    """`operator_gram(kernel, rows, cols) @ V` for `V` `(R_cols, k)`, tile by tile.

    Row points go through `lax.map` in tiles sized from `tile_bytes`; each tile's forward pass
    is rematerialised in the backward pass (`jax.checkpoint`), so reverse mode keeps one tile's
    intermediates at a time too. With several devices the tiles are split across them with
    `jax.sharding` (`shard=True`: the tiles' leading axis sharded over `jax.devices()`)."""
    check_smoothness(kernel, *(op for op, _ in rows), *(op for op, _ in cols))
    k = V.shape[1]
    vs = _split(V, cols)
    nonempty = [i for i, (op, X) in enumerate(cols) if X.shape[0] and op.size(X.shape[1])]
    cols, vs = tuple(cols[i] for i in nonempty), [vs[i] for i in nonempty]
    M = sum(X.shape[0] for _, X in cols)
    D = rows[0][1].shape[1]
    per_row = max(1, M * (D + 1) * k * _BYTES_PER_ENTRY)
    devices = _devices(shard)
    ndev = 1 if devices is None else len(devices)
    outs = []
    for op1, X1 in rows:
        N, P = X1.shape[0], op1.size(D)
        if N == 0 or P == 0 or M == 0:
            outs.append(jnp.zeros((N * P, k), V.dtype))
            continue
        T = int(min(max(1, tile_bytes // per_row), -(-N // ndev)))
        ntiles = -(-N // (T * ndev)) * ndev
        # Pad with copies of the first point (finite, unlike zeros for some warps).
        Xp = jnp.concatenate([X1, jnp.broadcast_to(X1[:1], (ntiles * T - N, D))]).reshape(ntiles, T, D)
        # Everything the tiles read goes in as an argument rather than a closure, so the
        # sharded path can map it as one replicated input.
        dynamic, static = eqx.partition((kernel, op1, cols), eqx.is_array)

        @jax.checkpoint
        def tile(Xt, vs, dynamic, static=static):
            kern, op, cs = eqx.combine(dynamic, static)
            per_rhs = jax.vmap(_row_function(kern, op, cs), in_axes=(None, 0), out_axes=1)  # over RHS
            return jax.vmap(per_rhs, in_axes=(0, None))(Xt, vs)  # (T, P, k)

        def tiles(Xp, vs, dynamic):
            return jax.lax.map(lambda Xt: tile(Xt, vs, dynamic), Xp)

        if devices is None:
            out = tiles(Xp, vs, dynamic)
        else:
            # One slice of tiles per device: the leading axis is sharded over the devices and
            # XLA's SPMD partitioner runs each device's slice where it lives.
            mesh = jax.sharding.Mesh(np.asarray(devices), ("tiles",))
            Xd = jax.lax.with_sharding_constraint(
                Xp.reshape(ndev, ntiles // ndev, T, D), NamedSharding(mesh, PartitionSpec("tiles"))
            )
            out = jax.vmap(tiles, in_axes=(0, None, None))(Xd, vs, dynamic)
            out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec("tiles")))
        out = out.reshape(ntiles * T, P, k)[:N]
        outs.append(out.transpose(1, 0, 2).reshape(P * N, k))
    return jnp.concatenate(outs, axis=0)


class Covariance(eqx.Module):
    """The covariance of groups of linear observations plus their noise, as a linear map.

    `K = operator_gram(kernel, groups, groups) + diag(noise)`, of size `R x R` with
    `R = sum_g P_g N_g` in the component-major order of `eqgp.operator_gram`. Built by
    `GaussianProcess`; solvers use it through `as_matrix` (dense) or `mv`,
    `kernel_diagonal` and `kernel_column` (matrix-free, with the solver's own tiling:
    `tile_bytes`, the memory budget of one tile, and `shard`, the tiles split over
    `jax.devices()` with `jax.sharding`).

    **Fields:**

    - `kernel`: the kernel.
    - `groups`: `(operator, X)` pairs.
    - `noise`: the diagonal noise, shape `(R,)`.
    """

    kernel: AbstractKernel
    groups: Groups
    noise: Float[Array, " R"]

    @property
    def size(self) -> int:
        return int(sum(_sizes(self.groups)))

    @property
    def dtype(self):
        return self.noise.dtype

    def as_matrix(self, *, slab_bytes: int | None = None) -> Float[Array, "R R"]:
        """The dense `R x R` matrix (the dense path: memory `R^2`).

        Built in slabs of rows written into one buffer (a scan of in-place updates), so the
        matrix is the only covariance-sized value: a slab of `P` components of a tile of
        points against all columns holds about `slab_bytes` (by default an eighth of the
        matrix, between 1 and 64 MiB) plus the kernel's intermediates for those pairs."""
        return _dense(self.kernel, self.groups, self.noise, slab_bytes)

    def leading_rows(self, max_rows: int) -> np.ndarray:
        """The rows of the first points of every group (all their rows), at most about
        `max_rows` of them: the indices of a principal submatrix, whose lowest eigenvalue
        bounds the whole matrix's from above (Cauchy interlacing)."""
        R = self.size
        if R <= max_rows:
            return np.arange(R)
        rows, start = [], 0
        for op, X in self.groups:
            N, P = X.shape[0], op.size(X.shape[1])
            n = min(N, -(-N * max_rows // R))
            rows.append((start + np.arange(P)[:, None] * N + np.arange(n)).reshape(-1))
            start += P * N
        return np.concatenate(rows)

    def trailing_rows(self, start: int) -> Float[Array, "R2 R"]:
        """The dense rows from row `start` on (a group boundary) against all columns, noise
        included: the new rows when observations are appended."""
        offsets = np.cumsum([0, *_sizes(self.groups)])
        if start not in offsets:
            raise ValueError(f"row {start} is not the first row of an observation group (offsets {offsets}).")
        g = int(np.searchsorted(offsets, start))
        rows = _operator_gram(self.kernel, self.groups[g:], self.groups)
        R2 = rows.shape[0]
        return rows.at[:, start:].add(jnp.diag(self.noise[start:])) if R2 else rows

    def mv(
        self, V: Float[Array, "R ..."], *, tile_bytes: int = TILE_BYTES, shard: bool = False
    ) -> Float[Array, "R ..."]:
        """`K @ V` without forming `K`: peak memory about `tile_bytes` plus `O(R k)`."""
        vec = V.ndim == 1
        V2 = V[:, None] if vec else V
        out = _product(self.kernel, self.groups, self.groups, V2, tile_bytes, shard)
        out = out + self.noise[:, None] * V2
        return out[:, 0] if vec else out

    def cross_mv(
        self,
        operator: AbstractOperator,
        X: Float[Array, "N D"],
        v: Float[Array, " R"],
        *,
        tile_bytes: int = TILE_BYTES,
        shard: bool = False,
    ) -> Array:
        """`operator_gram(kernel, (operator, X), groups) @ v`, tiled like `mv`: shape `(P N,)`
        (the posterior mean at new points without forming the cross-covariance)."""
        return _product(self.kernel, ((operator, X),), self.groups, v[:, None], tile_bytes, shard)[:, 0]

    def kernel_diagonal(self) -> Float[Array, " R"]:
        """The diagonal of the noise-free part `operator_gram(kernel, groups, groups)`."""
        if not self.groups:
            return jnp.zeros((0,), self.dtype)
        return jnp.concatenate([_operator_diag(self.kernel, op, X) for op, X in self.groups])

    def diagonal(self) -> Float[Array, " R"]:
        """The diagonal of `K` (noise included)."""
        return self.kernel_diagonal() + self.noise

    def kernel_column(self, index: Array, *, tile_bytes: int = TILE_BYTES, shard: bool = False) -> Float[Array, " R"]:
        """Column `index` (a traced integer) of the noise-free part, from the covariance of one
        observation with all others: `O(R)` pair evaluations."""
        sizes = _sizes(self.groups)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        branches = []
        for h, (op, X) in enumerate(self.groups):
            P, M = op.size(X.shape[1]), X.shape[0]

            def branch(index, h=h, op=op, X=X, P=P, M=M):
                if M == 0 or P == 0:  # never selected
                    return jnp.zeros((self.size,), self.dtype)
                local = index - offsets[h]
                p, j = local // M, local % M
                x = jax.lax.dynamic_slice_in_dim(X, j, 1)
                v = jax.nn.one_hot(p, P, dtype=self.dtype)[:, None]
                return _product(self.kernel, self.groups, ((op, x),), v, tile_bytes, shard)[:, 0]

            branches.append(branch)
        if len(branches) == 1:
            return branches[0](index)
        group = jnp.searchsorted(jnp.asarray(offsets[1:]), index, side="right")
        return jax.lax.switch(group, branches, index)

    def pullback(
        self,
        U: Float[Array, "R k"],
        V: Float[Array, "R k"] | None = None,
        d: Float[Array, " R"] | None = None,
        *,
        tile_bytes: int = TILE_BYTES,
        shard: bool = False,
    ) -> "Covariance":
        """The gradient of `sum_i U[:, i]^T K V[:, i] = <K, U V^T>` with respect to every
        inexact array in this covariance (kernel hyper-parameters, points, noise): the
        likelihood's backward pass, with its cotangent given as rank-1 pieces.

        `V=None` means the identity (`k = R`): `U` is then the dense cotangent itself and
        the pullback visits each symmetric pair of points once (the dense path). Otherwise
        the pullback is the reverse pass of the tiled product (matrix-free). A diagonal
        weight `d` adds `<K, diag(d)>` (through `diagonal`, `O(R)`)."""
        if V is None:
            return self.symmetric_pullback(0.5 * (U + U.T), d=d)
        else:

            def scalar(c):
                return jnp.sum(U * c.mv(V, tile_bytes=tile_bytes, shard=shard))

        if d is None:
            return eqx.filter_grad(scalar)(self)
        return eqx.filter_grad(lambda c: scalar(c) + jnp.sum(d * c.diagonal()))(self)

    def symmetric_pullback(
        self,
        W: Float[Array, "R R"],
        scale: float = 1.0,
        u: Float[Array, " R"] | None = None,
        d: Float[Array, " R"] | None = None,
    ) -> "Covariance":
        """The gradient of `<K, scale W + u u^T + diag(d)>` for a symmetric `W` (not
        checked; only its upper triangle of point pairs is read), each symmetric pair of
        points visited once. `scale` and `u` never form a matrix: the likelihood's cotangent
        `(alpha alpha^T - K^{-1}) / 2` is pulled back from `K^{-1}` as LAPACK left it, so the
        backward pass holds one matrix, not two."""

        def scalar(c):
            k = _symmetric_pullback(c.kernel, c.groups, W, scale=scale, u=u)
            diag = scale * jnp.diagonal(W) + (0.0 if u is None else u * u)
            out = k + jnp.sum(c.noise * diag)
            return out if d is None else out + jnp.sum(d * c.diagonal())

        return eqx.filter_grad(scalar)(self)


def _pair_indices(N: int, M: int, same: bool):
    """Rows, columns and weights of the point pairs a symmetric pullback visits: the upper
    triangle of a diagonal block (off-diagonal pairs count twice), every pair of an
    off-diagonal block (counted twice for its mirror image)."""
    if same:
        i, j = np.triu_indices(N)
        w = np.where(i == j, 1.0, 2.0)
    else:
        i, j = (a.reshape(-1) for a in np.meshgrid(np.arange(N), np.arange(M), indexing="ij"))
        w = np.full(i.shape, 2.0)
    return i, j, w


def _symmetric_pullback(kernel, groups, W, chunk_bytes: int | None = None, scale=1.0, u=None) -> Array:
    """`<scale W + u u^T, K(kernel, groups)>` for a symmetric `W`, visiting each pair of
    points once (`u u^T` is never formed: each chunk's part of it is).

    K is symmetric, so its pullback needs only the block pairs on and above the diagonal.
    The pairs go in chunks (a scan, each chunk rematerialised in the backward pass), so
    the reverse pass keeps one chunk's intermediates, not every pair's: about `chunk_bytes`
    of blocks (by default as a slab of `as_matrix`). A kernel with a structured gram (a
    warp, a group average) takes that path, in slabs of rows."""
    sizes = _sizes(groups)
    R = int(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    total = jnp.zeros((), W.dtype)
    itemsize = jnp.dtype(W.dtype).itemsize
    whole = chunk_bytes is None and R * R * itemsize <= _SMALL_BYTES  # small: one piece
    for g, (op1, X1) in enumerate(groups):
        for h in range(g, len(groups)):
            op2, X2 = groups[h]
            N, M, D = X1.shape[0], X2.shape[0], X1.shape[1]
            P1, P2 = op1.size(D), op2.size(D)
            if N == 0 or M == 0 or P1 == 0 or P2 == 0:
                continue
            block = W[offsets[g] : offsets[g + 1], offsets[h] : offsets[h + 1]].reshape(P1, N, P2, M)
            u1 = None if u is None else u[offsets[g] : offsets[g + 1]].reshape(P1, N)
            u2 = None if u is None else u[offsets[h] : offsets[h + 1]].reshape(P2, M)
            weight = 1.0 if g == h else 2.0
            if _structured_cross(kernel, op1, X1[:1], op2, X2[:1], "blocked") is not None:
                # A structured gram (eqgp._gram) by slabs of rows: every pair of the block.
                t = N if whole else _slab_rows(R, P1, N, itemsize, chunk_bytes)
                starts = jnp.minimum(jnp.arange(-(-N // t)) * t, N - t)
                # Rows a slab shares with the one before (the last slab overlaps) count once.
                first = np.minimum(np.arange(-(-N // t)) * t, N - t)
                fresh = np.maximum(0, np.concatenate([[0], first[:-1] + t]) - first)

                @jax.checkpoint
                def slab(
                    start, skip, X1=X1, op1=op1, op2=op2, X2=X2, block=block, t=t, P1=P1, P2=P2, M=M, u1=u1, u2=u2
                ):
                    Xt = jax.lax.dynamic_slice_in_dim(X1, start, t)
                    gram = _structured_cross(kernel, op1, Xt, op2, X2, "blocked").reshape(P1, t, P2, M)
                    Wt = scale * jax.lax.dynamic_slice_in_dim(block, start, t, axis=1)
                    if u1 is not None:
                        Wt = Wt + jax.lax.dynamic_slice_in_dim(u1, start, t, axis=1)[:, :, None, None] * u2[None, None]
                    keep = (jnp.arange(t) >= skip).astype(W.dtype)[None, :, None, None]
                    return jnp.sum(keep * Wt * gram)

                def body(acc, a, slab=slab):
                    return acc + slab(*a), None

                if len(fresh) == 1:
                    part = slab(starts[0], jnp.asarray(fresh[0]))
                else:
                    part, _ = jax.lax.scan(body, jnp.zeros((), W.dtype), (starts, jnp.asarray(fresh)))
                total = total + weight * part
                continue
            i, j, w = _pair_indices(N, M, g == h)
            per_pair = P1 * P2 * itemsize * 4  # the block, its cotangent and the gathered W
            budget = chunk_bytes if chunk_bytes is not None else _slab_budget(R, itemsize)
            c = len(i) if whole else int(min(len(i), max(1, budget // per_pair)))
            n = -(-len(i) // c)
            pad = n * c - len(i)  # padded with weight-0 pairs
            i = np.concatenate([i, np.zeros(pad, i.dtype)]).reshape(n, c)
            j = np.concatenate([j, np.zeros(pad, j.dtype)]).reshape(n, c)
            w = np.concatenate([w, np.zeros(pad)]).reshape(n, c)
            pair = _block(kernel, op1, op2)

            @jax.checkpoint
            def chunk(ijw, X1=X1, X2=X2, block=block, pair=pair, u1=u1, u2=u2):
                i, j, w = ijw
                Wp = scale * block[:, i, :, j]  # (c, P1, P2): the advanced indices go first
                if u1 is not None:
                    Wp = Wp + u1[:, i].T[:, :, None] * u2[:, j].T[:, None, :]
                blocks = eqx.filter_vmap(pair)(X1[i], X2[j])
                return jnp.sum(w.astype(W.dtype)[:, None, None] * blocks * Wp)

            def body(acc, ijw, chunk=chunk):
                return acc + chunk(ijw), None

            if n == 1:
                part = chunk((jnp.asarray(i[0]), jnp.asarray(j[0]), jnp.asarray(w[0])))
            else:
                part, _ = jax.lax.scan(body, jnp.zeros((), W.dtype), (jnp.asarray(i), jnp.asarray(j), jnp.asarray(w)))
            total = total + part
    return total
