"""Regenerate `gpytorch_reference.npz` with GPyTorch (not run by the test suite).

    pip install torch gpytorch && python tests/data/make_gpytorch_reference.py

The inputs (points, lengthscales, training data, hyper-parameters, test points) are read
from the existing file, so a rerun recomputes GPyTorch's numbers for the same problem and
prints how far they moved; `--write` replaces the file. The file in the repository was made
with GPyTorch 1.15.2 and torch 2.13 (CPU, float64), as `../shared/reference/README.md`
records; this script prints the versions it ran with. Layout: GPyTorch's interleaved order,
per point `[f, df/dx_0, ..., df/dx_{d-1}]` (then `d2f/dx_i^2` for `RBFKernelGradGrad`).
"""

import argparse
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "gpytorch_reference.npz")


def main():
    import gpytorch
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help="overwrite gpytorch_reference.npz")
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    old = dict(np.load(PATH))
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    X1, X2, ls = t(old["X1"]), t(old["X2"]), t(old["lengthscale"])
    new = {k: old[k] for k in ("X1", "X2", "lengthscale", "nlml_X", "nlml_Y_interleaved", "nlml_hypers", "post_Xs")}

    def kernel(cls, **kw):
        k = cls(ard_num_dims=X1.shape[1], **kw)
        k.lengthscale = ls
        return k

    with torch.no_grad():
        new["rbf_grad_interleaved"] = kernel(gpytorch.kernels.RBFKernelGrad)(X1, X2).to_dense().numpy()
        new["matern52_grad_interleaved"] = kernel(gpytorch.kernels.Matern52KernelGrad)(X1, X2).to_dense().numpy()
        new["matern52_grad_self_interleaved"] = kernel(gpytorch.kernels.Matern52KernelGrad)(X1, X1).to_dense().numpy()
        new["rbf_gradgrad_self_interleaved"] = kernel(gpytorch.kernels.RBFKernelGradGrad)(X1, X1).to_dense().numpy()

    # The exact GP: constant mean on the value task only, scaled ARD RBF, one noise per task.
    X, Y, h = t(old["nlml_X"]), t(old["nlml_Y_interleaved"]), old["nlml_hypers"]
    D = X.shape[1]

    class Model(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(X, Y, likelihood)
            self.mean_module = gpytorch.means.ConstantMeanGrad()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad(ard_num_dims=D))

        def forward(self, x):
            return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))

    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(
        num_tasks=D + 1, has_global_noise=False, noise_constraint=gpytorch.constraints.GreaterThan(0.0)
    )
    model = Model(likelihood)
    model.mean_module.constant = torch.nn.Parameter(t(h[0]))
    model.covar_module.outputscale = t(h[1])
    model.covar_module.base_kernel.lengthscale = t(h[2 : 2 + D])
    likelihood.task_noises = t(h[2 + D :])
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with (
        torch.no_grad(),
        gpytorch.settings.max_cholesky_size(10**9),
        gpytorch.settings.fast_computations(False, False, False),
    ):
        model.train()
        # ExactMarginalLogLikelihood divides by the number of targets: undo it for the total.
        new["nlml_total"] = np.asarray(-(mll(model(X), Y) * Y.numel()).item())
        model.eval()
        post = model(t(old["post_Xs"]))
        new["post_mean_interleaved"] = post.mean.numpy()
        new["post_var_interleaved"] = post.variance.numpy()

    print(f"GPyTorch {gpytorch.__version__}, torch {torch.__version__}")
    for k in sorted(new):
        if k in old and old[k].shape == np.shape(new[k]):
            print(f"{k:34s} max |new - old| = {np.max(np.abs(np.asarray(new[k]) - old[k])):.2e}")
    if args.write:
        np.savez(PATH, **new)
        print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
