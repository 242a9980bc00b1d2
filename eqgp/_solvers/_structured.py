"""Exact gradient-observation algebra in many input dimensions (de Roos et al. 2021).

For a stationary kernel `k(x, x') = v phi(s)`, `s = (x - x')^T L (x - x')` with `L =
diag(1 / lengthscale^2)`, the covariance of gradient observations at `N` points is

    K = L (x) B + Sigma (x) I + U C U^T,

in eqgp's component-major order (`(x)` the Kronecker product, component index outer):
`B_ab = -2 v phi'(s_ab)` (N x N), `Sigma` the per-component noise, and a correction of
rank `N^2` with `U[(p, a), (e, c)] = delta_ae (L x_c)_p` and the sparse `C` of
`c_ab = -4 v phi''(s_ab)` (at most four entries per row). With the eigendecomposition of
`B`, `A = L (x) B + Sigma (x) I` is diagonal in a known basis, and the Woodbury identity
leaves one dense `N^2 x N^2` system: time `O(N^2 D + N^6)` and memory `O(N D + N^4)`
instead of `O(N^3 D^3)` and `O(N^2 D^2)` (timings: docs/performance.md).

Other observations (values, or any other operator) add `M` rows, eliminated by a dense Schur
complement: `M` more structured solves and an `M x M` Cholesky.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

from .._covariance import Covariance
from .._gram import _operator_gram, check_smoothness
from .._jit import full_precision
from .._kernels import AbstractStationaryKernel
from .._linalg import cholesky
from .._operators import Gradient, Value, ValueAndGradient
from .._parameters import per_dimension
from ._abstract import AbstractSolver, AbstractSolverState, inv_quad_by_solves, log_marginal_likelihood_by_autodiff


# The N^2 x N^2 system S: factorised once (LU), and differentiated by hand so that reverse
# mode costs one solve with S^T (log det: S^{-T}; a solve: S^{-T} times the cotangent)
# instead of going back through the factorisation (several times slower).
@jax.custom_vjp
def _logdet(S, lu):
    return jnp.sum(jnp.log(jnp.abs(jnp.diagonal(lu[0]))))


def _logdet_fwd(S, lu):
    return _logdet(S, lu), lu


def _logdet_bwd(lu, g):
    eye = jnp.eye(lu[0].shape[0], dtype=lu[0].dtype)
    return g * jsl.lu_solve(lu, eye, trans=1), jax.tree.map(jnp.zeros_like, lu)


_logdet.defvjp(full_precision(_logdet_fwd), full_precision(_logdet_bwd))


@jax.custom_vjp
def _solve(S, lu, t):
    return jsl.lu_solve(lu, t)


def _solve_fwd(S, lu, t):
    u = jsl.lu_solve(lu, t)
    return u, (lu, u)


def _solve_bwd(res, g):
    lu, u = res
    lam = jsl.lu_solve(lu, g, trans=1)
    return -lam @ u.T, jax.tree.map(jnp.zeros_like, lu), lam


_solve.defvjp(full_precision(_solve_fwd), full_precision(_solve_bwd))


class _GradientBlock(eqx.Module):
    """The structured gradient block `A + U C U^T` (`N D` rows), factorised."""

    Q: Float[Array, "N N"]  # eigenvectors of B
    E: Float[Array, "D N"]  # 1 / (L_p lambda_i + sigma_p^2): A^{-1} in the eigenbasis
    Y: Float[Array, "D N"]  # L x_c, the columns of U
    c: Float[Array, "N N"]  # the weights of C (zero diagonal)
    S: Float[Array, "N2 N2"]  # I + W C, W = U^T A^{-1} U
    lu: tuple[Array, Array]  # its LU factors (not differentiated: see `_solve`)
    logdet: Float[Array, ""]

    def solve(self, B: Array) -> Array:
        """`K^{-1} B = A^{-1} B - A^{-1} U C S^{-1} U^T A^{-1} B` for `B` `(N D, k)`."""
        D, N = self.Y.shape
        if N * D == 0:
            return B
        k = B.shape[1]
        Z = _apply_A_inv(self, B.reshape(D, N, k))
        t = jnp.einsum("pc,pak->ack", self.Y, Z).reshape(N * N, k)
        u = _solve(self.S, self.lu, t).reshape(N, N, k)
        correction = jnp.einsum("pc,ack->pak", self.Y, _apply_C(self.c, u))
        return (Z - _apply_A_inv(self, correction)).reshape(D * N, k)


class _StructuredState(AbstractSolverState):
    block: _GradientBlock
    order: Array  # rows of K: the other observations' first, then the gradient block's
    cross: Array  # (N D, M) covariance of the gradient block with the M other rows
    Z: Array  # block^{-1} cross
    L: Array  # Cholesky factor of the Schur complement (M, M)
    logdet: Float[Array, ""]


def _apply_C(c: Array, Z: Array) -> Array:
    """`C z` for `z` indexed `(a, c)` (shape `(N, N, k)`), in `O(N^2 k)`:
    `(C z)[a, c] = c_ac (z[c, c] - z[c, a])` off the diagonal and
    `(C z)[a, a] = -sum_b c_ab (z[b, b] - z[b, a])`."""
    N = c.shape[0]
    zd = Z[jnp.arange(N), jnp.arange(N)]  # (N, k)
    T = c[:, :, None] * (zd[None, :, :] - jnp.swapaxes(Z, 0, 1))
    return T - jnp.eye(N, dtype=Z.dtype)[:, :, None] * jnp.sum(T, axis=1)[:, None, :]


def _apply_A_inv(block: _GradientBlock, Z: Array) -> Array:
    """`A^{-1} z` for `z` of shape `(D, N, k)` (component-major rows)."""
    R = jnp.einsum("ai,pak->pik", block.Q, Z) * block.E[:, :, None]
    return jnp.einsum("ai,pik->pak", block.Q, R)


def _inverse_squared_lengthscales(kernel: AbstractStationaryKernel, X: Array) -> Array:
    D = X.shape[1]
    point = jnp.zeros((D,), X.dtype)  # only its shape and dtype are read: X may have no rows
    return jnp.broadcast_to(1.0 / per_dimension("lengthscale", kernel.lengthscale, point) ** 2, (D,))


def _profile_derivative(kernel: AbstractStationaryKernel, s: Array, order: int) -> Array:
    """`phi'(s)` or `phi''(s)` of the kernel's profile, elementwise over `s`, by autodiff."""
    d = kernel.profile
    for _ in range(order):
        d = jax.grad(d)
    return jax.vmap(d)(s.reshape(-1)).reshape(s.shape)


def _squared_distances(lam: Array, X1: Array, X2: Array) -> Array:
    """`s_ab = sum_p lam_p (x1_ap - x2_bp)^2` from exact differences, one row at a time."""
    X2s = X2 * jnp.sqrt(lam)[None, :]
    return jax.lax.map(lambda x: jnp.sum((x[None, :] - X2s) ** 2, axis=-1), X1 * jnp.sqrt(lam)[None, :])


def _cross(kernel: AbstractStationaryKernel, X: Array, others) -> Array:
    """The covariance `(N D, M)` of the gradients at `X` with the other observations. Values in
    closed form, `2 v phi'(s_ab) lam_p (x_ap - z_bp)` (`O(N M D)`, no derivative arrays);
    other operators by `operator_gram`, with the gradient on the column side (forward mode),
    which kept the least memory in the likelihood's reverse pass."""
    N, D = X.shape
    lam = _inverse_squared_lengthscales(kernel, X)
    v = kernel.variance.astype(X.dtype)
    blocks = []
    for op, Z in others:
        if type(op) is Value:
            d1 = _profile_derivative(kernel, _squared_distances(lam, X, Z), 1)  # (N, M)
            diff = lam[:, None, None] * (X.T[:, :, None] - Z.T[:, None, :])  # (D, N, M)
            blocks.append((2.0 * v * d1[None] * diff).reshape(D * N, Z.shape[0]))
        else:
            blocks.append(_operator_gram(kernel, [(op, Z)], [(Gradient(), X)]).T)
    return jnp.concatenate(blocks, axis=1)


def _gradient_block(kernel: AbstractStationaryKernel, X: Array, noise: Array) -> _GradientBlock:
    """Factorise the covariance of gradient observations at `X` `(N, D)` plus `noise` `(D N,)`."""
    N, D = X.shape
    dtype = noise.dtype
    if N == 0 or D == 0:  # no rows
        z, e = jnp.zeros((0, 0), dtype), jnp.zeros((D, N), dtype)
        return _GradientBlock(z, e, e, z, z, (z, jnp.zeros(0, jnp.int32)), jnp.zeros((), dtype))
    lam = _inverse_squared_lengthscales(kernel, X)
    v = kernel.variance.astype(dtype)
    noise = noise.reshape(D, N)
    sigma2 = noise[:, 0]
    sigma2 = eqx.error_if(
        sigma2,
        jnp.any(jnp.max(noise, axis=1) > jnp.min(noise, axis=1)),
        "eqgp.StructuredGradients needs the same noise for every point of a gradient component "
        "(no known noise per target).",
    )
    Y = lam[:, None] * X.T  # (D, N)
    s = _squared_distances(lam, X, X) * (1.0 - jnp.eye(N, dtype=dtype))  # exactly 0 on the diagonal
    B = -2.0 * v * _profile_derivative(kernel, s, 1)
    c = -4.0 * v * _profile_derivative(kernel, s, 2)
    c = jnp.where(jnp.eye(N, dtype=bool), 0.0, c)  # a point with itself adds nothing
    lamB, Q = jnp.linalg.eigh(0.5 * (B + B.T))
    E = 1.0 / (lam[:, None] * lamB[None, :] + sigma2[:, None])  # (D, N)
    # W[(e, c), (f, d)] = sum_i Q_ei Q_fi G_i[c, d],  G_i = Y^T diag(E[:, i]) Y.
    G = jax.lax.map(lambda e: (Y * e[:, None]).T @ Y, E.T)  # (N_i, N, N)
    QQ = (Q[:, None, :] * Q[None, :, :]).reshape(N * N, N)  # ((e, f), i)
    W = (QQ @ G.reshape(N, N * N)).reshape(N, N, N, N).transpose(0, 2, 1, 3).reshape(N * N, N * N)
    CW = _apply_C(c, W.reshape(N, N, N * N)).reshape(N * N, N * N)
    S = jnp.eye(N * N, dtype=dtype) + CW.T  # I + W C, as W and C are symmetric
    lu = jax.lax.stop_gradient(jsl.lu_factor(S))
    logdet = -jnp.sum(jnp.log(E)) + _logdet(S, lu)
    return _GradientBlock(Q, E, Y, c, S, lu, logdet)


def _split_groups(groups):
    """The gradient group's points, its row indices, and the other rows as `(operator, X)`
    pairs with their row indices (in the covariance's order)."""
    kinds = [type(op) for op, _ in groups]
    grad = [h for h, t in enumerate(kinds) if t in (Gradient, ValueAndGradient)]
    if len(grad) != 1:
        names = ", ".join(t.__name__ for t in kinds)
        raise ValueError(
            "eqgp.StructuredGradients needs exactly one group of `eqgp.Gradient` (or "
            f"`eqgp.ValueAndGradient`) observations; got groups of: {names or 'none'}. "
            "Use `eqgp.Cholesky()` or `eqgp.ConjugateGradient()`."
        )
    others, other_rows, start = [], [], 0
    for h, (op, X) in enumerate(groups):
        N, D = X.shape
        n = op.size(D) * N
        if h == grad[0]:
            values = N if kinds[h] is ValueAndGradient else 0
            if values:
                others.append((Value(), X))
                other_rows.append(np.arange(start, start + N))
            X_grad, grad_rows = X, np.arange(start + values, start + n)
        else:
            others.append((op, X))
            other_rows.append(np.arange(start, start + n))
        start += n
    other_rows = np.concatenate(other_rows) if other_rows else np.zeros(0, int)
    return X_grad, grad_rows, others, other_rows


class StructuredGradients(AbstractSolver[_StructuredState]):
    """Exact solver for gradient observations in many input dimensions.

    For one group of `eqgp.Gradient` (or `eqgp.ValueAndGradient`) observations with a stationary kernel (`RBF`,
    `RationalQuadratic`, `Matern32`, `Matern52`, or any `kernels.AbstractStationaryKernel`;
    scalar or ARD lengthscales) and a noise that is the same for every point of a
    component, the covariance is a Kronecker product plus a correction of rank `N^2`
    (de Roos, Gessner & Hennig, "High-dimensional Gaussian process inference with
    derivatives", ICML 2021). This solver uses that structure: time `O(N^2 D + N^6)`,
    memory `O(N D + N^4)`, exact in every dimension `D` — the choice when the number of
    points is small (up to ~100) and `D` is large (`N D` beyond what `Cholesky` fits).
    Where `D < N` the dense `Cholesky` is cheaper. Other observation groups (values at the
    same or other points, partial derivatives, ...) add `M` rows, eliminated exactly by a
    dense Schur complement (`M` structured solves, an `M x M` Cholesky, and their `N D x M`
    covariance with the gradients), so keep them to a few hundred rows.

    The likelihood's gradient is plain reverse-mode autodiff through the structured
    algebra (an eigendecomposition of an `N x N` matrix and an LU factorisation of an
    `N^2 x N^2` one), so points must be distinct enough for `B`'s eigenvalues to differ.
    It cannot extend a factorisation (`Posterior.update`): condition afresh.
    """

    def init(self, cov: Covariance, key=None) -> _StructuredState:
        kernel = cov.kernel
        if not isinstance(kernel, AbstractStationaryKernel):
            raise TypeError(
                "eqgp.StructuredGradients needs a stationary kernel `variance * profile(s)` "
                f"(`kernels.AbstractStationaryKernel`: RBF, Matern32/52, RationalQuadratic); got "
                f"{type(kernel).__name__}. Use `eqgp.Cholesky()` or `eqgp.ConjugateGradient()`."
            )
        check_smoothness(kernel, *(op for op, _ in cov.groups))
        X, grad_rows, others, other_rows = _split_groups(cov.groups)
        block = _gradient_block(kernel, X, cov.noise[grad_rows])
        order = jnp.asarray(np.concatenate([other_rows, grad_rows]), jnp.int32)
        M, dtype = len(other_rows), cov.dtype
        if M == 0:
            z = jnp.zeros((len(grad_rows), 0), dtype)
            return _StructuredState(block, order, z, z, jnp.zeros((0, 0), dtype), block.logdet)
        # K = [[K_oo, cross^T], [cross, block]]: the Schur complement K_oo - cross^T block^{-1} cross.
        K_oo = _operator_gram(kernel, others, others) + jnp.diag(cov.noise[other_rows])
        cross = _cross(kernel, X, others)
        Z = block.solve(cross)
        schur = K_oo - cross.T @ Z
        L = cholesky(0.5 * (schur + schur.T), 0.0)
        logdet = block.logdet + 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))
        return _StructuredState(block, order, cross, Z, L, logdet)

    def solve(self, state: _StructuredState, B):
        vec = B.ndim == 1
        B2 = (B[:, None] if vec else B)[state.order]
        M = state.cross.shape[1]
        w = state.block.solve(B2[M:])
        if M:
            x_o = jsl.cho_solve((state.L, True), B2[:M] - state.cross.T @ w)
            out = jnp.concatenate([x_o, w - state.Z @ x_o])
        else:
            out = w
        out = jnp.zeros_like(out).at[state.order].set(out)
        return out[:, 0] if vec else out

    def logdet(self, state: _StructuredState):
        return state.logdet

    def log_marginal_likelihood(self, cov, residual, key=None, profile=False):
        # The structured algebra is plain differentiable JAX: autodiff goes straight through.
        return log_marginal_likelihood_by_autodiff(self, cov, residual, key, profile)

    def for_prediction(self, state):
        return state

    def inv_quad(self, state, B, diagonal):
        return inv_quad_by_solves(self, state, B, diagonal)

    def extend(self, state, alpha, cov, residual, key=None):
        raise TypeError(
            "eqgp.StructuredGradients cannot extend its factorisation with more observations "
            "(`Posterior.update`): condition afresh with `gp.condition(all_observations)`, or use "
            "eqgp.Cholesky() / eqgp.ConjugateGradient(), which update."
        )
