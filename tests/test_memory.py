import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import anon_huge_bytes, lowered_custom_calls, thp_advisable

import eqgp
from eqgp import _memory, _native, kernels


def _gram(X):
    return eqgp.gradient_gram(kernels.RBF([0.7, 1.3]), X, X)


# (2 100, 2 100) float64: 34 MiB, just over the threshold.
_X = jax.random.uniform(jax.random.key(5), (700, 2), jnp.float64, -2.0, 2.0)


def _without_huge_pages(monkeypatch, fn, *args):
    monkeypatch.setattr(_memory, "LARGE_OUTPUT_BYTES", 1 << 62)
    jax.clear_caches()  # eqgp's grams are jitted: retrace with the threshold out of reach
    try:
        return fn(*args)
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_small_arrays_are_returned_as_they_are():
    x = jnp.ones((4, 4))
    assert _memory.in_huge_pages(x) is x


@pytest.mark.skipif("cpu" not in _native.BUILT_PLATFORMS, reason="needs the native CPU extension")
def test_large_gram_goes_into_the_huge_page_buffer_and_is_exact(monkeypatch):
    f = jax.jit(_gram)
    assert f.lower(_X).compile().as_text().count("eqgp_zeros") == 1
    K = f(_X)
    assert K.nbytes >= _memory.LARGE_OUTPUT_BYTES
    ref = _without_huge_pages(monkeypatch, lambda X: jax.jit(_gram)(X), _X)
    np.testing.assert_array_equal(np.asarray(K), np.asarray(ref))


@pytest.mark.skipif("cpu" not in _native.BUILT_PLATFORMS, reason="needs the native CPU extension")
@pytest.mark.skipif(not thp_advisable(), reason="needs Linux transparent huge pages (madvise or always)")
def test_large_gram_lies_in_huge_pages():
    K = jax.jit(_gram)(_X)
    K.block_until_ready()
    huge = anon_huge_bytes(K.unsafe_buffer_pointer())
    if huge is None:
        pytest.skip("the gram is not in an anonymous mapping of its own")
    assert huge >= K.nbytes - (4 << 20), (huge, K.nbytes)  # all but the partial 2 MiB stretches at the ends


@pytest.mark.skipif("cpu" not in _native.BUILT_PLATFORMS, reason="needs the native CPU extension")
def test_gradients_and_vmap_through_the_buffer(monkeypatch):
    # The buffer is a constant (zeros) added to the result: gradients and batching pass
    # through unchanged (under vmap the sum broadcasts, which is correct if not faster).
    def loss(ls):
        return jnp.sum(eqgp.gradient_gram(kernels.RBF(ls), _X, _X) ** 2)

    ls = jnp.array([0.7, 1.3])
    g = jax.jit(jax.grad(loss))(ls)
    g_ref = _without_huge_pages(monkeypatch, lambda v: jax.jit(jax.grad(loss))(v), ls)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12)
    lss = jnp.stack([ls, 1.1 * ls])
    batched = jax.jit(jax.vmap(lambda v: eqgp.gradient_gram(kernels.RBF(v), _X, _X)[::97, ::89]))(lss)
    for b, v in zip(batched, lss):  # batching changes XLA's fusions: equal to rounding
        np.testing.assert_allclose(b, eqgp.gradient_gram(kernels.RBF(v), _X, _X)[::97, ::89], rtol=1e-13, atol=1e-15)


def test_other_platforms_lower_without_the_buffer():
    # The native buffer is CPU-only: a lowering for CUDA takes the plain branch.
    assert "eqgp_zeros" not in lowered_custom_calls(_gram, _X, platform="cuda")
    if "cpu" in _native.BUILT_PLATFORMS:  # and the same lowering for CPU does take it
        assert "eqgp_zeros" in lowered_custom_calls(_gram, _X, platform="cpu")
