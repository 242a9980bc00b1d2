from ._abstract import (
    AbstractPullbackSolver as AbstractPullbackSolver,
    AbstractSolver as AbstractSolver,
    AbstractSolverState as AbstractSolverState,
)
from ._cg import ConjugateGradient as ConjugateGradient
from ._cholesky import Cholesky as Cholesky
from ._structured import StructuredGradients as StructuredGradients


def default_solver() -> AbstractSolver:
    """The solver a `GaussianProcess` uses when none is given: dense and exact."""
    return Cholesky()
