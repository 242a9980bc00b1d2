"""Equinox layers."""

from ._nn import SumCumProd as SumCumProd
