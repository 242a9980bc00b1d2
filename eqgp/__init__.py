"""eqgp: gradient-enhanced Gaussian processes for JAX, in the Equinox style."""

from . import kernels as kernels, nn as nn, ops as ops

__version__ = "0.1.0"
