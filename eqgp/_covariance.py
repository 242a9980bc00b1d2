"""The observation covariance as a linear operator: `K(kernel, groups) + diag(noise)`.

Dense solvers ask for `as_matrix()`; matrix-free ones only ever call `mv` (a tiled product
that never forms the matrix), `diagonal` and `column`. The likelihood's backward pass hands
its cotangent to `pullback` as a sum of rank-1 pieces, so no solver needs a dense cotangent.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from ._gram import _symmetric_pullback, check_smoothness, operator_diag, operator_gram
from ._kernels import AbstractKernel, scalar_call
from ._operators import AbstractOperator

Groups = tuple[tuple[AbstractOperator, Float[Array, "_ _"]], ...]

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
    """The covariance of groups of linear observations plus their noise, as a linear operator.

    `K = operator_gram(kernel, groups, groups) + diag(noise)`, of size `R x R` with
    `R = sum_g P_g N_g` in the component-major order of `eqgp.operator_gram`. Built by
    `GaussianProcess`; solvers use it through `mv`, `diagonal`, `column` and `as_matrix`.

    **Fields:**

    - `kernel`: the kernel.
    - `groups`: `(operator, X)` pairs.
    - `noise`: the diagonal noise, shape `(R,)`.
    - `tile_bytes`: memory budget of one tile of the matrix-free product.
    - `shard`: split the product's row tiles over `jax.devices()` (`jax.sharding`).
    """

    kernel: AbstractKernel
    groups: Groups
    noise: Float[Array, " R"]
    tile_bytes: int = eqx.field(static=True, default=2**28)
    shard: bool = eqx.field(static=True, default=False)

    @property
    def size(self) -> int:
        return int(sum(_sizes(self.groups)))

    @property
    def dtype(self):
        return self.noise.dtype

    def with_tile_bytes(self, tile_bytes: int) -> "Covariance":
        """The same operator with another tile budget (e.g. divided by a batch size under `vmap`)."""
        return dataclasses.replace(self, tile_bytes=max(1, int(tile_bytes)))

    def as_matrix(self) -> Float[Array, "R R"]:
        """The dense `R x R` matrix (the dense path: memory `R^2`)."""
        K = operator_gram(self.kernel, list(self.groups), list(self.groups))
        return K + jnp.diag(self.noise)

    def mv(self, V: Float[Array, "R ..."]) -> Float[Array, "R ..."]:
        """`K @ V` without forming `K`: peak memory about `tile_bytes` plus `O(R k)`."""
        vec = V.ndim == 1
        V2 = V[:, None] if vec else V
        out = _product(self.kernel, self.groups, self.groups, V2, self.tile_bytes, self.shard)
        out = out + self.noise[:, None] * V2
        return out[:, 0] if vec else out

    def cross_mv(self, operator: AbstractOperator, X: Float[Array, "N D"], v: Float[Array, " R"]) -> Array:
        """`operator_gram(kernel, (operator, X), groups) @ v`, tiled like `mv`: shape `(P N,)`
        (the posterior mean at new points without forming the cross-covariance)."""
        return _product(self.kernel, ((operator, X),), self.groups, v[:, None], self.tile_bytes, self.shard)[:, 0]

    def diagonal(self) -> Float[Array, " R"]:
        """The diagonal of `K` (noise included)."""
        d = [operator_diag(self.kernel, op, X) for op, X in self.groups]
        return jnp.concatenate(d) + self.noise

    def kernel_diagonal(self) -> Float[Array, " R"]:
        """The diagonal of the noise-free part `operator_gram(kernel, groups, groups)`."""
        return self.diagonal() - self.noise

    def kernel_column(self, index: Array) -> Float[Array, " R"]:
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
                return _product(self.kernel, self.groups, ((op, x),), v, self.tile_bytes, self.shard)[:, 0]

            branches.append(branch)
        if len(branches) == 1:
            return branches[0](index)
        group = jnp.searchsorted(jnp.asarray(offsets[1:]), index, side="right")
        return jax.lax.switch(group, branches, index)

    def pullback(
        self, U: Float[Array, "R k"], V: Float[Array, "R k"] | None = None, d: Float[Array, " R"] | None = None
    ) -> "Covariance":
        """The gradient of `sum_i U[:, i]^T K V[:, i] = <K, U V^T>` with respect to every
        inexact array in this operator (kernel hyper-parameters, points, noise): the
        likelihood's backward pass, with its cotangent given as rank-1 pieces.

        `V=None` means the identity (`k = R`): `U` is then the dense cotangent itself and
        the pullback visits each symmetric pair of points once (the dense path). Otherwise
        the pullback is the reverse pass of the tiled product (matrix-free). A diagonal
        weight `d` adds `<K, diag(d)>` (through `diagonal`, `O(R)`)."""
        if V is None:
            W = 0.5 * (U + U.T)

            def scalar(c):
                k = _symmetric_pullback(c.kernel, c.groups, W)
                return k + jnp.sum(c.noise * jnp.diagonal(W))

        else:

            def scalar(c):
                return jnp.sum(U * c.mv(V))

        if d is None:
            return eqx.filter_grad(scalar)(self)
        return eqx.filter_grad(lambda c: scalar(c) + jnp.sum(d * c.diagonal()))(self)
