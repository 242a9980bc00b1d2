"""eqgp.gradient_gram (generic autodiff) vs a hand-written closed-form RBF-with-gradients
kernel in JAX, vs the naive jacfwd-of-a-batched-kernel approach, vs GPyTorch's
RBFKernelGrad / Matern52KernelGrad when importable. float64, CPU.

A table, float64, ARD lengthscales, each gram built inside the user's own plain `jax.jit`
(no compiler options): N = 300 at D in {2, 5, 10, 20, 50} and N = 1 000 at D = 5, with ns
per output entry and compile time; RBF against the closed form, Matérn-5/2 at D in {2, 10}.

Run: python benchmarks/derivative_gram.py  (last line: RESULT derivative_gram <ratio>, the
largest eqgp / closed-form ratio over the table; <= 1 means autodiff is as fast as hand code;
with GPyTorch importable also RESULT derivative_gram_vs_gpytorch <the smallest GPyTorch / eqgp
time ratio over the table>).
"""

import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import median_time, paired_ratios, torch_device  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

SIZES = [(300, 2), (300, 5), (300, 10), (300, 20), (300, 50), (1000, 5)]
MATERN_D = (2, 10)


def closed_form_rbf_grad(X1, X2, lengthscale, variance):
    """Hand-written RBF value+gradient gram, written straight into the blocked layout."""
    N, D = X1.shape
    M = X2.shape[0]
    l2 = lengthscale**2
    delta = X1.T[:, :, None] - X2.T[:, None, :]  # (D, N, M)
    dd = delta / l2[:, None, None]
    K = variance * jnp.exp(-0.5 * jnp.sum(delta * dd, axis=0))  # (N, M)
    ones = jnp.ones((1, N, M), X1.dtype)
    u = jnp.concatenate([ones, -dd])  # row factors (a, n, m)
    v = jnp.concatenate([ones, dd])  # column factors (b, n, m)
    C = jnp.diag(jnp.concatenate([jnp.zeros(1, X1.dtype), 1.0 / l2]))  # (a, b)
    A = K[None, :, None, :] * (u[:, :, None, :] * jnp.transpose(v, (1, 0, 2))[None] + C[:, None, :, None])
    return A.reshape(N * (D + 1), M * (D + 1))


def naive_gradient_gram(kernel, X1, X2):
    """jacfwd of the batched (N, D) x (M, D) -> (N, M) kernel, summing out the zeros."""

    def Kmat(A, B):
        return eqgp.gram(kernel, A, B)

    def dK2(A, B):  # (N, M, D): d K_ij / d B_j
        return jnp.einsum("ijjc->ijc", jax.jacfwd(Kmat, argnums=1)(A, B))

    K = Kmat(X1, X2)
    G2 = dK2(X1, X2)
    G1 = jnp.einsum("ijic->ijc", jax.jacfwd(Kmat, argnums=0)(X1, X2))
    H = jnp.einsum("ijcid->ijcd", jax.jacfwd(dK2, argnums=0)(X1, X2))  # (N, M, D2, D1)
    N, D = X1.shape
    M = X2.shape[0]
    top = jnp.concatenate([K[None], jnp.transpose(G2, (2, 0, 1))], axis=0)  # (D+1, N, M) cols
    rows = jnp.concatenate([jnp.transpose(G1, (2, 0, 1))[:, None], jnp.transpose(H, (3, 2, 0, 1))], 1)
    full = jnp.concatenate([top[None], rows], axis=0)  # (a, b, N, M)
    return jnp.transpose(full, (0, 2, 1, 3)).reshape(N * (D + 1), M * (D + 1))


def interleaved_to_blocked(A, N, M, D):
    return A.reshape(N, D + 1, M, D + 1).transpose(1, 0, 3, 2).reshape(N * (D + 1), M * (D + 1))


def gpytorch_paths():
    try:
        import gpytorch
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)
    dev = torch_device(torch)
    print(f"gpytorch runs on {dev}")

    def make(kind, X, ls):
        k = (
            {"rbf": gpytorch.kernels.RBFKernelGrad, "m52": gpytorch.kernels.Matern52KernelGrad}[kind](
                ard_num_dims=X.shape[1]
            )
            .double()
            .to(dev)
        )
        k.lengthscale = torch.tensor(np.asarray(ls), device=dev)[None]
        Xt = torch.tensor(np.asarray(X), device=dev)

        def run():
            with torch.no_grad(), gpytorch.settings.lazily_evaluate_kernels(False):
                out = k(Xt, Xt).to_dense()
            if dev == "cuda":
                torch.cuda.synchronize()
            return out

        return run

    return make


def _compile_time(fn, X):
    t0 = time.perf_counter()
    fn.lower(X).compile()
    return time.perf_counter() - t0


def main():
    rng = np.random.default_rng(0)
    make_torch = gpytorch_paths()
    if make_torch is None:
        print("gpytorch not importable: skipping the GPyTorch column")
    worst, slowest_vs_torch = 0.0, np.inf
    for N, D in SIZES:
        X = jnp.asarray(rng.uniform(0, 3, (N, D)))
        ls = jnp.linspace(0.8, 1.6, D) * np.sqrt(D)
        entries = (N * (D + 1)) ** 2
        kinds = [("rbf", kernels.RBF(ls))] + ([("m52", kernels.Matern52(ls))] if N == 300 and D in MATERN_D else [])
        for name, kern in kinds:
            ours = jax.jit(lambda X, k=kern: eqgp.gradient_gram(k, X, X))
            c_ours = _compile_time(ours, X)
            t_ours = median_time(ours, X, repeats=5)
            line = (
                f"{name} N={N:5d} D={D:2d}: eqgp {t_ours * 1e3:8.1f} ms ({t_ours / entries * 1e9:5.2f} ns/entry, "
                f"compile {c_ours:4.1f} s)"
            )
            if name == "rbf":
                closed = jax.jit(lambda X, ls=ls: closed_form_rbf_grad(X, X, ls, 1.0))
                err = float(jnp.max(jnp.abs(ours(X) - closed(X))))
                assert err < 1e-12, err
                c_closed = _compile_time(closed, X)
                # The ratio is the median of per-round ratios, the two run back to back in each
                # round (more rounds for the small, millisecond cases), so drift cancels.
                rounds = 31 if entries < 1e7 else 5
                t_closed, r = paired_ratios(
                    lambda c=closed, X=X: jax.block_until_ready(c(X)),
                    {"eqgp": lambda o=ours, X=X: jax.block_until_ready(o(X))},
                    rounds=rounds,
                )
                ratio = r["eqgp"][1]
                line += (
                    f" | closed form {t_closed * 1e3:8.1f} ms ({t_closed / entries * 1e9:5.2f} ns/entry, "
                    f"compile {c_closed:4.1f} s) | eqgp/closed {ratio:5.2f} (median of {rounds} paired rounds)"
                )
                worst = max(worst, ratio)
            if make_torch is not None:
                run = make_torch(name, X, ls)
                theirs = interleaved_to_blocked(jnp.asarray(run().cpu().numpy()), N, N, D)
                err = float(jnp.max(jnp.abs(ours(X) - theirs)))
                assert err < 1e-10, err
                # Paired as well: absolute times swing from run to run here (the machine's other
                # load; past 32 MiB, page faults of each call's freshly mapped output).
                t_ref, r = paired_ratios(
                    lambda o=ours, X=X: jax.block_until_ready(o(X)), {"torch": run}, rounds=3 if D >= 20 else 7
                )
                speedup = r["torch"][1]
                line += f" | gpytorch {speedup * t_ref * 1e3:8.1f} ms | gpytorch/eqgp {speedup:5.1f}x (paired)"
                slowest_vs_torch = min(slowest_vs_torch, speedup)
            print(line, flush=True)
            del ours
    # The naive approach at N = 100, D = 2.
    X = jnp.asarray(rng.uniform(0, 3, (100, 2)))
    kern = kernels.RBF(jnp.array([0.9, 1.3]))
    ours = jax.jit(lambda X: eqgp.gradient_gram(kern, X, X))
    naive = jax.jit(lambda X: naive_gradient_gram(kern, X, X))
    err = float(jnp.max(jnp.abs(ours(X) - naive(X))))
    assert err < 1e-12, err
    t_ours, t_naive = median_time(ours, X), median_time(naive, X)
    print(
        f"rbf N=100 D=2: eqgp {t_ours * 1e3:.2f} ms | naive jacfwd {t_naive * 1e3:.2f} ms | naive/eqgp {t_naive / t_ours:.1f}x"  # noqa: E501
    )
    if make_torch is not None:
        print(f"RESULT derivative_gram_vs_gpytorch {slowest_vs_torch:.2f}")
    print(f"RESULT derivative_gram {worst:.3f}")


if __name__ == "__main__":
    sys.exit(main())
