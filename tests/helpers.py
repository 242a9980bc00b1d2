"""Shared tolerances and independent references for the tests."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np

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


def fd_cross_cov(kernel, x1, x2, eps=1e-4):
    """The (D+1) x (D+1) value/gradient cross covariance of one pair by finite differences
    of the kernel alone (no autodiff anywhere)."""
    x1 = np.asarray(x1, dtype=np.float64)
    x2 = np.asarray(x2, dtype=np.float64)
    D = x1.shape[0]
    k = lambda a, b: float(kernel(jnp.asarray(a), jnp.asarray(b)))  # noqa: E731
    E = np.eye(D) * eps
    out = np.zeros((D + 1, D + 1))
    out[0, 0] = k(x1, x2)
    for j in range(D):
        out[0, 1 + j] = (k(x1, x2 + E[j]) - k(x1, x2 - E[j])) / (2 * eps)
        out[1 + j, 0] = (k(x1 + E[j], x2) - k(x1 - E[j], x2)) / (2 * eps)
    for i in range(D):
        for j in range(D):
            out[1 + i, 1 + j] = (
                k(x1 + E[i], x2 + E[j]) - k(x1 + E[i], x2 - E[j]) - k(x1 - E[i], x2 + E[j]) + k(x1 - E[i], x2 - E[j])
            ) / (4 * eps**2)
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
