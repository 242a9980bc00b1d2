"""Native operations (XLA FFI, C++ and CUDA) and their pure-JAX references."""

from ._ops import (
    NATIVE_PLATFORMS as NATIVE_PLATFORMS,
    linear_recurrence as linear_recurrence,
    linear_recurrence_p as linear_recurrence_p,
    linear_recurrence_reference as linear_recurrence_reference,
    sumcumprod as sumcumprod,
    sumcumprod_jvp_p as sumcumprod_jvp_p,
    sumcumprod_reference as sumcumprod_reference,
)
