"""eqgp: gradient-enhanced Gaussian processes for JAX, in the Equinox style."""

from . import kernels as kernels, nn as nn, ops as ops
from ._gram import (
    gradient_gram as gradient_gram,
    gram as gram,
    operator_diag as operator_diag,
    operator_gram as operator_gram,
)
from ._operators import (
    AbstractOperator as AbstractOperator,
    Directional as Directional,
    Gradient as Gradient,
    Hessian as Hessian,
    Partial as Partial,
    Value as Value,
    ValueAndGradient as ValueAndGradient,
)

__version__ = "0.1.0"
from ._acquisition import (
    expected_improvement as expected_improvement,
    log_expected_improvement as log_expected_improvement,
    maximize_acquisition as maximize_acquisition,
    upper_confidence_bound as upper_confidence_bound,
)
from ._covariance import Covariance as Covariance
from ._fit import FitError as FitError, fit as fit
from ._gp import GaussianProcess as GaussianProcess, LeaveOneOut as LeaveOneOut, Posterior as Posterior
from ._hyperparameters import fit_hyperparameters as fit_hyperparameters, initialise as initialise
from ._jit import compiler_options as compiler_options
from ._likelihood import log_marginal_likelihood as log_marginal_likelihood
from ._minimize import FitReport as FitReport, minimize as minimize
from ._observations import ObservationGroup as ObservationGroup, Observations as Observations
from ._prior import ConstantMean as ConstantMean, ZeroMean as ZeroMean
from ._saving import load as load, save as save
from ._selection import Selection as Selection, select_lengthscales as select_lengthscales
from ._solvers import (
    AbstractPullbackSolver as AbstractPullbackSolver,
    AbstractSolver as AbstractSolver,
    AbstractSolverState as AbstractSolverState,
    Cholesky as Cholesky,
    ConjugateGradient as ConjugateGradient,
    StructuredGradients as StructuredGradients,
)
from ._symmetry import molecular_permutations as molecular_permutations, pair_orbits as pair_orbits
