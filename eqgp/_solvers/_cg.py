import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import matfree.decomp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._covariance import Covariance
from ._abstract import AbstractPullbackSolver, AbstractSolverState, inv_quad_by_solves
from ._preconditioner import Woodbury, pivoted_cholesky


class _CGState(AbstractSolverState):
    cov: Covariance
    preconditioner: Woodbury
    # `diag(K - L L^T)` without the noise: what the preconditioner's low-rank factor leaves out
    # of the covariance's diagonal. The likelihood gradient's control variate puts it back.
    rest: Float[Array, " R"]
    probes: Float[Array, "R s"]
    # LOVE cache (`variance_rank > 0`, built by `for_prediction`): Lanczos vectors `Q` (k, R)
    # of the whitened covariance `A = F^{-1} K F^{-T}` and `C = T^{-1} - I` (k, k), so that
    # `K^{-1} ~ P^{-1} + F^{-T} Q^T C Q F^{-1}` (exact on the Krylov space, `P^{-1}` elsewhere).
    love: tuple[Array, Array] | None = None


# The recomputed residual of a converged CG solve may exceed the recursive estimate a
# little: a solve fails only beyond this multiple of `rtol`.
_RESIDUAL_SLACK = 10

# The default preconditioner rank's cap. Measured (docs/performance.md): at 2 000 gradient
# rows, noise 1e-3, the likelihood gradient's error per key fell from 0.09-0.20 (rank 128) to
# 0.001-0.002 (512), and each likelihood + gradient ran faster (12 s vs 22 s: fewer CG steps);
# at relative noise 1e-8 on 5 600 rows CG needs 946 steps at 512, 5 945 at 128.
_DEFAULT_RANK = 512


def _report(rel, rtol, max_steps, on_failure):
    rel = float(np.max(rel))
    if rel > _RESIDUAL_SLACK * rtol:
        msg = (
            f"eqgp.ConjugateGradient: the solve reached a relative residual of {rel:.3g}, more than "
            f"{_RESIDUAL_SLACK} x rtol={rtol:g}, within max_steps={max_steps}. Raise `max_steps` or "
            "`preconditioner_rank`, raise the noise, or use `eqgp.Cholesky()` if the problem fits."
        )
        if on_failure == "warn":
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        else:
            print(msg)


def _whitened(pre: Woodbury, mv):
    """`w -> F^{-1} K F^{-T} w` for `mv = K @`: well conditioned when the preconditioner
    `P = F F^T` is close to K."""

    def whitened(w):
        return pre.inv_sqrt(mv(pre.inv_sqrt_t(w)))

    return whitened


def _pcg(mv, pinv, B, X0, tol, max_steps):
    """Preconditioned conjugate gradients on the columns of `B` `(R, m)` at once (one product
    `mv` of an `(R, m)` block per step), each column until `max|r| <= tol` (its own), or
    `max_steps`. Returns `(X, steps)`.

    Not `lineax.CG`, whose stopping rule is relative per element of `b` *and* of the
    solution (`|r_i| <= rtol |b_i|`, `|dy_i| <= rtol |y_i|`: components near zero keep it
    going; 2x the steps on a 5 600-row gradient problem at relative noise 1e-8), and whose
    residual replacement every 10 steps diverged there (relative residual 1e74 after 20 000
    steps with a rank-512 preconditioner, where plain CG converges in 946)."""

    def done(R, stalled):
        return (jnp.max(jnp.abs(R), axis=0, initial=0.0) <= tol) | stalled

    def cond(carry):
        _, R, _, _, stalled, k = carry
        return jnp.any(~done(R, stalled)) & (k < max_steps)

    def body(carry):
        X, R, P, rz, stalled, k = carry
        live = ~done(R, stalled)
        AP = mv(P)
        pAp = jnp.sum(P * AP, axis=0)
        ok = live & (pAp > 0) & (rz > 0)  # a breakdown (rounding at the noise floor) stops the column
        alpha = jnp.where(ok, rz / jnp.where(ok, pAp, 1.0), 0.0)
        X = X + alpha[None] * P
        R = R - alpha[None] * AP
        Z = pinv(R)
        rz_next = jnp.sum(R * Z, axis=0)
        beta = jnp.where(ok, rz_next / jnp.where(ok, rz, 1.0), 0.0)
        P = jnp.where(ok[None], Z + beta[None] * P, P)
        return X, R, P, jnp.where(ok, rz_next, rz), stalled | (live & ~ok), k + 1

    R0 = B - mv(X0)
    Z0 = pinv(R0)
    init = (X0, R0, Z0, jnp.sum(R0 * Z0, axis=0), jnp.zeros(B.shape[1], bool), jnp.zeros((), jnp.int32))
    X, *_, k = jax.lax.while_loop(cond, body, init)
    return X, k


class ConjugateGradient(AbstractPullbackSolver[_CGState]):
    """Matrix-free: preconditioned conjugate gradients and stochastic Lanczos quadrature
    (BBMM, Gardner et al. 2018) on the covariance (a linear map), which is never formed.

    - solves: preconditioned CG on `Covariance.mv` (tiled autodiff products), each column
      until `max|r| <= rtol max|b|`; the preconditioner is a partial pivoted Cholesky of rank
      `preconditioner_rank` (default `min(512, R // 2)`) plus the noise (Woodbury). The rank
      is what keeps CG converging near interpolation: at relative noise 1e-8, 14 000 rows of
      values and gradients in 27-D took 1 054 steps at rank 512;
    - `log det K = log det P + tr log(F^{-1} K F^{-T})`, the second term by stochastic Lanczos
      quadrature (`matfree`) with `num_probes` Rademacher probes and `num_lanczos` steps;
    - the likelihood's gradient estimates `tr(K^{-1} dK)` with the same probes
      (`E[(K^{-1} F w)(F^{-T} w)^T] = K^{-1}` for `P = F F^T`), with `tr(P^{-1} dK)` exact
      as a control variate, where `P` is the preconditioner's low-rank factor with the
      covariance's diagonal restored (noise plus what the factor leaves out); unbiased, its
      error per key relative to the exact gradient 0.002-0.007 on 600 gradient rows at noise
      1e-3 with the defaults (rank 300), 0.001-0.002 on 2 000 rows (rank 512), 0.07-0.2 at rank
      128 (average keys, raise `num_probes` or `preconditioner_rank` to tighten it);
    - predictive variances and covariances: with `variance_rank=0` (default) one CG solve
      per predicted output (accurate to `rtol`, costly for many test points); with
      `variance_rank=k > 0` a LOVE cache (Pleiss et al. 2018) built once per `condition`:
      `k` Lanczos steps on the preconditioned covariance `F^{-1} K F^{-T}` (full
      reorthogonalisation, matfree), after which a variance costs one cross-covariance row and
      `O(R (k + preconditioner_rank))`. It is exact on the Krylov space and uses the
      preconditioner's inverse elsewhere, which overestimates the variance explained where
      the Krylov space misses the whitened covariance's large eigenvalues: too small a cache
      with too weak a preconditioner gives too small variances (docs/performance.md has
      measured errors). Check against `variance_rank=0` on a subset when in doubt.

    Probes come from the `key` given to `GaussianProcess.log_marginal_likelihood` /
    `condition`; with `key=None` a fixed key is used, so the objective is a deterministic
    function of the hyper-parameters (a sample-average approximation) and training is smooth.
    Pass a fresh key per step to average the estimator's bias out instead.

    A solve that does not reach `rtol` within `max_steps` raises an error under `jit`
    (`on_failure="raise"`, after printing the residual reached) or warns with it
    (`on_failure="warn"`); never a silent wrong answer. Memory: about `tile_bytes` for the
    product plus `O(R (num_probes + num_lanczos + preconditioner_rank))` (the rank's `R x 512`
    factor: 0.4 GB at 100 000 rows; pass a smaller `preconditioner_rank` to save it).

    `shard=True` splits every covariance product's row tiles over `jax.devices()`
    (`jax.sharding`; several hosts after `jax.distributed.initialize()`): the same code on
    one device or many, equal results.

    Conditioning on more observations (`Posterior.update`) warm-starts the new solve from
    the old solution (padded with zeros) and rebuilds the preconditioner.
    """

    rtol: float = eqx.field(static=True, default=1e-6)
    atol: float = eqx.field(static=True, default=0.0)
    max_steps: int = eqx.field(static=True, default=1000)
    num_probes: int = eqx.field(static=True, default=16)
    num_lanczos: int = eqx.field(static=True, default=40)
    preconditioner_rank: int | None = eqx.field(static=True, default=None)
    tile_bytes: int = eqx.field(static=True, default=2**28)
    on_failure: str = eqx.field(static=True, default="raise")  # "raise" or "warn"
    variance_rank: int = eqx.field(static=True, default=0)
    shard: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"`{name}` must be a number; got {value!r}.")
        if not 0 < self.rtol < 1:
            raise ValueError(f"`rtol` must be in (0, 1) (a relative residual); got {self.rtol!r}.")
        if not 0 <= self.atol < np.inf:
            raise ValueError(f"`atol` must be finite and non-negative; got {self.atol!r}.")
        for name in ("max_steps", "num_probes", "num_lanczos", "tile_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int; got {value!r}.")
        for name in ("preconditioner_rank", "variance_rank"):
            value = getattr(self, name)
            if name == "preconditioner_rank" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                kind = "a non-negative int" + (" or None" if name == "preconditioner_rank" else "")
                raise ValueError(f"`{name}` must be {kind}; got {value!r}.")
        if not isinstance(self.shard, bool):
            raise TypeError(f"`shard` must be a bool; got {self.shard!r}.")
        if 0 < self.variance_rank and self.preconditioner_rank == 0 and self.variance_rank < 50:
            warnings.warn(
                f"eqgp.ConjugateGradient: a LOVE cache of variance_rank={self.variance_rank} without a "
                "preconditioner (preconditioner_rank=0) explains too much variance wherever the Krylov space "
                "misses the covariance's large eigenvalues (predicted variances can be 0). Use "
                "preconditioner_rank >= 50, a larger variance_rank, or variance_rank=0 (exact solves).",
                UserWarning,
                stacklevel=3,
            )
        if self.on_failure not in ("raise", "warn"):
            raise ValueError(f"`on_failure` must be 'raise' or 'warn'; got {self.on_failure!r}.")

    def _rank(self, rows: int) -> int:
        """The preconditioner's rank on `rows` rows: `preconditioner_rank`, or by default
        `min(512, rows // 2)` (beyond half the rows a preconditioner costs what the dense
        factorisation does)."""
        if self.preconditioner_rank is None:
            return min(_DEFAULT_RANK, rows // 2)
        return min(self.preconditioner_rank, rows)

    def _mv(self, cov: Covariance, k: int = 1):
        """`V -> K @ V` with this solver's tiling, the budget shared by `k` products that run
        batched (under `vmap`)."""
        tile = max(1, self.tile_bytes // max(k, 1))
        return lambda V: cov.mv(V, tile_bytes=tile, shard=self.shard)

    def init(self, cov: Covariance, key: PRNGKeyArray | None = None) -> _CGState:
        R = cov.size
        rank = self._rank(R)
        if rank > 0:
            column = lambda i: cov.kernel_column(i, tile_bytes=self.tile_bytes, shard=self.shard)  # noqa: E731
            L, rest = pivoted_cholesky(cov.kernel_diagonal(), column, rank)
        else:
            L, rest = jnp.zeros((R, 0), cov.dtype), cov.kernel_diagonal()
        key = jax.random.key(0) if key is None else key
        probes = jax.random.rademacher(key, (R, self.num_probes), cov.dtype)
        return _CGState(cov, Woodbury(cov.noise, L), rest, probes)

    def for_prediction(self, state: _CGState) -> _CGState:
        R = state.cov.size
        steps = min(self.variance_rank, R)
        if steps == 0:
            return state
        start = state.probes[:, 0] if state.probes.shape[1] else jnp.ones((R,), state.cov.dtype)
        Q, T, *_ = matfree.decomp.tridiag_sym(steps, reortho="full", custom_vjp=False)(
            _whitened(state.preconditioner, self._mv(state.cov)), start / jnp.linalg.norm(start)
        )
        C = jnp.linalg.inv(T) - jnp.eye(steps, dtype=T.dtype)
        return eqx.tree_at(lambda s: s.love, state, (Q, 0.5 * (C + C.T)), is_leaf=lambda x: x is None)

    def solve(self, state: _CGState, B, y0=None):
        """`K^{-1} B` by preconditioned CG, from `y0` (same shape as `B`; a warm start) or
        from zero."""
        return self._solve(state, B, y0)[0]

    def _solve(self, state: _CGState, B, y0=None):
        """`(K^{-1} B, steps, relative residual)`: the solve and what it took."""
        vec = B.ndim == 1
        B2 = B[:, None] if vec else B
        Y0 = jnp.zeros_like(B2) if y0 is None else (y0[:, None] if vec else y0).astype(B2.dtype)
        cov = state.cov
        mv = self._mv(cov, B2.shape[1])
        bnorm = jnp.max(jnp.abs(B2), axis=0, initial=0.0)
        X, steps = _pcg(mv, state.preconditioner.inv, B2, Y0, jnp.maximum(self.rtol * bnorm, self.atol), self.max_steps)
        # The residual of the returned solution, recomputed (not CG's recursive one), relative
        # in the max norm.
        res = B2 - mv(X)
        rel = jnp.max(jnp.max(jnp.abs(res), axis=0, initial=0.0) / jnp.where(bnorm > 0, bnorm, 1.0), initial=0.0)
        failed = rel > jnp.maximum(_RESIDUAL_SLACK * self.rtol, self.atol)
        jax.debug.callback(_report, rel, self.rtol, self.max_steps, self.on_failure)
        if self.on_failure == "raise":
            X = eqx.error_if(
                X,
                failed,
                "eqgp.ConjugateGradient did not converge (relative residual printed above): raise "
                "`max_steps` or `preconditioner_rank`, raise the noise, or use eqgp.Cholesky().",
            )
        return (X[:, 0] if vec else X), steps, rel

    def logdet(self, state: _CGState):
        cov = state.cov
        R = cov.size
        if R == 0:
            return jnp.zeros((), cov.dtype)
        pre = state.preconditioner
        if pre.U.shape[1] >= R:
            # A full-rank preconditioner is the covariance itself: its log-determinant is exact,
            # and Lanczos on the whitened identity would break down after one step (its Krylov
            # space has dimension 1), which matfree does not detect.
            return pre.logdet()
        # Batched over the probes, each product's tiles share the budget; sharded, the probes
        # run one after another (below) and each product has all of it.
        whitened = _whitened(pre, self._mv(cov, 1 if self.shard else state.probes.shape[1]))

        steps = min(self.num_lanczos, R)
        tridiag = matfree.decomp.tridiag_sym(steps, custom_vjp=False)

        def quadform(w):  # w^T log(A) w by Lanczos quadrature (matfree's, kept in w's dtype)
            length = jnp.linalg.norm(w)
            _, T, *_ = tridiag(whitened, w / length)
            evals, evecs = jnp.linalg.eigh(T)
            return length**2 * jnp.sum(evecs[0] ** 2 * jnp.log(evals))

        if self.shard:
            # Sharded: one probe after another. XLA:CPU deadlocked (4 simulated devices, jaxlib
            # 0.10) on the sharded product batched over probes inside matfree's Lanczos loop.
            samples = jax.lax.map(quadform, state.probes.T)
        else:
            samples = jax.vmap(quadform, in_axes=1)(state.probes)
        return pre.logdet() + jnp.mean(samples)

    def likelihood_cotangent(self, state: _CGState, alpha, cov):
        # The control variate: the preconditioner's low-rank part with the covariance's diagonal
        # restored (noise plus what the factor leaves out; FITC's approximation). A worse CG
        # preconditioner (its spectrum is wider) but a far better control variate for
        # tr(K^{-1} dK): the estimate's error on a 600-row gradient problem fell from ~2x to
        # ~0.1 per key. Built here, in the backward pass only.
        pre = state.preconditioner.with_diagonal(state.cov.noise + state.rest)
        s = state.probes.shape[1]
        Z = pre.sqrt(state.probes)  # probes with covariance P
        PinvZ = pre.inv_sqrt_t(state.probes)
        # tr(K^{-1} dK) = tr(P^{-1} dK) + tr((K^{-1} - P^{-1}) dK) with P the control variate
        # (not the CG preconditioner): the first term exactly (a diagonal and
        # rank-r pieces), the stochastic one only for the remainder, with probes Z ~ (0, P):
        # E[(K^{-1} - P^{-1}) Z (P^{-1} Z)^T] = K^{-1} - P^{-1}. Unbiased for any P; its
        # variance shrinks as P approaches K.
        d, A, B = pre.inv_pieces()
        remainder = self.solve(state, Z) - PinvZ
        U = 0.5 * jnp.concatenate([alpha[:, None], -A, -remainder / s], axis=1)
        V = jnp.concatenate([alpha[:, None], B, PinvZ], axis=1)
        return cov.pullback(U, V, -0.5 * d, tile_bytes=self.tile_bytes, shard=self.shard)

    def inv_quad(self, state: _CGState, B, diagonal):
        if state.love is not None:  # the LOVE cache: no solves
            Q, C = state.love
            pre = state.preconditioner
            W = Q @ pre.inv_sqrt(B)  # (k, m)
            PB = pre.inv(B)
            if diagonal:
                return jnp.sum(B * PB, axis=0) + jnp.sum(W * (C @ W), axis=0)
            out = B.T @ PB + W.T @ (C @ W)
            return 0.5 * (out + out.T)
        return inv_quad_by_solves(self, state, B, diagonal)  # one CG solve per column

    def extend(self, state, alpha, cov, residual, key=None):
        new = self.init(cov, key)
        y0 = jnp.concatenate([alpha, jnp.zeros(residual.shape[0] - alpha.shape[0], residual.dtype)])
        return new, self.solve(new, residual, y0=y0)
