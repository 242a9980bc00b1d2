from ._abstract import AbstractSolver as AbstractSolver
from ._cg import ConjugateGradient as ConjugateGradient
from ._cholesky import Cholesky as Cholesky
from ._structured import StructuredGradients as StructuredGradients
