"""Covariance functions: scalar functions of two points, combined with `+` and `*`."""

from ._kernels import (
    RBF as RBF,
    AbstractKernel as AbstractKernel,
    AbstractLengthscaleKernel as AbstractLengthscaleKernel,
    AbstractMatern as AbstractMatern,
    AbstractStationaryKernel as AbstractStationaryKernel,
    AbstractVarianceKernel as AbstractVarianceKernel,
    ActiveDims as ActiveDims,
    Constant as Constant,
    Invariant as Invariant,
    Linear as Linear,
    Matern12 as Matern12,
    Matern32 as Matern32,
    Matern52 as Matern52,
    Periodic as Periodic,
    Polynomial as Polynomial,
    Product as Product,
    RationalQuadratic as RationalQuadratic,
    Sum as Sum,
    Warped as Warped,
    White as White,
)
