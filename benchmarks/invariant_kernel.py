"""`kernels.Invariant`: the group as one batched evaluation against a Python loop over the group.

Ethanol-shaped inputs (9 atoms, D = 27 Cartesian coordinates) and its 12 bond-graph
permutations (`eqgp.molecular_permutations`); the energy-and-force gram (`gradient_gram`, values
and gradients) of N configurations for an RBF base kernel. Ours: `Invariant(base, perms)`, one
compiled program that evaluates the 12 group elements as a `vmap` batch inside the kernel.
Reference: the same mean written as a Python loop over the group, `sum_g gradient_gram(k_g)`
with `k_g(x1, x2) = base(x1, g x2)`, each term its own compiled program (equal results are
checked). Medians of repeated runs; the ratio ours / loop.

Run: `python benchmarks/invariant_kernel.py [--points N]`.
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _timing import median_time

import eqgp
from eqgp import kernels

jax.config.update("jax_enable_x64", True)

ETHANOL_Z = [6, 6, 8, 1, 1, 1, 1, 1, 1]
ETHANOL_R = np.array(
    [
        [1.1879, -0.3829, 0.0],
        [0.0, 0.5526, 0.0],
        [-1.1867, -0.2472, 0.0],
        [-1.9237, 0.3850, 0.0],
        [2.0985, 0.2306, 0.0],
        [1.1184, -1.0093, 0.8869],
        [1.1184, -1.0093, -0.8869],
        [0.0227, 1.1812, 0.8852],
        [0.0227, 1.1812, -0.8852],
    ]
)


class _Moved(kernels.AbstractKernel):
    """`base(x1, g x2)` for one permutation `g`: one term of the loop."""

    base: kernels.AbstractKernel
    perm: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, x1, x2):
        return self.base(x1, x2[jnp.asarray(self.perm)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=50)
    args = parser.parse_args()
    perms = eqgp.molecular_permutations(ETHANOL_Z, ETHANOL_R)
    G, D = perms.shape
    X = jnp.asarray(ETHANOL_R.reshape(-1)) + 0.1 * jax.random.normal(jax.random.key(0), (args.points, D))
    base = kernels.RBF(2.0)
    ours = jax.jit(lambda X: eqgp.gradient_gram(kernels.Invariant(base, perms), X, X))
    terms = [jax.jit(lambda X, k=_Moved(base, tuple(int(i) for i in p)): eqgp.gradient_gram(k, X, X)) for p in perms]

    def loop(X):
        total = terms[0](X)
        for term in terms[1:]:
            total = total + term(X)
        return total / G

    error = float(jnp.max(jnp.abs(ours(X) - loop(X))) / jnp.max(jnp.abs(loop(X))))
    plain = jax.jit(lambda X: eqgp.gradient_gram(base, X, X))
    t_ours, t_loop, t_plain = median_time(ours, X), median_time(loop, X), median_time(plain, X)
    rows = args.points * (D + 1)
    print(f"backend {jax.default_backend()}; N={args.points}, D={D}, |G|={G}: a ({rows}, {rows}) gram")
    print(
        f"batched group {t_ours * 1e3:.1f} ms, Python loop {t_loop * 1e3:.1f} ms; max relative difference {error:.1e}"
    )
    print(f"the base kernel alone {t_plain * 1e3:.1f} ms: the group costs {t_ours / t_plain:.1f}x it (|G| = {G})")
    print(f"RESULT invariant_kernel_vs_loop {t_ours / t_loop:.3f}")


if __name__ == "__main__":
    main()
