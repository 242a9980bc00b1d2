import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_close, tol
from jax.test_util import check_grads

import eqgp
from eqgp import kernels
from eqgp._linalg import HAVE_NATIVE_INVERSE, cholesky_inverse, cholesky_inverse_t, factor_inverse_t, factor_t


def _spd(key, shape, dtype):
    n = shape[-1]
    A = jax.random.normal(key, shape, dtype)
    return A @ jnp.swapaxes(A, -1, -2) + jnp.broadcast_to(n * jnp.eye(n, dtype=dtype), shape)


def test_native_inverse_is_available_on_cpu():
    # scipy (a dependency of jax) provides LAPACK; without it every test below would
    # only exercise the generic path.
    assert HAVE_NATIVE_INVERSE
    L = jnp.linalg.cholesky(_spd(jax.random.key(0), (5, 5), jnp.float64))
    hlo = jax.jit(cholesky_inverse).trace(L).lower(lowering_platforms=("cpu",)).as_text()
    assert "eqgp_cholesky_inverse" in hlo


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (2, 2), (37, 37), (3, 20, 20), (2, 2, 6, 6)])
def test_cholesky_inverse_matches_inv(dtype, shape):
    K = _spd(jax.random.key(1), shape, jnp.float64)
    L = jnp.linalg.cholesky(K).astype(dtype) if shape[-1] else K.astype(dtype)
    out = jax.jit(cholesky_inverse)(L)
    assert out.shape == shape and out.dtype == dtype
    if shape[-1]:
        ref = jnp.linalg.inv(K)
        scale = float(jnp.max(jnp.abs(ref)))
        assert_close(out / scale, ref / scale, **tol(dtype))
        assert_close(out, jnp.swapaxes(out, -1, -2), rtol=0, atol=0)  # exactly symmetric


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (37, 37), (3, 20, 20)])
def test_factor_inverse_t_is_the_inverse_of_the_transposed_factor(dtype, shape):
    """LAPACK ?trtri in place (M = L^{-T}, K^{-1} = M M^T) against solve_triangular, batched,
    both precisions, the other triangle zero; vmap and derivatives through the factorisation."""
    K = _spd(jax.random.key(8), shape, jnp.float64).astype(dtype)
    hlo = jax.jit(lambda K: factor_inverse_t(factor_t(K))).trace(K).lower(lowering_platforms=("cpu",)).as_text()
    assert shape[-1] == 0 or "eqgp_cholesky_inverse" in hlo
    M = jax.jit(lambda K: factor_inverse_t(factor_t(K)))(K)
    assert M.shape == shape and M.dtype == dtype
    if shape[-1]:
        Lt = jnp.swapaxes(jnp.linalg.cholesky(K.astype(jnp.float64)), -1, -2)
        ref = jax.scipy.linalg.solve_triangular(Lt, jnp.broadcast_to(jnp.eye(shape[-1]), shape), lower=False)
        assert_close(M, ref.astype(dtype), **tol(dtype))
        assert_close(jnp.tril(M, -1), jnp.zeros_like(M), rtol=0, atol=0)
        Kinv = jnp.linalg.inv(K.astype(jnp.float64))
        scale = float(jnp.max(jnp.abs(Kinv)))
        assert_close((M @ jnp.swapaxes(M, -1, -2)) / scale, Kinv.astype(dtype) / scale, **tol(dtype))
    if shape == (37, 37) and dtype == jnp.float64:
        f = lambda B: factor_inverse_t(factor_t(0.5 * (B + B.T)))  # noqa: E731
        check_grads(f, (K[:8, :8],), order=2, modes=("fwd", "rev"))


def test_cholesky_inverse_ignores_the_upper_triangle():
    L = jnp.linalg.cholesky(_spd(jax.random.key(2), (6, 6), jnp.float64))
    junk = L + jnp.triu(jnp.ones_like(L), 1)
    assert_close(cholesky_inverse(junk), cholesky_inverse(L), rtol=1e-14)


def test_cholesky_inverse_vmap_and_grads():
    L = jnp.linalg.cholesky(_spd(jax.random.key(3), (4, 7, 7), jnp.float64))
    assert_close(jax.vmap(cholesky_inverse)(L), jnp.linalg.inv(L @ jnp.swapaxes(L, -1, -2)), rtol=1e-10)
    check_grads(lambda M: cholesky_inverse(jnp.tril(M)), (L[0],), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (2, 2), (37, 37), (3, 20, 20), (2, 2, 6, 6)])
def test_factor_t_is_the_transposed_cholesky_factor(dtype, shape):
    """The in-place factorisation (LAPACK ?potrf on the row-major buffer) against
    jnp.linalg.cholesky, batched, in both precisions; its inverse against jnp.linalg.inv."""
    K = _spd(jax.random.key(4), shape, jnp.float64).astype(dtype)
    Lt = jax.jit(factor_t)(K)
    assert Lt.shape == shape and Lt.dtype == dtype
    if shape[-1]:
        ref = jnp.swapaxes(jnp.linalg.cholesky(K), -1, -2)
        assert_close(Lt, ref, **tol(dtype))
        assert float(jnp.max(jnp.abs(jnp.tril(Lt, -1)))) == 0.0  # the other triangle is zeroed
        inv = jax.jit(cholesky_inverse_t)(Lt)
        ref_inv = jnp.linalg.inv(K.astype(jnp.float64))
        scale = float(jnp.max(jnp.abs(ref_inv)))
        assert_close(inv / scale, ref_inv / scale, **tol(dtype))
        assert_close(inv, jnp.swapaxes(inv, -1, -2), rtol=0, atol=0)  # exactly symmetric


def test_factor_t_in_place_keeps_a_live_input_and_marks_failure_with_nan():
    K = _spd(jax.random.key(5), (9, 9), jnp.float64)

    def both(K):  # the input is read again after the factorisation: XLA must copy it first
        Lt = factor_t(K)
        return Lt, K + 0.0, cholesky_inverse_t(Lt), Lt[0, 0]

    Lt, K2, inv, first = jax.jit(both)(K)
    assert_close(K2, K, rtol=0, atol=0)
    assert_close(Lt, jnp.linalg.cholesky(K).T, rtol=1e-12)
    assert float(first) == float(Lt[0, 0])  # the factor survives its inverse being taken
    assert_close(inv, jnp.linalg.inv(K), rtol=1e-10)
    bad = K.at[3, 3].set(-1.0)
    assert bool(jnp.all(jnp.isnan(jax.jit(factor_t)(bad))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_tiled_factorisation_equals_lapacks(dtype):
    # Large orders (> 8 192) are factored in tiles (scipy's OpenBLAS 0.3.30 segfaults in its
    # threaded ?potrf from ~16 384); here with small tiles: whole tiles, a ragged last tile, a
    # tile larger than the matrix, a batch, and a failure in a later tile (NaN throughout).
    from eqgp._linalg import _native_factor_t

    if not HAVE_NATIVE_INVERSE:
        pytest.skip("no native LAPACK")
    none = jnp.zeros((0,), dtype)
    for shape, tile in (((64, 64), 16), ((50, 50), 16), ((33, 33), 100), ((2, 40, 40), 7)):
        K = _spd(jax.random.key(shape[-1]), shape, jnp.float64).astype(dtype)
        tiled = jax.jit(lambda K, t=tile: _native_factor_t(K, none, tile=t))(K)
        whole = jax.jit(lambda K: _native_factor_t(K, none, tile=0))(K)
        assert_close(tiled, whole, **tol(dtype))
        assert float(jnp.max(jnp.abs(jnp.tril(tiled, -1)))) == 0.0
    bad = jnp.eye(40, dtype=dtype).at[30, 30].set(-1.0)
    assert bool(jnp.all(jnp.isnan(jax.jit(lambda K: _native_factor_t(K, none, tile=16))(bad))))


def test_factor_t_reads_one_triangle_and_has_the_cholesky_derivatives():
    K = _spd(jax.random.key(6), (6, 6), jnp.float64)
    junk = K + jnp.tril(jnp.ones_like(K), -1)  # the lower triangle is not read
    assert_close(factor_t(junk), factor_t(K), rtol=1e-14)
    sym = lambda M: factor_t(0.5 * (M + M.T))  # noqa: E731
    check_grads(sym, (K,), order=2, modes=("fwd", "rev"))
    ref = jax.jacfwd(lambda M: jnp.linalg.cholesky(0.5 * (M + M.T)).T)(K)
    assert_close(jax.jacfwd(sym)(K), ref, rtol=1e-10, atol=1e-12)
    assert_close(jax.vmap(factor_t)(jnp.stack([K, 2 * K])), jnp.stack([factor_t(K), factor_t(2 * K)]), rtol=1e-14)
    check_grads(lambda M: cholesky_inverse_t(jnp.triu(M)), (factor_t(K),), order=2, modes=("fwd", "rev"))


def test_compiler_options_are_opt_in_and_entry_points_work_inside_and_outside_jit():
    opts = eqgp.compiler_options()
    assert set(opts) <= {"xla_cpu_experimental_ynn_fusion_type"}  # empty where XLA lacks the option
    X = jnp.linspace(0.0, 1.0, 4)[:, None]
    k = kernels.RBF(0.5)
    top = eqgp.gradient_gram(k, X, X)
    inner = jax.jit(lambda X: eqgp.gradient_gram(k, X, X))(X)
    closed = jax.jit(lambda: eqgp.gradient_gram(k, X, X))()  # inside a trace, no traced argument
    assert_close(top, inner, rtol=1e-14)
    assert_close(top, closed, rtol=1e-14)
    np.testing.assert_equal(np.asarray(top).shape, (8, 8))
    # `fit` compiles with XLA's defaults unless given options; both train the same model.
    obs = eqgp.Observations.values(X, jnp.sin(3 * X[:, 0]))
    gp = eqgp.GaussianProcess(k, noise=1e-2)
    loss = lambda m, obs: -m.log_marginal_likelihood(obs)  # noqa: E731
    _, plain = eqgp.fit(gp, loss, optax.adam(1e-2), 3, obs, progress=False)
    _, tuned = eqgp.fit(gp, loss, optax.adam(1e-2), 3, obs, progress=False, compiler_options=opts)
    assert_close(plain, tuned, rtol=1e-12)
