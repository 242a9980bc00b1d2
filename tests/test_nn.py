import equinox as eqx
import jax
import jax.numpy as jnp
from helpers import assert_close, sumcumprod_quadratic

import eqgp


def test_layer_forward_and_transforms():
    layer = eqgp.nn.SumCumProd()
    x = jax.random.uniform(jax.random.key(0), (4, 6), jnp.float64, 0.2, 1.0)
    assert_close(eqx.filter_jit(layer)(x), sumcumprod_quadratic(x), rtol=1e-12)
    assert_close(eqx.filter_vmap(layer)(x), sumcumprod_quadratic(x), rtol=1e-12)


def test_layer_in_model_filter_grad():
    key = jax.random.key(1)
    model = eqx.nn.Sequential([eqx.nn.Linear(3, 5, key=key), eqx.nn.Lambda(jax.nn.sigmoid), eqgp.nn.SumCumProd()])
    x = jnp.array([0.1, -0.4, 0.7])

    @eqx.filter_grad
    def loss(m):
        return jnp.sum(m(x) ** 2)

    g = loss(model)
    # Compare with the same model using the pure-JAX reference.
    ref = eqx.nn.Sequential([model[0], model[1], eqx.nn.Lambda(eqgp.ops.sumcumprod_reference)])
    g_ref = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(ref)
    assert_close(g[0].weight, g_ref[0].weight, rtol=1e-12)


def test_warped_kernel_through_native_op():
    # jacfwd through the op: derivative blocks of a kernel on SumCumProd-warped inputs.
    warp = eqx.nn.Sequential([eqx.nn.Lambda(jax.nn.sigmoid), eqgp.nn.SumCumProd()])
    warp_ref = eqx.nn.Sequential([eqx.nn.Lambda(jax.nn.sigmoid), eqx.nn.Lambda(eqgp.ops.sumcumprod_reference)])
    X = jax.random.normal(jax.random.key(2), (5, 3))
    k = eqgp.kernels.Warped(eqgp.kernels.RBF(1.3), warp)
    k_ref = eqgp.kernels.Warped(eqgp.kernels.RBF(1.3), warp_ref)
    assert_close(eqgp.gradient_gram(k, X, X), eqgp.gradient_gram(k_ref, X, X), rtol=1e-11, atol=1e-13)
    H = eqgp.operator_gram(k, (eqgp.Hessian(), X), (eqgp.Hessian(), X))
    H_ref = eqgp.operator_gram(k_ref, (eqgp.Hessian(), X), (eqgp.Hessian(), X))
    assert_close(H, H_ref, rtol=1e-9, atol=1e-11)
