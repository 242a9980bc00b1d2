"""Shared tolerances and independent references for the tests."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from eqgp import kernels

TOL = {jnp.float32: dict(rtol=2e-4, atol=2e-5), jnp.float64: dict(rtol=1e-10, atol=1e-12)}


def tol(dtype):
    return TOL[jnp.dtype(dtype).type]


def assert_close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **kw)


def central_diff(f, x, eps=1e-5):
    """Jacobian of f: (D,) -> (*Q) by central differences, shape (D, *Q), in float64."""
    x = np.asarray(x, dtype=np.float64)
    cols = []
    for i in range(x.shape[0]):
        e = np.zeros_like(x)
        e[i] = eps
        cols.append((np.asarray(f(jnp.asarray(x + e))) - np.asarray(f(jnp.asarray(x - e)))) / (2 * eps))
    return np.stack(cols)


@eqx.filter_jit
def _kernel_values(kernel, A, B):
    return jax.vmap(kernel)(A, B)


def fd_cross_cov(kernel, x1, x2, eps=1e-4):
    """The (D+1) x (D+1) value/gradient cross covariance of one pair by finite differences
    of the kernel alone (no autodiff anywhere). The kernel's values at every pair of shifted
    points, `x + s` with `s` in `(0, +eps e_0, -eps e_0, ...)` on each side, come from one
    compiled, vmapped evaluation (the differences stay in float64 numpy)."""
    x1 = np.asarray(x1, dtype=np.float64)
    x2 = np.asarray(x2, dtype=np.float64)
    D = x1.shape[0]
    shifts = np.concatenate([np.zeros((1, D)), np.stack([np.eye(D), -np.eye(D)], axis=1).reshape(2 * D, D) * eps])
    S = shifts.shape[0]
    A = jnp.asarray(np.repeat(x1 + shifts, S, axis=0))
    B = jnp.asarray(np.tile(x2 + shifts, (S, 1)))
    V = np.asarray(_kernel_values(kernel, A, B), dtype=np.float64).reshape(S, S)
    p, m = 1 + 2 * np.arange(D), 2 + 2 * np.arange(D)  # the +eps and -eps shifts of each axis
    out = np.zeros((D + 1, D + 1))
    out[0, 0] = V[0, 0]
    out[0, 1:] = (V[0, p] - V[0, m]) / (2 * eps)
    out[1:, 0] = (V[p, 0] - V[m, 0]) / (2 * eps)
    out[1:, 1:] = (V[np.ix_(p, p)] - V[np.ix_(p, m)] - V[np.ix_(m, p)] + V[np.ix_(m, m)]) / (4 * eps**2)
    return out


def sumcumprod_quadratic(x):
    """The O(n^2) definition: y_i = sum_{j >= i} prod_{k=i..j} x_k, in numpy float64."""
    x = np.asarray(x, dtype=np.float64)
    y = np.zeros_like(x)
    n = x.shape[-1]
    for i in range(n):
        p = np.ones(x.shape[:-1])
        for j in range(i, n):
            p = p * x[..., j]
            y[..., i] += p
    return y


def jit_roundtrip(tree):
    """A pytree passed through jit unchanged."""
    return eqx.filter_jit(lambda t: t)(tree)


# Every built-in kernel and composite, on D = 3 inputs: the kernel fixtures of the suite.
D = 3
ALL_KERNELS = {
    "rbf": lambda: kernels.RBF([0.7, 1.1, 1.6], variance=1.3),
    "m12": lambda: kernels.Matern12(0.9),
    "m32": lambda: kernels.Matern32([0.8, 1.2, 1.0]),
    "m52": lambda: kernels.Matern52([0.8, 1.2, 1.0], variance=0.7),
    "rq": lambda: kernels.RationalQuadratic(1.1, alpha=0.8),
    "periodic": lambda: kernels.Periodic(1.2, period=[2.0, 2.5, 3.0]),
    "linear": lambda: kernels.Linear(0.5),
    "poly": lambda: kernels.Polynomial(3, variance=0.4, offset=0.6),
    "constant": lambda: kernels.Constant(2.0),
    "white": lambda: kernels.White(0.3),
    "sum": lambda: kernels.RBF(1.0) + kernels.Matern52(2.0),
    "product": lambda: kernels.RBF(1.0) * kernels.Periodic(1.0, period=2.0),
    "scaled": lambda: 2.5 * kernels.RationalQuadratic(0.9),
    "builtin_sum": lambda: sum([kernels.RBF(0.5), kernels.Linear(0.2), kernels.Constant(0.1)]),
    "warped": lambda: kernels.Warped(
        kernels.Matern52(1.0), eqx.nn.MLP(D, D, 4, 1, activation=jnp.tanh, key=jax.random.key(0))
    ),
}


def points(n, dtype=jnp.float64, seed=0):
    return jax.random.uniform(jax.random.key(seed), (n, D), dtype, -1.5, 1.5)


def lowered_custom_calls(fn, *args, platform: str) -> list[str]:
    """The custom-call targets of `jax.jit(fn)` lowered for `platform` (no device of that kind
    needed); `args` are arrays or `jax.ShapeDtypeStruct`s."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    return [line.split("custom_call @")[1].split("(")[0] for line in text.splitlines() if "custom_call @" in line]
