"""Observation operators: sizes, derivative orders, `apply` against explicit derivatives,
`contract` against `apply` (the matrix-free product relies on it), both autodiff modes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, points as _points

import eqgp
from eqgp import kernels

D = 3
OPERATORS = [
    eqgp.Value(),
    eqgp.Gradient(),
    eqgp.ValueAndGradient(),
    eqgp.Partial([2, 0]),
    eqgp.Partial(1),
    eqgp.Directional(jnp.array([0.3, -1.0, 2.0])),
    eqgp.Directional(jnp.array([[0.3, -1.0, 2.0], [1.0, 0.5, 0.0]])),
    eqgp.Hessian(),
    eqgp.Hessian(diagonal=True),
]


def _f(x):  # a scalar test function with nonzero derivatives of every order
    return jnp.sin(x[0]) * jnp.exp(0.3 * x[1]) + x[2] ** 3 * x[0]


def _explicit(op, x):
    """The operator's outputs written out from the gradient and Hessian of `_f`."""
    g, H = jax.grad(_f)(x), jax.hessian(_f)(x)
    if isinstance(op, eqgp.Value):
        return _f(x)[None]
    if isinstance(op, eqgp.Gradient):
        return g
    if isinstance(op, eqgp.ValueAndGradient):
        return jnp.concatenate([_f(x)[None], g])
    if isinstance(op, eqgp.Partial):
        return g[np.asarray(op.dims)]
    if isinstance(op, eqgp.Directional):
        return op.directions @ g
    I, J = op.pairs(D)
    return H[I, J]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: type(op).__name__)
def test_apply_contract_size_and_order(op):
    x = jnp.array([0.4, -0.7, 1.1])
    out = op.apply(_f, x)
    assert out.shape == (op.size(D),)
    assert_close(out, _explicit(op, x), rtol=1e-12)
    # A vector-valued function takes the forward-mode path: the same numbers per output.
    vec = op.apply(lambda y: jnp.stack([_f(y), 2 * _f(y)]), x)
    assert_close(vec, jnp.stack([out, 2 * out], axis=-1), rtol=1e-12)
    v = jnp.linspace(-1.0, 1.5, op.size(D))
    assert_close(op.contract(_f, x, v), v @ out, rtol=1e-12)
    assert op.order == {"Value": 0, "Hessian": 2}.get(type(op).__name__, 1)


def test_sizes_and_pairs():
    assert [op.size(4) for op in (eqgp.Value(), eqgp.Gradient(), eqgp.ValueAndGradient())] == [1, 4, 5]
    assert eqgp.Hessian().size(4) == 10 and eqgp.Hessian(diagonal=True).size(4) == 4
    I, J = eqgp.Hessian().pairs(3)  # row-major upper triangle
    assert list(zip(I.tolist(), J.tolist())) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]


def test_operator_errors_name_the_argument():
    with pytest.raises(ValueError, match="`dims` must be distinct"):
        eqgp.Partial([1, 1])
    with pytest.raises(ValueError, match="`dims` must be non-negative integers"):
        eqgp.Partial([-1])
    with pytest.raises(ValueError, match=r"Partial\(dims=\(3,\)\) asks for dimension 3 but the inputs have only 3"):
        eqgp.Partial(3).size(3)
    with pytest.raises(ValueError, match="`v` must have shape"):
        eqgp.Directional(jnp.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="directions of dimension 2 but the inputs have 3"):
        eqgp.Directional(jnp.ones(2)).size(3)


def test_directional_and_partial():
    k = kernels.RBF([0.9, 1.4, 1.1])
    X = _points(4)
    v = jnp.array([0.3, -1.0, 2.0])
    Dv = eqgp.operator_gram(k, (eqgp.Directional(v), X), (eqgp.Value(), X))
    Gr = eqgp.operator_gram(k, (eqgp.Gradient(), X), (eqgp.Value(), X)).reshape(3, 4, 4)
    assert_close(Dv, jnp.einsum("d,dij->ij", v, Gr), rtol=1e-12)
    P = eqgp.operator_gram(k, (eqgp.Partial([2, 0]), X), (eqgp.Partial(1), X))
    full = eqgp.operator_gram(k, (eqgp.Gradient(), X), (eqgp.Gradient(), X)).reshape(3, 4, 3, 4)
    assert_close(P.reshape(2, 4, 1, 4), np.asarray(full)[[2, 0]][:, :, [1]], rtol=1e-12)
