"""Adding one evaluation (value + gradient) to a conditioned GP, as Bayesian optimisation does:
`Posterior.update` (extends the Cholesky factor) vs `condition` afresh on all observations.
N = 666 points in D = 2 with gradients (1 998 rows) plus 1 new point (3 rows), float64, CPU.
Then the same with the matrix-free `ConjugateGradient` solver, whose `update` warm-starts CG
from the old solution: `RESULT posterior_update_cg <fresh / update>`.

Last line: RESULT posterior_update <fresh condition time / update time> (the speed-up).
"""

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _timing import median_time  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

N, D = 666, 2


def main():
    f = lambda x: jnp.sin(2 * x[0]) * jnp.cos(x[1])  # noqa: E731
    vg = jax.vmap(jax.value_and_grad(f))
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -3, 3)
    Xn = jax.random.uniform(jax.random.key(1), (1, D), jnp.float64, -3, 3)
    (y, G), (yn, Gn) = vg(X), vg(Xn)
    old = eqgp.Observations.values_and_gradients(X, y, G)
    new = eqgp.Observations.values_and_gradients(Xn, yn, Gn)
    both = eqgp.Observations(*old.groups, *new.groups)
    gp = eqgp.GaussianProcess(kernels.RBF([1.0, 1.3]), noise=1e-4)
    post = gp.condition(old)
    update = eqx.filter_jit(lambda p, o: p.update(o).alpha)
    fresh = eqx.filter_jit(lambda m, o: m.condition(o).alpha)
    want = fresh(gp, both)
    err = float(jnp.max(jnp.abs(update(post, new) - want)) / jnp.max(jnp.abs(want)))
    t_update = median_time(update, post, new)
    t_fresh = median_time(fresh, gp, both)
    cg = eqx.tree_at(lambda m: m.solver, gp, eqgp.ConjugateGradient(rtol=1e-8, preconditioner_rank=100))
    post_cg = cg.condition(old)
    err_cg = float(jnp.max(jnp.abs(update(post_cg, new) - want)) / jnp.max(jnp.abs(want)))
    t_update_cg = median_time(update, post_cg, new)
    t_fresh_cg = median_time(fresh, cg, both)
    print(f"rows: {old.size} + {new.size}; relative difference of alpha {err:.1e}")
    print(f"Cholesky: update {t_update * 1e3:.1f} ms | fresh condition {t_fresh * 1e3:.1f} ms")
    print(
        f"ConjugateGradient (rtol 1e-8, rank 100): warm-started update {t_update_cg * 1e3:.1f} ms | "
        f"fresh condition {t_fresh_cg * 1e3:.1f} ms; alpha vs Cholesky {err_cg:.1e}"
    )
    print(f"RESULT posterior_update_cg {t_fresh_cg / t_update_cg:.2f}")
    print(f"RESULT posterior_update {t_fresh / t_update:.2f}")


if __name__ == "__main__":
    main()
