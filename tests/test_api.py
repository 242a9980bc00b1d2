"""The public surface: exactly these names, each documented. An accidental export (or a
lost one) fails here; change the lists on purpose."""

import inspect

import pytest

import eqgp

PUBLIC = {
    "eqgp": [
        "AbstractOperator", "AbstractPullbackSolver", "AbstractSolver", "AbstractSolverState", "Cholesky",
        "ConjugateGradient", "ConstantMean", "Covariance",
        "Directional", "FitError", "FitReport", "GaussianProcess", "LeaveOneOut",
        "Gradient", "Hessian", "ObservationGroup", "Observations",
        "Partial", "Posterior", "StructuredGradients", "Value", "ValueAndGradient", "ZeroMean", "compiler_options",
        "expected_improvement", "fit", "fit_hyperparameters", "gradient_gram", "initialise", "minimize",
        "gram", "kernels", "log_expected_improvement",
        "load", "log_marginal_likelihood", "maximize_acquisition", "nn", "operator_diag", "operator_gram", "ops",
        "molecular_permutations", "pair_orbits", "save", "Selection", "select_lengthscales",
        "upper_confidence_bound",
    ],
    "eqgp.kernels": [
        "AbstractKernel", "AbstractLengthscaleKernel", "ActiveDims", "AbstractMatern", "AbstractStationaryKernel",
        "AbstractVarianceKernel", "Constant", "Invariant", "Linear", "Matern12", "Matern32", "Matern52", "Periodic",
        "Polynomial", "Product", "RBF", "RationalQuadratic", "Sum", "Warped", "White",
    ],
    "eqgp.ops": ["linear_recurrence", "linear_recurrence_reference", "native_platforms", "sumcumprod",
                 "sumcumprod_reference"],
    "eqgp.nn": ["SumCumProd"],
}  # fmt: skip
MODULES = {"eqgp": eqgp, "eqgp.kernels": eqgp.kernels, "eqgp.ops": eqgp.ops, "eqgp.nn": eqgp.nn}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_names_are_exactly_these(name):
    module = MODULES[name]
    # (`jaxtyping` is the name the suite's --jaxtyping-packages import hook adds.)
    got = sorted(n for n in dir(module) if not n.startswith("_") and n != "jaxtyping")
    assert got == sorted(PUBLIC[name])


@pytest.mark.parametrize("qualname", [f"{m}.{n}" for m, names in PUBLIC.items() for n in names])
def test_every_public_name_is_documented(qualname):
    module, _, name = qualname.rpartition(".")
    obj = getattr(MODULES[module], name)
    doc = inspect.getdoc(obj)
    assert doc and len(doc) > 20, f"{qualname} has no docstring"


def test_only_the_solvers_package_knows_concrete_solvers():
    # The model, the posterior and the likelihood ask the solver; they never name a concrete
    # one or import from a solver's module (the seam of issue 27).
    import ast
    import pathlib

    root = pathlib.Path(eqgp.__file__).parent
    concrete = {"Cholesky", "ConjugateGradient", "StructuredGradients"}
    offenders = []
    for path in root.glob("*.py"):
        if path.name == "__init__.py":  # the re-exports
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "_solvers." in node.module:
                offenders.append(f"{path.name}: from {node.module}")
            if isinstance(node, ast.Name) and node.id in concrete:
                offenders.append(f"{path.name}:{node.lineno}: {node.id}")
            if isinstance(node, ast.alias) and node.name in concrete:
                offenders.append(f"{path.name}: imports {node.name}")
    assert not offenders, offenders
