"""The matrix-free product and its pullback, and the ConjugateGradient likelihood and a
posterior mean, sharded over 4 simulated CPU devices, equal the single-device results.
XLA's device count is fixed when jax starts, so this runs in a subprocess
(one, for both: the unsharded reference runs on its first device)."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np, equinox as eqx
    jax.config.update("jax_enable_x64", True)
    import eqgp
    from eqgp import kernels
    assert len(jax.devices()) == 4, jax.devices()
    X = jax.random.uniform(jax.random.key(0), (37, 2), jnp.float64, -2, 2)  # not a multiple of 4
    f = lambda x: jnp.sin(x[0]) * x[1]
    obs = eqgp.Observations(
        (eqgp.ValueAndGradient(), X, jnp.concatenate([jax.vmap(f)(X)[:, None], jax.vmap(jax.grad(f))(X)], 1)),
        (eqgp.Partial(1), X[:5] + 0.1, jnp.ones(5)),
    )
    groups = tuple((g.operator, g.X) for g in obs.groups)
    V = jax.random.normal(jax.random.key(1), (obs.size, 3), jnp.float64)
    U = jax.random.normal(jax.random.key(2), (obs.size, 3), jnp.float64)
    for shard in (True, False):
        cov = eqgp.Covariance(kernels.RBF([0.8, 1.2]), groups, jnp.full(obs.size, 1e-2))
        out = eqx.filter_jit(lambda c, V: c.mv(V, tile_bytes=2**14, shard=shard))(cov, V)
        if shard:
            assert len(out.sharding.device_set) == 4, out.sharding  # the product ran on every device
            ref = cov.as_matrix() @ V
            assert float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref))) < 1e-12
        g = eqx.filter_jit(lambda c: c.pullback(U, V, tile_bytes=2**14, shard=shard))(cov)
        # Through the GP: the matrix-free likelihood, its gradient and a posterior mean.
        solver = eqgp.ConjugateGradient(rtol=1e-10, preconditioner_rank=5, num_probes=2, tile_bytes=2**14, shard=shard)
        gp = eqgp.GaussianProcess(kernels.RBF([0.8, 1.2]), noise=1e-2, solver=solver)
        # (Its gradient is the pullback above with the solver's pieces: not compiled again here.)
        nlml = eqx.filter_jit(lambda m: m.log_marginal_likelihood(obs))(gp)
        mean = eqx.filter_jit(lambda m: m.condition(obs).mean(X[:3] + 0.1))(gp)
        leaves = [a.ravel() for a in jax.tree.leaves(g)]
        vals = jnp.concatenate([out.ravel(), nlml[None], mean, *leaves])
        print("RESULT", shard, *[repr(float(x)) for x in vals])
    """
)


@pytest.mark.slow
def test_sharded_equals_unsharded():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"  # simulated CPU devices, also on a machine with a GPU
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {line.split()[1]: line.split()[2:] for line in out.stdout.splitlines() if line.startswith("RESULT")}
    a = [float(x) for x in lines["True"]]
    b = [float(x) for x in lines["False"]]
    assert len(a) == len(b) > 1
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-8 * max(1.0, abs(y)), (a, b)
