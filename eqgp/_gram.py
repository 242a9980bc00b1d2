from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._checks import as_points, check_same_dtype
from ._jit import jit
from ._kernels import AbstractKernel, Constant, Invariant, Product, Warped, scalar_call
from ._operators import AbstractOperator, ValueAndGradient

Layout = Literal["blocked", "interleaved"]

_DIAG_BATCH_BYTES = 2**27


def _check_kernel(kernel):
    if not isinstance(kernel, AbstractKernel):
        raise TypeError(f"`kernel` must be an eqgp.kernels.AbstractKernel; got {type(kernel).__name__}.")


def _check_layout(layout):
    if layout not in ("blocked", "interleaved"):
        raise ValueError(f"`layout` must be 'blocked' or 'interleaved'; got {layout!r}.")


def check_smoothness(kernel: AbstractKernel, *operators: AbstractOperator) -> None:
    """Refuse an operator that takes more derivatives than the kernel's process has."""
    have = kernel.smoothness
    for op in operators:
        need = getattr(op, "order", None)
        if need is not None and need > have:
            raise ValueError(
                f"{type(op).__name__} observations take {need} derivative(s) of the process, but "
                f"kernel {type(kernel).__name__} is only {int(have)} time(s) differentiable "
                f"(smoothness = {int(have)}): its derivative covariances do not exist. Use a smoother "
                "kernel (Matern52 or RBF) or fewer derivatives; a user kernel declares its smoothness "
                "as a class attribute."
            )


def _block(kernel, op1: AbstractOperator, op2: AbstractOperator):
    """`(x1, x2) -> cov(op1 f(x1), op2 f(x2))`, one pair of points: shape `(P1, P2)`."""
    check_smoothness(kernel, op1, op2)
    k = scalar_call(kernel)
    return lambda x1, x2: op1.apply(lambda a: op2.apply(lambda b: k(a, b), x2), x1)


def _pairs(pair, P1, P2, A1, A2, layout: Layout):
    """`pair(a1, a2)` (a `(P1, P2)` block) for every pair of per-point data `A1`, `A2`
    (pytrees with the points on the leading axis), reshaped straight into the layout."""
    N = jax.tree.leaves(A1)[0].shape[0]
    M = jax.tree.leaves(A2)[0].shape[0]
    # Map straight into the final order instead of building (N, M, P1, P2) and
    # transposing it: the layout is where the time goes for large grams.
    if layout == "blocked":  # (P1, N, P2, M)
        inner, outer = 2, 1
    else:  # (N, P1, M, P2)
        inner, outer = 1, 0
    mapped = eqx.filter_vmap(
        eqx.filter_vmap(pair, in_axes=(None, 0), out_axes=inner), in_axes=(0, None), out_axes=outer
    )
    return mapped(A1, A2).reshape(N * P1, M * P2)


def _cross(kernel, op1: AbstractOperator, X1, op2: AbstractOperator, X2, layout: Layout):
    """cov(op1 f(X1_i), op2 f(X2_j)) for all pairs, reshaped straight into the layout."""
    D = X1.shape[1]
    P1, P2 = op1.size(D), op2.size(D)
    structured = _structured_cross(kernel, op1, X1, op2, X2, layout)
    if structured is not None:
        return structured
    return _pairs(_block(kernel, op1, op2), P1, P2, X1, X2, layout)


# Structured grams. Autodiff of the scalar kernel pair by pair recomputes a warp (a
# descriptor) and its derivatives for every pair, and averages an invariant kernel's group
# inside every pair's derivatives. For observations of at most first derivatives (values,
# gradients, partial and directional derivatives) the chain rule needs only each point's
# warp value and Jacobian: `k(w1 + J1 (a - x1), w2 + J2 (b - x2))`, differentiated in `a`,
# `b` at `x1`, `x2`, has exactly the first derivatives of `k(warp(a), warp(b))`. So the
# warp is evaluated once per point, and an invariant kernel's gram is the sum over the
# group of grams against the permuted points (one at a time, in a scan). Every block is
# still autodiff of the scalar kernel; these are exact, not approximations.


def _first_order(*ops: AbstractOperator) -> bool:
    return all(op.order is not None and op.order <= 1 for op in ops)


def _linearised_pair(kernel, op1: AbstractOperator, op2: AbstractOperator):
    k = scalar_call(kernel)

    def pair(a1, a2):
        x1, w1, J1 = a1
        x2, w2, J2 = a2
        return op1.apply(lambda a: op2.apply(lambda b: k(w1 + J1 @ (a - x1), w2 + J2 @ (b - x2)), x2), x1)

    return pair


def _warp_points(warp, X, perm=None, inverse=None):
    """`(X, warp(X), d warp / dX)` per point; with `perm`, of `x -> warp(x[perm])`."""
    Y = X if perm is None else X[:, perm]
    W = jax.vmap(lambda y: warp(y))(Y)
    J = jax.vmap(jax.jacfwd(lambda y: warp(y)))(Y)
    if perm is not None:  # d warp(x[perm]) / dx: the columns of J at x[perm], moved back
        J = J[..., inverse]
    return X, W, J


def _structured_cross(kernel, op1, X1, op2, X2, layout: Layout):
    """The gram by a structured path (see above), or None where none applies."""
    if not _first_order(op1, op2):
        return None
    D = X1.shape[1]
    P1, P2 = op1.size(D), op2.size(D)
    if isinstance(kernel, Product) and isinstance(kernel.kernel1, Constant):  # c * k
        inner = _structured_cross(kernel.kernel2, op1, X1, op2, X2, layout)
        return None if inner is None else kernel.kernel1.variance.astype(inner.dtype) * inner
    if isinstance(kernel, Warped):
        check_smoothness(kernel, op1, op2)
        pair = _linearised_pair(kernel.kernel, op1, op2)
        return _pairs(pair, P1, P2, _warp_points(kernel.warp, X1), _warp_points(kernel.warp, X2), layout)
    if (
        isinstance(kernel, Invariant)
        and kernel.permutations is not None
        and kernel.one_sided
        and isinstance(kernel.kernel, Warped)
    ):
        # (1/|G|) sum_g k(x1, g x2): one gram per group element, against warp(x2[perm_g]).
        check_smoothness(kernel, op1, op2)
        base = kernel.kernel
        perms = np.asarray(kernel.permutations)
        if perms.shape[1] != D:
            raise ValueError(
                f"eqgp.kernels.Invariant: the group acts on {perms.shape[1]} dimensions; the points have {D}."
            )
        pair = _linearised_pair(base.kernel, op1, op2)
        A1 = _warp_points(base.warp, X1)

        @jax.checkpoint  # keep one gram's intermediates, not |G| of them, for reverse mode
        def term(perm, inverse):
            return _pairs(pair, P1, P2, A1, _warp_points(base.warp, X2, perm, inverse), layout)

        def body(total, g):
            return total + term(*g), None

        first = term(jnp.asarray(perms[0]), jnp.asarray(np.argsort(perms[0])))
        rest = (jnp.asarray(perms[1:]), jnp.asarray(np.argsort(perms[1:], axis=1)))
        total, _ = jax.lax.scan(body, first, rest)
        return total / len(perms)
    return None


@jit
def gram(
    kernel: AbstractKernel, X1: Float[Array | np.ndarray, "N D"], X2: Float[Array | np.ndarray, "M D"]
) -> Float[Array, "N M"]:
    """The covariance matrix `K[i, j] = kernel(X1[i], X2[j])`.

    **Arguments:**

    - `kernel`: an `eqgp.kernels.AbstractKernel`.
    - `X1`: points, shape `(N, D)`.
    - `X2`: points, shape `(M, D)`, the same `D` and dtype.

    **Returns:** shape `(N, M)`.
    """
    _check_kernel(kernel)
    X1 = as_points("X1", X1)
    X2 = as_points("X2", X2, X1.shape[1])
    check_same_dtype(X1=X1, X2=X2)
    f = eqx.filter_vmap(eqx.filter_vmap(scalar_call(kernel), in_axes=(None, 0)), in_axes=(0, None))
    return f(X1, X2)


@jit
def gradient_gram(
    kernel: AbstractKernel,
    X1: Float[Array | np.ndarray, "N D"],
    X2: Float[Array | np.ndarray, "M D"],
    layout: Layout = "blocked",
) -> Float[Array, "N*(D+1) M*(D+1)"]:
    """The joint covariance of values and gradients at `X1` and at `X2`, by autodiff.

    `layout="blocked"` (default) gives `[[K, dK/dx2], [dK/dx1, d2K/dx1dx2]]` with the
    derivative rows and columns component-major: all points' d/dx_0, then all points'
    d/dx_1, ..., so the matching target vector is `concat([y, G[:, 0], G[:, 1], ...])`.
    `layout="interleaved"` gives GPyTorch's per-point order `[f(x_1), df/dx_1, ...,
    f(x_2), ...]`. Entry `(i, j)` of a block is `cov(L f(X1_i), L' f(X2_j))`.

    **Arguments:**

    - `kernel`: any `eqgp.kernels.AbstractKernel` (sums, products, warped and user kernels too).
    - `X1`: points, shape `(N, D)`.
    - `X2`: points, shape `(M, D)`.
    - `layout`: `"blocked"` or `"interleaved"`.

    **Returns:** shape `(N (D + 1), M (D + 1))`.
    """
    _check_kernel(kernel)
    _check_layout(layout)
    X1 = as_points("X1", X1)
    X2 = as_points("X2", X2, X1.shape[1])
    check_same_dtype(X1=X1, X2=X2)
    op = ValueAndGradient()
    return _cross(kernel, op, X1, op, X2, layout)


def _as_groups(name: str, obs) -> list[tuple[AbstractOperator, Array]]:
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[0], AbstractOperator):
        obs = [obs]
    if hasattr(obs, "groups"):  # an eqgp.Observations
        obs = [(g.operator, g.X) for g in obs.groups]
    if not isinstance(obs, Sequence) or len(obs) == 0:
        raise TypeError(
            f"`{name}` must be an (operator, X) pair or a non-empty sequence of them; got {type(obs).__name__}."
        )
    groups = []
    for i, g in enumerate(obs):
        if not (isinstance(g, tuple) and len(g) == 2 and isinstance(g[0], AbstractOperator)):
            raise TypeError(
                f"`{name}[{i}]` must be a pair (operator, X) with an eqgp operator such as "
                f"eqgp.Value() or eqgp.Gradient(); got {g!r:.80}."
            )
        groups.append((g[0], as_points(f"{name}[{i}] points", g[1])))
    return groups


@jit
def operator_gram(kernel: AbstractKernel, obs1, obs2, layout: Layout = "blocked") -> Array:
    """The covariance between groups of linear observations, by autodiff.

    Each of `obs1`, `obs2` is an `(operator, X)` pair, a sequence of them, or an
    `eqgp.Observations`. Rows follow the groups of `obs1` in order, and within a group
    are component-major (all points' first output, then all points' second, ...) or,
    with `layout="interleaved"`, point-major. Only the requested derivatives are computed.

    **Arguments:**

    - `kernel`: an `eqgp.kernels.AbstractKernel`.
    - `obs1`, `obs2`: e.g. `[(eqgp.Value(), X), (eqgp.Partial([0]), Z)]`.
    - `layout`: `"blocked"` or `"interleaved"` (order within each group).

    **Returns:** shape `(sum_g P_g N_g, sum_h P_h M_h)`.
    """
    _check_kernel(kernel)
    _check_layout(layout)
    g1 = _as_groups("obs1", obs1)
    g2 = _as_groups("obs2", obs2)
    D = g1[0][1].shape[1]
    for name, groups in (("obs1", g1), ("obs2", g2)):
        for i, (_, X) in enumerate(groups):
            as_points(f"{name}[{i}] points", X, D)
    check_same_dtype(**{f"group{i}": X for i, (_, X) in enumerate(g1 + g2)})
    return _operator_gram(kernel, g1, g2, layout)


def _operator_gram(kernel, g1, g2, layout: Layout = "blocked") -> Array:
    """`operator_gram` on validated groups (for callers that checked their inputs once)."""
    rows = [jnp.concatenate([_cross(kernel, a, X1, b, X2, layout) for b, X2 in g2], axis=1) for a, X1 in g1]
    return jnp.concatenate(rows, axis=0)


@jit
def operator_diag(kernel: AbstractKernel, operator: AbstractOperator, X) -> Array:
    """The variances `cov(L f(X_i), L f(X_i))` of one operator at each point, without the
    off-diagonal: shape `(P N,)`, component-major like `operator_gram`.

    **Arguments:** `kernel` (an `eqgp.kernels.AbstractKernel`), `operator` (an
    `eqgp.AbstractOperator`) and `X`, points of shape `(N, D)`.

    **Returns:** shape `(P N,)`, equal to `jnp.diagonal(operator_gram(kernel, (operator, X), (operator, X)))`
    at `O(N)` cost."""
    _check_kernel(kernel)
    return _operator_diag(kernel, operator, as_points("X", X))


def _operator_diag(kernel, operator: AbstractOperator, X: Array) -> Array:
    """`operator_diag` on validated points."""
    N, D = X.shape
    P = operator.size(D)
    if N == 0 or P == 0:
        return jnp.zeros((P * N,), X.dtype)
    block = _block(kernel, operator, operator)
    # A point's diagonal comes from its whole (P, P) block (P directional products, each
    # O(D)): P (P + D) intermediates. Points go in batches that keep them within
    # `_DIAG_BATCH_BYTES`, each batch rematerialised in reverse mode, so that the diagonal of
    # a high-D gradient covariance never holds N D^2 numbers.
    B = int(max(1, min(N, _DIAG_BATCH_BYTES // (P * (P + D) * 64))))
    diag = jax.checkpoint(lambda x: jnp.diagonal(block(x, x)))
    return jax.lax.map(diag, X, batch_size=B).T.reshape(-1)
