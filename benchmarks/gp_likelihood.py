"""Negative log marginal likelihood + gradient of a value+gradient GP (RBF, ARD),
n = 300 points in d = 2 (a 900 x 900 joint matrix; first a high-D row, n = 200 in d = 10,
2 200 x 2 200), float64, CPU:
eqgp (hand-written backward: 1/2 tr((K^-1 - a a^T) dK) pulled back through the gram,
K^-1 by LAPACK potri, the pullback over the symmetric half of the point pairs) vs autodiff
through the Cholesky in the same process, vs GPyTorch's exact GP with RBFKernelGrad and
forced Cholesky when importable.

Both JAX paths are timed twice: under a plain `eqx.filter_jit`, and with
`eqgp.compiler_options()` (opt-in: passed to your own top-level jit or to `eqgp.fit`; it turns off XLA:CPU's
YNNPACK fusions, whose reductions over the point pairs cost ~1.2x at d = 2 here, nothing at
d = 10).

Then the posterior at both sizes: conditioning plus means and variances of values and
gradients at 200 new points, plain vs the options.

RESULT lines: gp_likelihood_plain_vs_options (the larger of the two rows' paired medians);
gp_posterior_plain_vs_options (likewise for the posterior);
gp_likelihood_tuned_compiler_options (eqgp with `eqgp.compiler_options()` / gpytorch, a
tuned figure); last, RESULT gp_likelihood <eqgp under a plain filter_jit / gpytorch>, the
default a user gets (/ autodiff through the Cholesky, also plain, without GPyTorch).
"""

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import median_time, paired_ratios, torch_device  # noqa: E402

import eqgp  # noqa: E402
from eqgp import kernels  # noqa: E402

N, D = 300, 2


def data(N=N, D=D):
    X = jax.random.uniform(jax.random.key(0), (N, D), jnp.float64, -3, 3)
    f = lambda x: jnp.sin(x[0]) * jnp.cos(x[1]) + (0.1 * jnp.sum(jnp.sin(x[2:])) if D > 2 else 0.0)  # noqa: E731
    y, G = jax.vmap(jax.value_and_grad(f))(X)
    return X, y, G


def autodiff_nlml(gp, obs):
    """The same model, differentiated straight through jnp.linalg.cholesky."""
    K = eqgp.operator_gram(gp.kernel, obs, obs)
    n = K.shape[0]
    K = K + gp.noise[0] * jnp.eye(n, dtype=K.dtype)
    L = jnp.linalg.cholesky(K)
    r = obs.flat_targets()
    a = jax.scipy.linalg.cho_solve((L, True), r)
    return 0.5 * (r @ a) + jnp.sum(jnp.log(jnp.diagonal(L))) + 0.5 * n * np.log(2 * np.pi)


def gpytorch_timer(X, y, G, ls, noise):
    try:
        import gpytorch
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)
    dev = torch_device(torch)
    Xt = torch.tensor(np.asarray(X), device=dev)
    Yt = torch.tensor(np.concatenate([np.asarray(y)[:, None], np.asarray(G)], 1), device=dev)

    class Model(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(Xt, Yt, likelihood)
            self.mean_module = gpytorch.means.ConstantMeanGrad()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad(ard_num_dims=D))

        def forward(self, x):
            return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))

    lik = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=D + 1, has_global_noise=False).double()
    model = Model(lik).double().to(dev)
    model.covar_module.base_kernel.lengthscale = torch.tensor(np.asarray(ls), device=dev)[None]
    model.covar_module.outputscale = 1.0
    model.mean_module.constant.data.zero_()
    lik.task_noises = torch.full((D + 1,), noise, dtype=torch.float64, device=dev)
    model.train()
    lik.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)

    def run():
        model.zero_grad()
        with gpytorch.settings.max_cholesky_size(10**6), gpytorch.settings.fast_computations(False, False, False):
            loss = -mll(model(Xt), Yt) * Yt.numel()
        loss.backward()
        return loss.item()  # waits for the device

    print(f"gpytorch runs on {dev}")
    return run


def timed_row(n: int, d: int, ls, noise):
    """eqgp's NLML + gradient vs autodiff through the Cholesky, plain and with the options."""
    X, y, G = data(n, d)
    gp = eqgp.GaussianProcess(kernels.RBF(ls), noise=noise)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    ours_loss = eqx.filter_value_and_grad(lambda m: -m.log_marginal_likelihood(obs))
    ref_loss = eqx.filter_value_and_grad(lambda m: autodiff_nlml(m, obs))
    opts = eqgp.compiler_options()
    ours, ref = eqx.filter_jit(ours_loss), eqx.filter_jit(ref_loss)
    ours_o = eqx.filter_jit(ours_loss, compiler_options=opts)
    ref_o = eqx.filter_jit(ref_loss, compiler_options=opts)
    (v1, g1), (v2, g2), (_, g3) = ours(gp), ref(gp), ours_o(gp)
    assert abs(float(v1 - v2)) < 1e-8 * abs(float(v2)), (v1, v2)
    for a, b, c in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), jax.tree.leaves(g3)):
        np.testing.assert_allclose(a, b, rtol=1e-7)
        np.testing.assert_allclose(c, b, rtol=1e-7)
    reps = 11 if n * (d + 1) <= 1000 else 5
    t_plain = median_time(ours, gp, repeats=reps)
    t_ref_plain = median_time(ref, gp, repeats=reps)
    t_ours = median_time(ours_o, gp, repeats=reps)
    t_ref = median_time(ref_o, gp, repeats=reps)
    chol = jax.jit(jnp.linalg.cholesky)
    K = eqgp.gradient_gram(gp.kernel, X, X) + noise * jnp.eye(n * (d + 1))
    t_chol = median_time(chol, K)
    print(f"n={n} d={d} ({n * (d + 1)} x {n * (d + 1)}), float64")
    print(
        f"plain filter_jit:  eqgp nlml+grad {t_plain * 1e3:7.1f} ms | autodiff through Cholesky"
        f" {t_ref_plain * 1e3:7.1f} ms"
    )
    print(f"with the options:  eqgp nlml+grad {t_ours * 1e3:7.1f} ms | autodiff through Cholesky {t_ref * 1e3:7.1f} ms")
    _, paired = paired_ratios(
        lambda: jax.block_until_ready(ours_o(gp)), {"plain": lambda: jax.block_until_ready(ours(gp))}, rounds=reps
    )
    plain_vs_options = paired["plain"][1]
    ratios = f"(plain {t_plain / t_ref_plain:.3f}); plain/options {plain_vs_options:.2f} (median, {reps} paired rounds)"
    print(f"eqgp/autodiff {t_ours / t_ref:.3f} {ratios}")
    print(f"one Cholesky alone:          {t_chol * 1e3:8.1f} ms")
    calls = (lambda: jax.block_until_ready(ours(gp)), lambda: jax.block_until_ready(ours_o(gp)))
    return X, y, G, float(v1), t_plain, t_ours, t_ref, t_ref_plain, plain_vs_options, calls


def posterior_row(n: int, d: int, ls, noise, m: int = 200):
    """Conditioning and predicting values and gradients with variances at m new points (what a
    surrogate model does per step), plain filter_jit vs the options, paired rounds."""
    X, y, G = data(n, d)
    Xs = jax.random.uniform(jax.random.key(3), (m, d), jnp.float64, -3, 3)
    gp = eqgp.GaussianProcess(kernels.RBF(ls), noise=noise)
    obs = eqgp.Observations.values_and_gradients(X, y, G)
    op = eqgp.ValueAndGradient()

    def predict(model):
        post = model.condition(obs)
        return post.mean(Xs, op), post.variance(Xs, op)

    plain = eqx.filter_jit(predict)
    options = eqx.filter_jit(predict, compiler_options=eqgp.compiler_options())
    for a, b in zip(plain(gp), options(gp)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    t_options, r = paired_ratios(
        lambda: jax.block_until_ready(options(gp)), {"plain": lambda: jax.block_until_ready(plain(gp))}, rounds=11
    )
    ratio = r["plain"][1]
    print(
        f"posterior (condition + mean and variance of values and gradients at {m} points), n={n} d={d}:"
        f" {t_options * 1e3:.1f} ms with the options, plain/options {ratio:.2f} (median, 11 paired rounds)"
    )
    return ratio


def main():
    ls = jnp.array([0.9, 1.4])
    noise = 1e-3
    print(f"compiler options: {eqgp.compiler_options()}")
    high = timed_row(200, 10, jnp.full(10, 2.0), noise)[-2]  # the high-D row (2 200 rows)
    X, y, G, v1, t_plain, t_ours, t_ref, t_ref_plain, low, (plain_call, options_call) = timed_row(N, D, ls, noise)
    print(f"RESULT gp_likelihood_plain_vs_options {max(low, high):.3f}")
    post = max(posterior_row(N, D, ls, noise), posterior_row(200, 10, jnp.full(10, 2.0), noise))
    print(f"RESULT gp_posterior_plain_vs_options {post:.3f}")
    run = gpytorch_timer(X, y, G, ls, noise)
    if run is None:
        print("gpytorch not importable: skipping the GPyTorch comparison; ratios against autodiff instead")
        print(f"RESULT gp_likelihood_tuned_compiler_options {t_ours / t_ref:.3f}")
        print(f"RESULT gp_likelihood {t_plain / t_ref_plain:.3f}")
        return
    nl = run()
    # GPyTorch's loss includes the prior terms of its modules (none here): it equals ours.
    assert abs(nl - v1) < 1e-6 * abs(nl), (nl, v1)
    # Paired rounds, as above: GPyTorch / eqgp back to back, the median of the ratios.
    t_eqgp, r = paired_ratios(plain_call, {"torch": run}, rounds=11)
    _, r_o = paired_ratios(options_call, {"torch": run}, rounds=11)
    plain_vs_torch, options_vs_torch = 1 / r["torch"][1], 1 / r_o["torch"][1]
    print(
        f"gpytorch (RBFKernelGrad, Cholesky): {t_eqgp / plain_vs_torch * 1e3:7.1f} ms | eqgp/gpytorch, plain filter_jit"
        f" {plain_vs_torch:.3f}, with the options {options_vs_torch:.3f} (medians of 11 paired rounds)"
    )
    print(f"RESULT gp_likelihood_tuned_compiler_options {options_vs_torch:.3f}")
    print(f"RESULT gp_likelihood {plain_vs_torch:.3f}")


if __name__ == "__main__":
    main()
