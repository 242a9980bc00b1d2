"""Partial pivoted Cholesky preconditioner (Gardner et al. 2018, as GPyTorch), built
matrix-free, applied with Woodbury.

`matfree.low_rank.cholesky_partial_pivot` reads the matrix one element at a time and
re-evaluates the whole diagonal at every step; an element of a derivative covariance costs
a nested autodiff expression, so here the diagonal comes once from `operator_diag` and each
pivot column is one `Covariance.kernel_column` (the covariance of one observation with all)."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def pivoted_cholesky(
    diag: Float[Array, " R"], column: Callable, rank: int
) -> tuple[Float[Array, "R r"], Float[Array, " R"]]:
    """`L` `(R, rank)` with `L L^T ~ K`, pivoting on the largest remaining diagonal entry,
    and the remaining diagonal `diag(K - L L^T)` (non-negative). Columns past the numerical
    rank of `K` are zero."""
    R = diag.shape[0]
    tiny = jnp.finfo(diag.dtype).eps * jnp.max(jnp.abs(diag), initial=0.0) * R

    def body(i, carry):
        L, d = carry
        k = jnp.argmax(d)
        pivot = d[k]
        ok = pivot > tiny
        col = column(k) - L @ L[k]
        lcol = jnp.where(ok, col / jnp.sqrt(jnp.where(ok, pivot, 1.0)), 0.0)
        L = L.at[:, i].set(lcol)
        d = jnp.maximum(d - lcol * lcol, 0.0).at[k].set(0.0)
        return L, d

    return jax.lax.fori_loop(0, rank, body, (jnp.zeros((R, rank), diag.dtype), diag))


class Woodbury(eqx.Module):
    """`P = diag(noise) + L L^T` and a square root `F` (`P = F F^T`), applied in `O(R r)`.

    With `M = noise^{-1/2} L = U S W^T` (thin SVD), `F = noise^{1/2} B` where
    `B = (I + M M^T)^{1/2} = I + U ((1 + S^2)^{1/2} - 1) U^T`."""

    sqrt_noise: Float[Array, " R"]
    U: Float[Array, "R r"]
    s2: Float[Array, " r"]

    def __init__(self, noise: Float[Array, " R"], L: Float[Array, "R r"]):
        self.sqrt_noise = jnp.sqrt(noise)
        U, s, _ = jnp.linalg.svd(L / self.sqrt_noise[:, None], full_matrices=False)
        self.U = U
        self.s2 = s * s

    def with_diagonal(self, diagonal: Float[Array, " R"]) -> "Woodbury":
        """`diag(diagonal) + L L^T`: the same low-rank part with another diagonal."""
        return Woodbury(diagonal, self.sqrt_noise[:, None] * self.U * jnp.sqrt(self.s2)[None, :])

    def _B(self, w, power):
        scale = (1.0 + self.s2) ** power - 1.0
        if w.ndim == 1:
            return w + self.U @ (scale * (self.U.T @ w))
        return w + self.U @ (scale[:, None] * (self.U.T @ w))

    def _noise(self, w):
        return self.sqrt_noise if w.ndim == 1 else self.sqrt_noise[:, None]

    def sqrt(self, w):
        """`F w`."""
        return self._noise(w) * self._B(w, 0.5)

    def inv_sqrt(self, w):
        """`F^{-1} w`."""
        return self._B(w / self._noise(w), -0.5)

    def inv_sqrt_t(self, w):
        """`F^{-T} w`."""
        return self._B(w, -0.5) / self._noise(w)

    def inv(self, w):
        """`P^{-1} w`."""
        return self._B(w / self._noise(w), -1.0) / self._noise(w)

    def inv_pieces(self):
        """`(d, A, B)` with `P^{-1} = diag(d) + A B^T`."""
        B = self.U / self.sqrt_noise[:, None]
        return 1.0 / self.sqrt_noise**2, B * (1.0 / (1.0 + self.s2) - 1.0)[None, :], B

    def logdet(self):
        return 2.0 * jnp.sum(jnp.log(self.sqrt_noise)) + jnp.sum(jnp.log1p(self.s2))
