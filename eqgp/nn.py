"""Equinox layers built on eqgp's native operations (`SumCumProd`)."""

from ._nn import SumCumProd as SumCumProd
