import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

from .._covariance import Covariance
from .._linalg import INDEFINITE, cholesky, cholesky_inverse_t
from ._abstract import AbstractPullbackSolver, AbstractSolverState


class _CholeskyState(AbstractSolverState):
    # The lower Cholesky factor L of K (jitter included), held transposed: LAPACK writes L
    # column-major, which is L^T row-major, so holding L^T (and reading `factor`, a
    # transpose) lets XLA bitcast instead of copying the matrix into and out of LAPACK.
    factor_t: Float[Array, "R R"]
    # 0, or NaN after a failed factorisation: it carries the failure check (an
    # `eqx.error_if`), so every result computed from the factor adds it.
    check: Float[Array, ""]

    @property
    def factor(self) -> Float[Array, "R R"]:
        return self.factor_t.T


# Rows of the principal submatrix whose eigenvalues tell an indefinite kernel from an
# ill-conditioned covariance after a failed factorisation (a small matrix, built only then).
_PROBE_ROWS = 256

# Retries (tenfold jitter each) of the solver `for_training` hands to fit_hyperparameters.
_TRAINING_TRIES = 4

# Above this condition number a float32 factorisation keeps fewer than ~2 correct digits.
_FLOAT32_COND = 1e5


def _warn_float32(cond):
    if float(cond) > _FLOAT32_COND:
        warnings.warn(
            f"eqgp: the observation covariance has condition number >= {float(cond):.1e}, more than "
            "float32 can factorise accurately (gradient observations make covariances ill-conditioned). "
            "Enable float64 (`jax.config.update('jax_enable_x64', True)` and float64 data), or raise the "
            "noise (`noise_floor`).",
            RuntimeWarning,
            stacklevel=2,
        )


class Cholesky(AbstractPullbackSolver[_CholeskyState]):
    """Dense Cholesky of `cov.as_matrix()`, with `jitter` (times the mean of the kernel's
    diagonal, the noise excluded, so that huge known noise on padding rows does not inflate
    it; over the rows whose noise is at most half their variance) added to the diagonal:
    exact, memory `R^2`, time `R^3 / 3`.

    `max_tries > 0` makes it robust (opt-in, as GPyTorch's `psd_safe_cholesky`): where the
    factorisation fails it retries with tenfold jitter up to `max_tries` times and warns
    with the jitter it needed; this works under `jit`, `grad` and `vmap`.

    A failed factorisation raises an `eqx.error_if` error, also under `jit`, that says what
    to do; it never turns into a silent NaN loss. Conditioning on more observations
    (`Posterior.update`) extends the factor: `O(R^2 R2)` for `R2` new rows.
    """

    jitter: float = eqx.field(static=True, default=0.0)
    max_tries: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if not (isinstance(self.jitter, (int, float)) and 0 <= self.jitter < np.inf) or isinstance(self.jitter, bool):
            raise ValueError(f"`jitter` must be a finite number >= 0; got {self.jitter!r}.")
        if not isinstance(self.max_tries, int) or isinstance(self.max_tries, bool) or self.max_tries < 0:
            raise ValueError(f"`max_tries` must be an int >= 0; got {self.max_tries!r}.")

    def init(self, cov: Covariance, key=None) -> _CholeskyState:
        noise = cov.noise

        def scale(diagonal):
            # From the matrix's diagonal, read before the factorisation overwrites it (a
            # second evaluation of the kernel's diagonal costs compile time and memory).
            total = jnp.mean(diagonal)
            if not (self.jitter or self.max_tries):
                return total
            # The kernel's part (the noise excluded, so that huge known noise on padding
            # rows does not inflate the jitter), over the rows where subtracting the noise
            # is exact to rounding (the noise at most half the diagonal).
            kept = noise <= 0.5 * diagonal
            count = jnp.maximum(jnp.sum(kept, dtype=diagonal.dtype), 1.0)
            kernel = jnp.sum(jnp.where(kept, diagonal - noise, 0.0)) / count
            return jnp.where(kernel > 0, kernel, total)

        # The factorisation overwrites the only copy of the gram (a large one is built again
        # for jitter retries; the indefiniteness test reads a small principal submatrix).
        Lt, check = cholesky(
            cov.as_matrix,
            self.jitter,
            self.max_tries,
            scale=scale,
            indefinite=INDEFINITE,
            transposed=True,
            principal=cov.leading_rows(_PROBE_ROWS),
            deferred=True,
        )
        _check_float32(Lt.T)
        return _CholeskyState(Lt, check)

    def for_training(self) -> "Cholesky":
        # Deterministic data drives the noise to where a plain factorisation fails: retry
        # with jitter (warned) rather than end the run at a line search's trial point.
        return self if self.max_tries else Cholesky(self.jitter, _TRAINING_TRIES)

    holds_dense_factor = True

    def held_factor_t(self, state):
        return state.factor_t, state.check

    def dense_factor_t(self, cov: Covariance, message: str):
        if not (self.jitter or self.max_tries):
            return super().dense_factor_t(cov, message)
        state = self.init(cov)
        return state.factor_t, state.check

    def solve(self, state, B):
        return jsl.cho_solve((state.factor, True), B) + state.check

    def logdet(self, state):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(state.factor_t))) + state.check

    def likelihood_cotangent(self, state, alpha, cov):
        # K^{-1} by LAPACK ?potri on CPU (a third of the flops of solve(state, I)), in place of
        # the factor: `alpha` (the solves that read the factor) is ordered before it, or XLA
        # keeps the factor alive as a copy (a second matrix).
        # The cotangent (alpha alpha^T - K^{-1}) / 2 is never formed (a second matrix: XLA
        # cannot write it over K^{-1}, which is read transposed to symmetrise it).
        Kinv = cholesky_inverse_t(state.factor_t, alpha)
        return cov.symmetric_pullback(Kinv, scale=-0.5, u=alpha * 2.0**-0.5)

    def for_prediction(self, state):
        return state

    def inv_quad(self, state, B, diagonal):
        W = jsl.solve_triangular(state.factor, B, lower=True)
        return (jnp.sum(W * W, axis=0) if diagonal else W.T @ W) + state.check

    def extend(self, state, alpha, cov, residual, key=None):
        # [[L11, 0], [L21, L22]] with L21 = K21 L11^{-T} and L22 the factor of the Schur
        # complement K22 - L21 L21^T (the jitter applies to that block only).
        L11 = state.factor
        R1 = L11.shape[0]
        rows = cov.trailing_rows(R1)  # (R2, R1 + R2), noise included
        L21 = jsl.solve_triangular(L11, rows[:, :R1].T, lower=True).T
        S = rows[:, R1:] - L21 @ L21.T
        L22 = cholesky(0.5 * (S + S.T), self.jitter, self.max_tries)
        L = jnp.block([[L11, jnp.zeros((R1, L22.shape[0]), L11.dtype)], [L21, L22]])
        new = _CholeskyState(L.T, state.check)
        return new, self.solve(new, residual)


def _check_float32(L):
    if L.dtype == jnp.float32 and L.shape[0]:
        # (max L_ii / min L_ii)^2 is a lower bound of the condition number, free here.
        d = jnp.diagonal(L)
        jax.debug.callback(_warn_float32, (jnp.max(d) / jnp.min(d)) ** 2)
